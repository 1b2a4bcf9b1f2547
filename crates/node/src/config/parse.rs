//! YAML/JSON text → [`ConfigFile`], with mig-parted's validation rules.

use super::{ConfigError, ConfigFile, DeviceFilter, DeviceSpec, Devices, MigConfig, MpsSpec};
use serde_json::{Map, Value};

/// Where in the file a value sits, for error messages.
#[derive(Clone, Copy)]
struct At<'a> {
    config: &'a str,
    entry: usize,
}

impl At<'_> {
    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            config: Some(self.config.to_string()),
            entry: Some(self.entry),
            key: Some(key.to_string()),
            message: message.into(),
        }
    }
}

/// Short rendering of a value for error messages.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{s}'"),
        other => other.to_string(),
    }
}

/// Parses and validates a mig-parted v1 config (YAML, or JSON as a subset of YAML); the first
/// problem is the error.
pub fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
    let (file, mut errors) = parse_all(text)?;
    if errors.is_empty() {
        Ok(file)
    } else {
        Err(errors.remove(0))
    }
}

/// Parses every config of the file on its own: the configs that parsed, and the error of each
/// one that did not. A problem outside the configs (YAML, version, the extension) is the error.
pub fn parse_all(text: &str) -> Result<(ConfigFile, Vec<ConfigError>), ConfigError> {
    let root: Value = super::yaml::from_str(text).map_err(|e| ConfigError::top(format!("invalid YAML: {e}")))?;
    let Value::Object(top) = root else {
        return Err(ConfigError::top(format!(
            "expected a mapping with 'version' and 'mig-configs', found {}",
            show(&root)
        )));
    };
    for key in top.keys() {
        if key != "version" && key != "mig-configs" && key != "gpupart" {
            return Err(ConfigError::top(format!("unexpected field: {key}")));
        }
    }
    let workload = parse_extension(top.get("gpupart"))?;
    match top.get("version") {
        Some(Value::String(v)) if v == "v1" => {}
        Some(v) => return Err(ConfigError::top(format!("unknown version: {}", show(v)))),
        None => return Err(ConfigError::top("missing required field 'version'")),
    }
    let configs = match top.get("mig-configs") {
        Some(Value::Object(m)) if !m.is_empty() => m,
        Some(Value::Object(_)) => return Err(ConfigError::top("'mig-configs' has no configs")),
        Some(v) => {
            return Err(ConfigError::top(format!("'mig-configs' must be a mapping of config names, found {}", show(v))))
        }
        None => return Err(ConfigError::top("missing required field 'mig-configs'")),
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (name, specs) in configs {
        match parse_config(name, specs) {
            Ok(mut config) => {
                config.workload = workload.clone();
                out.push(config);
            }
            Err(e) => errors.push(e),
        }
    }
    Ok((ConfigFile { configs: out, workload }, errors))
}

/// The `gpupart:` extension block: `workload: {PROFILE: WEIGHT, …}`.
fn parse_extension(block: Option<&Value>) -> Result<Vec<(gpupart_mig::ProfileName, f64)>, ConfigError> {
    let err = |key: &str, message: String| ConfigError {
        config: None,
        entry: None,
        key: Some(format!("gpupart.{key}")),
        message,
    };
    let Some(block) = block else { return Ok(Vec::new()) };
    let Value::Object(m) = block else {
        return Err(err("", format!("expected a mapping, found {}", show(block))));
    };
    for key in m.keys() {
        if key != "workload" {
            return Err(err(key, format!("unexpected field: {key}")));
        }
    }
    let Some(w) = m.get("workload") else { return Ok(Vec::new()) };
    let Value::Object(w) = w else {
        return Err(err("workload", format!("expected a mapping of profile names to weights, found {}", show(w))));
    };
    let mut out = Vec::new();
    for (name, weight) in w {
        let p: gpupart_mig::ProfileName =
            name.parse().map_err(|e: gpupart_mig::name::NameError| err("workload", e.to_string()))?;
        let x = weight.as_f64().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| {
            err("workload", format!("invalid weight {} for '{name}': expected a number >= 0", show(weight)))
        })?;
        out.push((p, x));
    }
    Ok(out)
}

fn parse_config(name: &str, specs: &Value) -> Result<MigConfig, ConfigError> {
    let here = |message: String| ConfigError { config: Some(name.to_string()), entry: None, key: None, message };
    let list = match specs {
        Value::Array(l) if !l.is_empty() => l,
        Value::Array(_) => return Err(here("the config has no entries".into())),
        other => return Err(here(format!("expected a list of entries, found {}", show(other)))),
    };
    let specs = list
        .iter()
        .enumerate()
        .map(|(entry, v)| parse_spec(At { config: name, entry }, v))
        .collect::<Result<_, _>>()?;
    Ok(MigConfig { name: name.to_string(), specs, workload: Vec::new() })
}

fn parse_spec(at: At<'_>, v: &Value) -> Result<DeviceSpec, ConfigError> {
    let Value::Object(m) = v else {
        return Err(ConfigError {
            config: Some(at.config.to_string()),
            entry: Some(at.entry),
            key: None,
            message: format!("expected a mapping, found {}", show(v)),
        });
    };
    for key in m.keys() {
        if !matches!(key.as_str(), "device-filter" | "devices" | "mig-enabled" | "mig-devices" | "mps") {
            return Err(at.err(key, format!("unexpected field: {key}")));
        }
    }
    let filter = match m.get("device-filter") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![parse_filter(at, s)?],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => parse_filter(at, s),
                other => Err(at.err("device-filter", format!("expected a string, found {}", show(other)))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(
                at.err("device-filter", format!("expected a string or a list of strings, found {}", show(other)))
            )
        }
    };
    let devices = parse_devices(at, m)?;
    let mig_enabled = match m.get("mig-enabled") {
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(at.err("mig-enabled", format!("expected true or false, found {}", show(other)))),
        None => return Err(at.err("mig-enabled", "missing required field 'mig-enabled'")),
    };
    let mig_devices = parse_mig_devices(at, m, mig_enabled)?;
    let mps = match m.get("mps") {
        None | Some(Value::Null) => None,
        Some(_) if mig_enabled => return Err(at.err(
            "mps",
            "MPS is configured on an entry with 'mig-enabled: true'; gpupart runs MPS only on GPUs with MIG disabled",
        )),
        Some(v) => Some(parse_mps(at, v)?),
    };
    Ok(DeviceSpec { filter, devices, mig_enabled, mig_devices, mps })
}

/// Largest `replicas` on any GPU (Volta and later); the per-architecture limit is checked per GPU.
const MPS_MAX_CLIENTS: u64 = 48;

/// The `mps` block: `replicas`, `active-thread-percentage`, `pinned-memory-limit`.
fn parse_mps(at: At<'_>, v: &Value) -> Result<MpsSpec, ConfigError> {
    let Value::Object(m) = v else {
        return Err(at.err("mps", format!("expected a mapping with 'replicas', found {}", show(v))));
    };
    for key in m.keys() {
        if !matches!(key.as_str(), "replicas" | "active-thread-percentage" | "pinned-memory-limit") {
            return Err(at.err(&format!("mps.{key}"), format!("unexpected field: {key}")));
        }
    }
    let replicas = match m.get("replicas") {
        None => return Err(at.err("mps.replicas", "missing required field 'replicas'")),
        Some(r) => r.as_u64().filter(|n| (2..=MPS_MAX_CLIENTS).contains(n)).ok_or_else(|| {
            at.err(
                "mps.replicas",
                format!(
                    "invalid replicas {}: expected an integer from 2 to {MPS_MAX_CLIENTS} (16 before Volta)",
                    show(r)
                ),
            )
        })? as u32,
    };
    let active_thread_percentage = match m.get("active-thread-percentage") {
        None | Some(Value::Null) => None,
        Some(p) => Some(p.as_u64().filter(|n| (1..=100).contains(n)).ok_or_else(|| {
            at.err(
                "mps.active-thread-percentage",
                format!("invalid percentage {}: expected an integer from 1 to 100", show(p)),
            )
        })? as u32),
    };
    let pinned_memory_limit_mib = match m.get("pinned-memory-limit") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_mem_limit(s).ok_or_else(|| {
            at.err(
                "mps.pinned-memory-limit",
                format!("invalid memory limit '{s}': expected a whole number of M or G, e.g. 512M or 7G"),
            )
        })?),
        Some(other) => {
            return Err(at.err(
                "mps.pinned-memory-limit",
                format!("invalid memory limit {}: expected a string such as 512M or 7G", show(other)),
            ))
        }
    };
    Ok(MpsSpec { replicas, active_thread_percentage, pinned_memory_limit_mib })
}

/// `512M` or `7G` (MiB and GiB, as `set_default_device_pinned_mem_limit` takes them) in MiB.
pub(crate) fn parse_mem_limit(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, factor) = match s.strip_suffix(['G', 'g']) {
        Some(n) => (n, 1024),
        None => (s.strip_suffix(['M', 'm'])?, 1),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(factor)).filter(|n| *n > 0)
}

/// Parses an unsigned 32-bit integer the way Go's `strconv.ParseUint(s, 0, 32)` does.
fn parse_uint(s: &str) -> Option<u32> {
    let s = s.trim();
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if let Some(b) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        (b, 2)
    } else if let Some(o) = s.strip_prefix("0o").or_else(|| s.strip_prefix("0O")) {
        (o, 8)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    let digits = digits.replace('_', "");
    if digits.is_empty() {
        return None;
    }
    u32::from_str_radix(&digits, radix).ok()
}

fn parse_filter(at: At<'_>, s: &str) -> Result<DeviceFilter, ConfigError> {
    let bad = || {
        at.err(
            "device-filter",
            format!("invalid device id '{s}': expected 0xDEVICEVENDOR or 0xDEVICEVENDOR:0xSUBSYSTEM, e.g. 0x20B210DE"),
        )
    };
    let (main, sub) = match s.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    Ok(DeviceFilter {
        device_id: parse_uint(main).ok_or_else(bad)?,
        subsystem_id: sub.map(|b| parse_uint(b).ok_or_else(bad)).transpose()?,
    })
}

fn parse_devices(at: At<'_>, m: &Map<String, Value>) -> Result<Devices, ConfigError> {
    match m.get("devices") {
        Some(Value::String(s)) if s == "all" => Ok(Devices::All),
        Some(Value::String(s)) => Err(at.err("devices", format!("invalid string input for 'devices': '{s}'"))),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for i in items {
                let idx = i.as_u64().filter(|n| *n <= u64::from(u32::MAX)).ok_or_else(|| {
                    at.err("devices", format!("invalid device index {}: expected a non-negative integer", show(i)))
                })? as u32;
                if out.contains(&idx) {
                    return Err(at.err("devices", format!("device index {idx} is listed twice")));
                }
                out.push(idx);
            }
            if out.is_empty() {
                return Err(at.err("devices", "the list of device indices is empty"));
            }
            Ok(Devices::Indices(out))
        }
        Some(other) => Err(at.err(
            "devices",
            format!("invalid input for 'devices': {}, expected 'all' or a list of indices", show(other)),
        )),
        None => Err(at.err("devices", "missing required field 'devices'")),
    }
}

fn parse_mig_devices(
    at: At<'_>,
    m: &Map<String, Value>,
    mig_enabled: bool,
) -> Result<Vec<(gpupart_mig::ProfileName, u32)>, ConfigError> {
    let entries = match (m.get("mig-devices"), mig_enabled) {
        (None | Some(Value::Null), true) => {
            return Err(at.err("mig-devices", "missing required field 'mig-devices' when 'mig-enabled' is true"))
        }
        (None | Some(Value::Null), false) => return Ok(Vec::new()),
        (Some(Value::Object(o)), _) => o,
        (Some(other), _) => {
            return Err(at.err(
                "mig-devices",
                format!("expected a mapping of MIG device names to counts, found {}", show(other)),
            ))
        }
    };
    if !mig_enabled && !entries.is_empty() {
        return Err(at.err("mig-devices", "MIG devices included when 'mig-enabled' is false"));
    }
    let mut out = Vec::new();
    for (name, count) in entries {
        let parsed: gpupart_mig::ProfileName =
            name.parse().map_err(|e: gpupart_mig::name::NameError| at.err("mig-devices", e.to_string()))?;
        let n = count.as_u64().filter(|n| *n <= 64).ok_or_else(|| {
            at.err(
                "mig-devices",
                format!("invalid count {} for '{name}': expected an integer from 0 to 64", show(count)),
            )
        })? as u32;
        if out.iter().any(|(p, _)| *p == parsed) {
            return Err(at.err("mig-devices", format!("'{name}' is listed twice")));
        }
        out.push((parsed, n));
    }
    if !out.is_empty() && out.iter().all(|(_, n)| *n == 0) {
        return Err(at.err("mig-devices", "all counts for all MigProfiles are 0"));
    }
    out.retain(|(_, n)| *n > 0);
    Ok(out)
}
