//! Room reserved for a waiting claim while the pods that held it move (pure). The controller
//! writes the reservation on the node (annotation [`ANNOTATION`], JSON) before it evicts
//! anything; until the reservation expires, the agent taints `NoSchedule` every device of the
//! reserved GPUs that the waiting claim cannot use, in place (the devices stay listed), so a
//! moved pod's replacement cannot take the room made for someone else. The devices the waiting
//! claim can use stay allocatable: a MIG device of its profile, or the whole GPU.

use super::devices::{every_device, DeviceKind, DeviceRef};
use crate::mig::ProfileTable;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The node annotation holding the reservation.
pub const ANNOTATION: &str = "gpupart.io/defrag-reservation";

/// Why a reserved device is unavailable (the taint's value).
pub const RESERVED: &str = "reserved-for-a-waiting-claim";

/// What the waiting claim asks of the reserved GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Wants {
    /// One MIG device of this profile (`7g.80gb`).
    Mig(String),
    /// Whole GPUs.
    Whole(u32),
}

/// A reservation as the controller writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The waiting pod (`namespace/name`), for people reading the node.
    pub pod: String,
    /// The GPUs (NVML indices) reserved.
    pub gpus: Vec<u32>,
    /// What the waiting claim asks.
    pub wants: Wants,
    /// When it expires (seconds since the epoch).
    pub until: i64,
}

/// Why a reservation annotation cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    /// Not the JSON a reservation is.
    #[error("annotation {ANNOTATION} is not a reservation: {0}")]
    Malformed(String),
    /// It names a GPU the node does not have.
    #[error("annotation {ANNOTATION} reserves GPU {0}, which this node does not have")]
    NoSuchGpu(u32),
    /// It names a profile a reserved GPU does not have.
    #[error("annotation {ANNOTATION} asks for MIG profile {0}, which GPU {1} does not have")]
    NoSuchProfile(String, u32),
}

impl Reservation {
    /// Reads the annotation's value, checking it against the node's GPUs (`table_of` a GPU's
    /// profiles; `None` for a GPU the node does not have).
    pub fn read<'a>(text: &str, table_of: impl Fn(u32) -> Option<&'a ProfileTable>) -> Result<Self, ReservationError> {
        let r: Reservation = serde_json::from_str(text).map_err(|e| ReservationError::Malformed(e.to_string()))?;
        for &g in &r.gpus {
            let table = table_of(g).ok_or(ReservationError::NoSuchGpu(g))?;
            if let Wants::Mig(p) = &r.wants {
                if !table.profiles.iter().any(|x| x.name.to_string() == *p) {
                    return Err(ReservationError::NoSuchProfile(p.clone(), g));
                }
            }
        }
        Ok(r)
    }

    /// The devices it makes unavailable at `now` (seconds), with why: every device of the
    /// reserved GPUs that the waiting claim cannot use; nothing once it expired.
    pub fn unavailable<'a>(
        &self,
        now: i64,
        table_of: impl Fn(u32) -> Option<&'a ProfileTable>,
    ) -> BTreeMap<DeviceRef, String> {
        let mut out = BTreeMap::new();
        if now >= self.until {
            return out;
        }
        for &g in &self.gpus {
            let Some(table) = table_of(g) else { continue };
            for d in every_device(g, table) {
                let usable = match (&self.wants, d.kind) {
                    (Wants::Whole(_), DeviceKind::Gpu) => true,
                    (Wants::Mig(p), DeviceKind::Mig { profile_id, .. }) => {
                        table.by_id(profile_id).is_some_and(|x| x.name.to_string() == *p)
                    }
                    _ => false,
                };
                if !usable {
                    out.insert(d, RESERVED.to_string());
                }
            }
        }
        out
    }
}

/// The devices the node's reservation (in its `annotations`) makes unavailable at `now`, and why
/// the annotation could not be used, if it could not.
pub fn reserved<'a>(
    annotations: &BTreeMap<String, String>,
    now: i64,
    table_of: impl Fn(u32) -> Option<&'a ProfileTable> + Copy,
) -> (BTreeMap<DeviceRef, String>, Option<ReservationError>) {
    match annotations.get(ANNOTATION).map(|text| Reservation::read(text, table_of)) {
        None => (BTreeMap::new(), None),
        Some(Ok(r)) => (r.unavailable(now, table_of), None),
        Some(Err(e)) => (BTreeMap::new(), Some(e)),
    }
}

/// Seconds until the node's reservation expires, while it is in force.
pub fn expires_in(annotations: &BTreeMap<String, String>, now: i64) -> Option<i64> {
    let text = annotations.get(ANNOTATION)?;
    let r: Reservation = serde_json::from_str(text).ok()?;
    Some(r.until - now).filter(|left| *left >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog;

    #[test]
    fn a_reserved_gpu_offers_only_what_the_waiting_claim_uses_until_it_expires() {
        let t = catalog::lookup("A100-SXM4-80GB").expect("A100").profile_table();
        let tables = |g: u32| (g < 2).then_some(&t);
        let text = r#"{"pod": "ml/llm-0", "gpus": [1], "wants": {"mig": "7g.80gb"}, "until": 1000}"#;
        let r = Reservation::read(text, tables).expect("a reservation");
        let u = r.unavailable(999, tables);
        let every = every_device(1, &t);
        let seven = t.profiles.iter().find(|p| p.name.to_string() == "7g.80gb").expect("7g").id;
        assert_eq!(u.len(), every.len() - 1, "all but the one 7g placement");
        assert!(u.keys().all(|d| d.gpu == 1));
        assert!(!u.keys().any(|d| matches!(d.kind, DeviceKind::Mig { profile_id, .. } if profile_id == seven)));
        assert!(u.contains_key(&DeviceRef { gpu: 1, kind: DeviceKind::Gpu }));
        assert!(r.unavailable(1000, tables).is_empty(), "expired");
        let whole = r#"{"pod": "ml/tp", "gpus": [0, 1], "wants": {"whole": 2}, "until": 1000}"#;
        let u = Reservation::read(whole, tables).expect("a reservation").unavailable(0, tables);
        assert_eq!(u.len(), 2 * (every.len() - 1), "every MIG device of both GPUs");
        assert!(u.keys().all(|d| d.kind != DeviceKind::Gpu));
        assert_eq!(Reservation::read(&whole.replace("[0, 1]", "[5]"), tables), Err(ReservationError::NoSuchGpu(5)));
        let bad = text.replace("7g.80gb", "9g.90gb");
        assert_eq!(Reservation::read(&bad, tables), Err(ReservationError::NoSuchProfile("9g.90gb".into(), 1)));
        let e = Reservation::read("{", tables).expect_err("not JSON");
        assert!(e.to_string().contains(ANNOTATION), "{e}");
        let on_node = BTreeMap::from([(ANNOTATION.to_string(), text.to_string())]);
        assert_eq!(reserved(&on_node, 999, tables).0.len(), every.len() - 1);
        assert_eq!((expires_in(&on_node, 990), expires_in(&on_node, 1001)), (Some(10), None));
        let bad = BTreeMap::from([(ANNOTATION.to_string(), "{".to_string())]);
        assert!(matches!(reserved(&bad, 0, tables), (m, Some(ReservationError::Malformed(_))) if m.is_empty()));
        assert_eq!(reserved(&BTreeMap::new(), 0, tables), (BTreeMap::new(), None));
    }
}
