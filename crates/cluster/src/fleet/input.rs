//! The `gpupart plan` input file (docs/plan.md): node groups and the inference demand, parsed
//! and checked against the catalog. Errors name the entry and the key.

use crate::mig::catalog::{self, Model};
use crate::mig::ProfileName;
use serde_json::{Map, Value};

/// A node of the fleet.
#[derive(Debug, Clone)]
pub struct Node {
    /// Node name (`<group>-<i>` or as listed).
    pub name: String,
    /// Index of its group in the input.
    pub group: usize,
    /// GPU model of every GPU on the node.
    pub model: &'static Model,
    /// GPUs on the node.
    pub gpus: u32,
    /// False for a name made from the group's `count:` (`<group>-<i>`), a placeholder.
    pub named: bool,
}

/// How a model asked to share a GPU (`sharing:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// MIG instances.
    Mig,
    /// MPS client slots on a GPU without MIG.
    Mps,
    /// A whole GPU per replica.
    Whole,
}

/// One model of the demand.
#[derive(Debug, Clone)]
pub struct Demand {
    /// Model name (unique in the file).
    pub name: String,
    /// Replicas wanted.
    pub replicas: u32,
    /// GPUs per replica (tensor-parallel degree); 0 when not given.
    pub gpus: u32,
    /// Memory per replica in MiB, when given.
    pub memory_mib: Option<u64>,
    /// An explicit MIG profile, when given.
    pub profile: Option<ProfileName>,
    /// Requested sharing, when given.
    pub sharing: Option<Sharing>,
}

/// The parsed input.
#[derive(Debug, Clone)]
pub struct Input {
    /// Every node, group by group.
    pub nodes: Vec<Node>,
    /// Group names, in input order.
    pub groups: Vec<String>,
    /// The demand, in input order.
    pub demand: Vec<Demand>,
}

/// An input error, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {message}")]
pub struct InputError {
    /// `fleet[0] 'a100', key 'gpu'` and the like.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

fn err(at: impl Into<String>, message: impl Into<String>) -> InputError {
    InputError { at: at.into(), message: message.into() }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{s}'"),
        other => other.to_string(),
    }
}

/// Parses `1Gi`, `500Mi`, `30G` (10^9), `512M`, `1Ti` or a plain number of bytes into MiB
/// (rounded up).
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok().filter(|n: &f64| n.is_finite() && *n > 0.0)?;
    let bytes_per: f64 = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let mib = (n * bytes_per / (1024.0 * 1024.0)).ceil();
    (1.0..1e12).contains(&mib).then_some(mib as u64)
}

fn count(at: &str, key: &str, v: Option<&Value>, min: u64, max: u64) -> Result<Option<u32>, InputError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64().filter(|n| (min..=max).contains(n)) {
            Some(n) => Ok(Some(n as u32)),
            None => Err(err(format!("{at}, key '{key}'"), format!("{n} is not a whole number in {min}..{max}"))),
        },
        Some(other) => Err(err(format!("{at}, key '{key}'"), format!("expected a number, found {}", show(other)))),
    }
}

fn text<'a>(at: &str, key: &str, v: Option<&'a Value>) -> Result<Option<&'a str>, InputError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(err(format!("{at}, key '{key}'"), format!("expected a string, found {}", show(other)))),
    }
}

fn only_keys(at: &str, m: &Map<String, Value>, allowed: &[&str]) -> Result<(), InputError> {
    match m.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(err(format!("{at}, key '{k}'"), format!("unknown key; expected one of {}", allowed.join(", ")))),
        None => Ok(()),
    }
}

fn entries<'a>(top: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>, InputError> {
    match top.get(key) {
        Some(Value::Array(a)) if !a.is_empty() => Ok(a),
        Some(Value::Array(_)) => Err(err(format!("key '{key}'"), "is empty")),
        Some(other) => Err(err(format!("key '{key}'"), format!("expected a list, found {}", show(other)))),
        None => Err(err(format!("key '{key}'"), "is missing")),
    }
}

fn entry<'a>(list: &str, i: usize, v: &'a Value) -> Result<(&'a Map<String, Value>, String, String), InputError> {
    let Value::Object(m) = v else {
        return Err(err(format!("{list}[{i}]"), format!("expected a mapping, found {}", show(v))));
    };
    let name = text(&format!("{list}[{i}]"), "name", m.get("name"))?
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| err(format!("{list}[{i}], key 'name'"), "is missing"))?
        .to_string();
    let at = format!("{list}[{i}] '{name}'");
    Ok((m, name, at))
}

fn parse_group(
    i: usize,
    v: &Value,
    groups: &mut Vec<String>,
    nodes: &mut Vec<Node>,
    seen: &mut std::collections::HashSet<String>,
) -> Result<(), InputError> {
    let (m, name, at) = entry("fleet", i, v)?;
    only_keys(&at, m, &["name", "count", "nodes", "gpu", "gpus"])?;
    if groups.contains(&name) {
        return Err(err(format!("{at}, key 'name'"), "repeats an earlier group's name"));
    }
    let gpu = text(&at, "gpu", m.get("gpu"))?.ok_or_else(|| err(format!("{at}, key 'gpu'"), "is missing"))?;
    let model = catalog::lookup(gpu).ok_or_else(|| {
        err(format!("{at}, key 'gpu'"), format!("unknown GPU model '{gpu}'; known: {}", catalog::model_ids()))
    })?;
    let gpus =
        count(&at, "gpus", m.get("gpus"), 1, 64)?.ok_or_else(|| err(format!("{at}, key 'gpus'"), "is missing"))?;
    let named = m.get("nodes").is_some();
    let names: Vec<String> = match (count(&at, "count", m.get("count"), 1, 100_000)?, m.get("nodes")) {
        (Some(_), Some(_)) => {
            return Err(err(format!("{at}, key 'nodes'"), "give either 'count' or 'nodes', not both"))
        }
        (Some(n), None) => (0..n).map(|k| format!("{name}-{k}")).collect(),
        (None, Some(Value::Array(list))) if !list.is_empty() => list
            .iter()
            .map(|n| match n {
                Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                other => Err(err(format!("{at}, key 'nodes'"), format!("expected node names, found {}", show(other)))),
            })
            .collect::<Result<_, _>>()?,
        (None, Some(other)) => {
            return Err(err(format!("{at}, key 'nodes'"), format!("expected a non-empty list, found {}", show(other))))
        }
        (None, None) => return Err(err(format!("{at}, key 'count'"), "give 'count' or 'nodes'")),
    };
    for n in names {
        if !seen.insert(n.clone()) {
            return Err(err(format!("{at}, key 'nodes'"), format!("node '{n}' is already in the fleet")));
        }
        nodes.push(Node { name: n, group: groups.len(), model, gpus, named });
    }
    groups.push(name);
    Ok(())
}

fn parse_demand(i: usize, v: &Value, seen: &[Demand]) -> Result<Demand, InputError> {
    let (m, name, at) = entry("demand", i, v)?;
    only_keys(&at, m, &["name", "gpus", "replicas", "memory", "profile", "sharing"])?;
    if seen.iter().any(|d| d.name == name) {
        return Err(err(format!("{at}, key 'name'"), "repeats an earlier model's name"));
    }
    let replicas = count(&at, "replicas", m.get("replicas"), 0, 1_000_000)?.unwrap_or(1);
    let gpus = count(&at, "gpus", m.get("gpus"), 1, 64)?.unwrap_or(0);
    let memory_mib = match m.get("memory") {
        Some(Value::Number(n)) => Some(n.as_u64().filter(|b| *b > 0).map(|b| b.div_ceil(1024 * 1024))),
        other => text(&at, "memory", other)?.map(parse_memory),
    };
    let memory_mib = match memory_mib {
        Some(None) => {
            return Err(err(format!("{at}, key 'memory'"), "expected a quantity such as 30Gi, 6Gi or 500Mi"));
        }
        Some(Some(m)) => Some(m),
        None => None,
    };
    let profile = match text(&at, "profile", m.get("profile"))? {
        Some(p) => {
            let name: ProfileName = p
                .parse()
                .map_err(|e: crate::mig::name::NameError| err(format!("{at}, key 'profile'"), e.to_string()))?;
            if name.ci_slices.is_some() {
                return Err(err(
                    format!("{at}, key 'profile'"),
                    format!("'{p}' names a compute instance; give a GPU-instance profile such as {}", name.gi_name()),
                ));
            }
            Some(name)
        }
        None => None,
    };
    let sharing = match text(&at, "sharing", m.get("sharing"))? {
        None => None,
        Some("mig") => Some(Sharing::Mig),
        Some("mps") => Some(Sharing::Mps),
        Some("whole") => Some(Sharing::Whole),
        Some(other) => {
            return Err(err(
                format!("{at}, key 'sharing'"),
                format!("unknown sharing '{other}'; expected mig, mps or whole"),
            ))
        }
    };
    let d = Demand { name, replicas, gpus, memory_mib, profile, sharing };
    check_demand(&at, &d)?;
    Ok(d)
}

/// Combinations of keys that contradict each other.
fn check_demand(at: &str, d: &Demand) -> Result<(), InputError> {
    if d.gpus > 1 && (d.profile.is_some() || matches!(d.sharing, Some(Sharing::Mig | Sharing::Mps))) {
        return Err(err(
            format!("{at}, key 'gpus'"),
            "a model on several GPUs gets whole GPUs; drop 'profile' and 'sharing'",
        ));
    }
    if d.profile.is_some() && matches!(d.sharing, Some(Sharing::Mps | Sharing::Whole)) {
        return Err(err(format!("{at}, key 'sharing'"), "'profile' is a MIG profile; it needs sharing mig (or none)"));
    }
    if d.sharing == Some(Sharing::Mps) && d.memory_mib.is_none() {
        return Err(err(
            format!("{at}, key 'memory'"),
            "sharing mps needs the memory of one replica (the slot's limit)",
        ));
    }
    if d.gpus == 0 && d.memory_mib.is_none() && d.profile.is_none() && d.sharing != Some(Sharing::Whole) {
        return Err(err(at.to_string(), "give 'memory', 'profile' or 'gpus'"));
    }
    Ok(())
}

/// Parses the input YAML (or JSON).
pub fn parse(text: &str) -> Result<Input, InputError> {
    let root: Value = crate::config::yaml::from_str(text).map_err(|e| err("input", format!("invalid YAML: {e}")))?;
    let Value::Object(top) = root else {
        return Err(err("input", format!("expected a mapping with 'fleet' and 'demand', found {}", show(&root))));
    };
    only_keys("input", &top, &["fleet", "demand"])?;
    let (mut groups, mut nodes, mut seen) = (Vec::new(), Vec::new(), std::collections::HashSet::new());
    for (i, v) in entries(&top, "fleet")?.iter().enumerate() {
        parse_group(i, v, &mut groups, &mut nodes, &mut seen)?;
    }
    let mut demand = Vec::new();
    for (i, v) in entries(&top, "demand")?.iter().enumerate() {
        let d = parse_demand(i, v, &demand)?;
        demand.push(d);
    }
    Ok(Input { nodes, groups, demand })
}
