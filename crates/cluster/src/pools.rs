//! How the pools are written on nodes (pure): the pool label and its values for the shared and
//! the dedicated pool, and the dedicated pool's taint. `gpupart plan` labels and taints nodes
//! with the defaults; the controller takes them as flags (`--pool-label`, `--shared-pool`,
//! `--dedicated-pool`, `--dedicated-taint`) with the same defaults, and judges a node it may
//! dedicate or return as it will be once changed.

use k8s_openapi::api::core::v1::{Taint, Toleration};
use std::collections::BTreeMap;

/// The default pool label.
pub const DEFAULT_POOL_LABEL: &str = "gpu-pool";
/// The default value of the pool label on shared nodes.
pub const DEFAULT_SHARED_POOL: &str = "shared";
/// The default value of the pool label on dedicated nodes.
pub const DEFAULT_DEDICATED_POOL: &str = "dedicated";
/// The default taint of dedicated nodes.
pub const DEFAULT_DEDICATED_TAINT: &str = "gpu-dedicated=true:NoSchedule";

/// A taint as `kubectl taint` writes it: `key=value:Effect` (or `key:Effect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTaint {
    /// The key.
    pub key: String,
    /// The value (may be empty).
    pub value: String,
    /// `NoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Why a pool flag was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// A taint not of the form `key=value:Effect`.
    #[error("taint '{0}': {1}")]
    Taint(String, String),
    /// A label key or value Kubernetes refuses.
    #[error("{what} '{value}': {why}")]
    Label {
        /// Which flag.
        what: &'static str,
        /// What was given.
        value: String,
        /// Why it is refused.
        why: String,
    },
}

/// Whether `s` is a Kubernetes name segment: at most 63 characters, alphanumerics with `-`, `_`
/// and `.` inside (a label value may also be empty).
fn name_segment(s: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if s.len() > 63 {
        return Err("longer than 63 characters".into());
    }
    if !s.chars().all(ok_char) {
        return Err("only letters, digits, '-', '_' and '.' are allowed".into());
    }
    if s.starts_with(|c: char| !c.is_ascii_alphanumeric()) || s.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        return Err("must start and end with a letter or digit".into());
    }
    Ok(())
}

/// Checks a label key (`[prefix/]name`) as the API server does.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err("the name part is empty".into());
    }
    name_segment(name)?;
    if let Some(p) = prefix {
        let dns = p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !dns {
            return Err(format!("prefix '{p}' is not a DNS subdomain"));
        }
    }
    Ok(())
}

impl std::str::FromStr for PoolTaint {
    type Err = PoolError;

    fn from_str(s: &str) -> Result<Self, PoolError> {
        let bad = |why: &str| PoolError::Taint(s.to_string(), why.to_string());
        let (kv, effect) = s.rsplit_once(':').ok_or_else(|| bad("expected key=value:Effect"))?;
        if !matches!(effect, "NoSchedule" | "NoExecute") {
            return Err(bad("the effect must be NoSchedule or NoExecute"));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        check_label_key(key).map_err(|e| bad(&format!("key: {e}")))?;
        if !value.is_empty() {
            name_segment(value).map_err(|e| bad(&format!("value: {e}")))?;
        }
        Ok(PoolTaint { key: key.into(), value: value.into(), effect: effect.into() })
    }
}

impl std::fmt::Display for PoolTaint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect)
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect)
        }
    }
}

impl PoolTaint {
    /// As a Node's taint.
    pub fn to_taint(&self) -> Taint {
        Taint {
            key: self.key.clone(),
            value: (!self.value.is_empty()).then(|| self.value.clone()),
            effect: self.effect.clone(),
            time_added: None,
        }
    }

    /// Whether a node's taint is this one (same key and effect).
    pub fn is(&self, t: &Taint) -> bool {
        t.key == self.key && t.effect == self.effect
    }

    /// Whether these tolerations tolerate it, as the scheduler matches them.
    pub fn tolerated_by(&self, tolerations: &[Toleration]) -> bool {
        let taint = self.to_taint();
        tolerations.iter().any(|t| tolerates(t, &taint))
    }
}

/// Whether a toleration tolerates a taint, as the scheduler matches them: the same key (or no
/// key with `Exists`), the same effect (or none), the same value (or `Exists`).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let exists = t.operator.as_deref() == Some("Exists");
    let key_ok = t.key.as_deref() == Some(taint.key.as_str()) || (t.key.as_deref().unwrap_or("").is_empty() && exists);
    let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let value_ok = exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
    key_ok && effect_ok && value_ok
}

/// The pools as they are written on nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pools {
    /// The pool label's key.
    pub label: String,
    /// Its value on shared nodes.
    pub shared: String,
    /// Its value on dedicated nodes.
    pub dedicated: String,
    /// The dedicated pool's taint.
    pub taint: PoolTaint,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            label: DEFAULT_POOL_LABEL.into(),
            shared: DEFAULT_SHARED_POOL.into(),
            dedicated: DEFAULT_DEDICATED_POOL.into(),
            taint: DEFAULT_DEDICATED_TAINT.parse().unwrap_or_else(|_| PoolTaint {
                key: "gpu-dedicated".into(),
                value: "true".into(),
                effect: "NoSchedule".into(),
            }),
        }
    }
}

impl Pools {
    /// Pools from the flags' values; each refusal names the flag and the value.
    pub fn new(label: &str, shared: &str, dedicated: &str, taint: &str) -> Result<Pools, PoolError> {
        check_label_key(label).map_err(|why| PoolError::Label { what: "--pool-label", value: label.into(), why })?;
        for (what, v) in [("--shared-pool", shared), ("--dedicated-pool", dedicated)] {
            if v.is_empty() {
                return Err(PoolError::Label { what, value: v.into(), why: "must not be empty".into() });
            }
            name_segment(v).map_err(|why| PoolError::Label { what, value: v.into(), why })?;
        }
        if shared == dedicated {
            return Err(PoolError::Label {
                what: "--dedicated-pool",
                value: dedicated.into(),
                why: "must differ from --shared-pool".into(),
            });
        }
        Ok(Pools { label: label.into(), shared: shared.into(), dedicated: dedicated.into(), taint: taint.parse()? })
    }

    /// Whether a node with these labels and taints is in the dedicated pool.
    pub fn is_dedicated(&self, labels: &BTreeMap<String, String>, taints: &[Taint]) -> bool {
        taints.iter().any(|t| self.taint.is(t)) || labels.get(&self.label) == Some(&self.dedicated)
    }

    /// The labels and taints of a node once the controller dedicates it.
    pub fn once_dedicated(
        &self,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
    ) -> (BTreeMap<String, String>, Vec<Taint>) {
        let mut l = labels.clone();
        l.insert(self.label.clone(), self.dedicated.clone());
        let mut t: Vec<Taint> = taints.iter().filter(|t| !self.taint.is(t)).cloned().collect();
        t.push(self.taint.to_taint());
        (l, t)
    }
}

impl Pools {
    /// The labels and taints of a node once the controller returns it: the labels it recorded
    /// when it dedicated the node put back (`recorded`: key → earlier value, `None` for absent;
    /// nothing recorded: the shared pool's value), the dedicated taint gone.
    pub fn once_returned(
        &self,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
        recorded: Option<&BTreeMap<String, Option<String>>>,
    ) -> (BTreeMap<String, String>, Vec<Taint>) {
        let mut l = labels.clone();
        let fallback = BTreeMap::from([(self.label.clone(), Some(self.shared.clone()))]);
        for (k, v) in recorded.unwrap_or(&fallback) {
            match v {
                Some(v) => l.insert(k.clone(), v.clone()),
                None => l.remove(k),
            };
        }
        (l, taints.iter().filter(|t| !self.taint.is(t)).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked_and_name_what_is_wrong() {
        let d = Pools::default();
        assert_eq!((d.label.as_str(), d.shared.as_str(), d.dedicated.as_str()), ("gpu-pool", "shared", "dedicated"));
        assert_eq!(d.taint.to_string(), "gpu-dedicated=true:NoSchedule");
        assert_eq!(Pools::new("gpu-pool", "shared", "dedicated", DEFAULT_DEDICATED_TAINT), Ok(d));
        let p = Pools::new("example.com/pool", "small", "large", "example.com/tp:NoExecute").unwrap();
        assert_eq!(
            p.taint,
            PoolTaint { key: "example.com/tp".into(), value: String::new(), effect: "NoExecute".into() }
        );
        for (args, says) in [
            (("gpu pool", "shared", "dedicated", DEFAULT_DEDICATED_TAINT), "--pool-label 'gpu pool'"),
            (("Example.com/x", "shared", "dedicated", DEFAULT_DEDICATED_TAINT), "not a DNS subdomain"),
            (("gpu-pool", "", "dedicated", DEFAULT_DEDICATED_TAINT), "--shared-pool ''"),
            (("gpu-pool", "shared", "shared", DEFAULT_DEDICATED_TAINT), "must differ"),
            (("gpu-pool", "shared", "dedicated", "gpu-dedicated=true"), "taint 'gpu-dedicated=true'"),
            (("gpu-pool", "shared", "dedicated", "gpu-dedicated=true:Never"), "NoSchedule or NoExecute"),
            (("gpu-pool", "shared", "dedicated", "gpu-dedicated=a b:NoSchedule"), "value"),
        ] {
            let e = Pools::new(args.0, args.1, args.2, args.3).unwrap_err().to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_node_once_dedicated_carries_the_pool_label_and_the_taint() {
        let p = Pools::default();
        let labels = BTreeMap::from([("gpu-pool".to_string(), "shared".to_string())]);
        let other = Taint { key: "team".into(), value: None, effect: "NoSchedule".into(), time_added: None };
        assert!(!p.is_dedicated(&labels, std::slice::from_ref(&other)));
        let (l, t) = p.once_dedicated(&labels, std::slice::from_ref(&other));
        assert_eq!(l["gpu-pool"], "dedicated");
        assert_eq!(t.len(), 2);
        assert!(p.is_dedicated(&l, &t));
        let tol: Toleration = serde_json::from_value(
            serde_json::json!({"key": "gpu-dedicated", "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
        )
        .unwrap();
        assert!(p.taint.tolerated_by(std::slice::from_ref(&tol)));
        let wrong = Toleration { value: Some("false".into()), ..tol };
        assert!(!p.taint.tolerated_by(&[wrong]));
        let any: Toleration = serde_json::from_value(serde_json::json!({"operator": "Exists"})).unwrap();
        assert!(p.taint.tolerated_by(&[any]));
        // Returned: as recorded, or to the shared pool when nothing was recorded.
        let recorded = BTreeMap::from([("gpu-pool".to_string(), None)]);
        let (back, bt) = p.once_returned(&l, &t, Some(&recorded));
        assert!(!back.contains_key("gpu-pool") && bt == vec![other.clone()]);
        assert_eq!(p.once_returned(&l, &t, None).0["gpu-pool"], "shared");
    }
}
