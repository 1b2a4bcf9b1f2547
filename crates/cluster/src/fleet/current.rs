//! Today's layouts, the starting point of `plan --current FILE | --from-cluster` (pure parsing):
//! per node, per GPU, the MIG instances (profile, start, busy) or whether a GPU without MIG is in
//! use. Read from `gpupart status -o json` documents or the agents' `gpupart.io/gpus` annotations.

use super::input::InputError;
use crate::mig::ProfileName;
use serde_json::Value;
use std::collections::BTreeMap;

/// One GPU instance of today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentInstance {
    /// GPU-instance profile name.
    pub profile: ProfileName,
    /// Placement start (memory slices).
    pub start: u32,
    /// In use by a process or a pod: never moved.
    pub busy: bool,
    /// Not part of the layout the node asks for (made by hand or by another tool, or held by no
    /// claim), as the agent reported it.
    pub foreign: bool,
}

/// One GPU of today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentGpu {
    /// NVML index on its node.
    pub index: u32,
    /// Catalog model id as the node reported it.
    pub model: String,
    /// MIG enabled.
    pub mig: bool,
    /// Its GPU instances (MIG only).
    pub instances: Vec<CurrentInstance>,
    /// A GPU without MIG that is in use (processes, pods, MPS clients).
    pub busy: bool,
    /// Client slots of its MPS daemon, when one serves it.
    pub mps_slots: Option<u32>,
    /// Why the agent fenced it (`XID 79`), when it did: it offers nothing and does not change.
    pub unhealthy: Option<String>,
}

impl CurrentGpu {
    /// Whether anything on the GPU is in use.
    pub fn any_busy(&self) -> bool {
        self.busy || self.instances.iter().any(|i| i.busy)
    }
}

/// Today's GPUs by node name.
pub type Current = BTreeMap<String, Vec<CurrentGpu>>;

fn err(at: String, message: impl Into<String>) -> InputError {
    InputError { at, message: message.into() }
}

fn profile(at: &str, s: &str) -> Result<ProfileName, InputError> {
    s.parse::<ProfileName>().map(|p| p.gi_name()).map_err(|e| err(at.to_string(), e.to_string()))
}

/// One node's `gpupart status -o json` document.
pub fn from_status(node: &str, doc: &Value) -> Result<Vec<CurrentGpu>, InputError> {
    let at = format!("current '{node}'");
    let gpus =
        doc["gpus"].as_array().ok_or_else(|| err(at.clone(), "expected a `status -o json` document with 'gpus'"))?;
    gpus.iter()
        .enumerate()
        .map(|(k, g)| {
            let at = format!("{at}, gpus[{k}]");
            let index = g["index"].as_u64().ok_or_else(|| err(at.clone(), "missing 'index'"))? as u32;
            let model = g["model"].as_str().ok_or_else(|| err(at.clone(), "missing 'model'"))?.to_string();
            let mig = g["mig_mode"]["current"].as_bool().unwrap_or(false);
            // One entry per compute instance: a GPU instance is its (profile, start), busy if any CI is.
            let mut instances: Vec<CurrentInstance> = Vec::new();
            for (j, i) in g["instances"].as_array().map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
                let at = format!("{at}, instances[{j}]");
                let name = i["gpu_instance_profile"].as_str().or(i["profile"].as_str());
                let name = name.ok_or_else(|| err(at.clone(), "missing 'profile'"))?;
                let start =
                    i["placement"]["start"].as_u64().ok_or_else(|| err(at.clone(), "missing 'placement.start'"))?;
                let (profile, start, busy) = (profile(&at, name)?, start as u32, i["busy"].as_bool().unwrap_or(false));
                match instances.iter_mut().find(|x| x.start == start && x.profile == profile) {
                    Some(x) => x.busy |= busy,
                    None => instances.push(CurrentInstance { profile, start, busy, foreign: false }),
                }
            }
            let listed = |k: &str| g[k].as_array().is_some_and(|a| !a.is_empty());
            let clients = g["mps"]["clients"].as_array().is_some_and(|a| !a.is_empty());
            let busy = !mig && (listed("processes") || listed("pods") || clients);
            let mps_slots = g["mps"]["replicas"].as_u64().map(|n| n as u32);
            let unhealthy = g["unhealthy"]["reason"].as_str().map(str::to_string);
            Ok(CurrentGpu { index, model, mig, instances, busy, mps_slots, unhealthy })
        })
        .collect()
}

/// A file of `status -o json` documents: a mapping from node name to its document (YAML or JSON).
pub fn parse_status_file(text: &str) -> Result<Current, InputError> {
    let root: Value =
        crate::config::yaml::from_str(text).map_err(|e| err("current".into(), format!("invalid YAML: {e}")))?;
    let Value::Object(m) = root else {
        return Err(err("current".into(), "expected a mapping from node name to its `status -o json` document"));
    };
    m.iter().map(|(node, doc)| Ok((node.clone(), from_status(node, doc)?))).collect()
}

/// One node's `gpupart.io/gpus` annotation (docs/metrics.md).
pub fn from_annotation(node: &str, text: &str) -> Result<Vec<CurrentGpu>, InputError> {
    let at = format!("node '{node}', annotation 'gpupart.io/gpus'");
    let v: Value = serde_json::from_str(text).map_err(|e| err(at.clone(), format!("invalid JSON: {e}")))?;
    let gpus = v.as_array().ok_or_else(|| err(at.clone(), "expected a JSON array"))?;
    gpus.iter()
        .enumerate()
        .map(|(k, g)| {
            let at = format!("{at}, [{k}]");
            let index = g["i"].as_u64().ok_or_else(|| err(at.clone(), "missing 'i'"))? as u32;
            let model = g["model"].as_str().ok_or_else(|| err(at.clone(), "missing 'model'"))?.to_string();
            let mode = g["mode"].as_str().unwrap_or("none");
            let mut instances = Vec::new();
            for item in g["layout"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                let s = item.as_str().ok_or_else(|| err(at.clone(), "'layout' holds a non-string"))?;
                let (s, busy) = s.strip_suffix('*').map_or((s, false), |s| (s, true));
                let (name, start) =
                    s.split_once('@').ok_or_else(|| err(at.clone(), format!("'{s}' is not profile@start")))?;
                let start: u32 = start.parse().map_err(|_| err(at.clone(), format!("'{s}' has no numeric start")))?;
                instances.push(CurrentInstance { profile: profile(&at, name)?, start, busy, foreign: false });
            }
            if let Some(foreign) = g["foreign"].as_array() {
                for i in &mut instances {
                    let key = format!("{}@{}", i.profile, i.start);
                    i.foreign = foreign.iter().any(|f| f.as_str() == Some(key.as_str()));
                }
            }
            // A faulty MIG device (`unhealthyDevices`) is never moved and offers nothing: busy.
            if let Some(faulty) = g["unhealthyDevices"].as_object() {
                for i in &mut instances {
                    i.busy |= faulty.contains_key(&format!("{}@{}", i.profile, i.start));
                }
            }
            let busy = match mode {
                "mps" => g["slotsUsed"].as_u64().unwrap_or(0) > 0,
                "mig" => false,
                _ => g["busy"].as_bool().unwrap_or(false),
            };
            let mps_slots = g["slots"].as_u64().filter(|_| mode == "mps").map(|n| n as u32);
            let unhealthy = g["unhealthy"].as_str().map(str::to_string);
            Ok(CurrentGpu { index, model, mig: mode == "mig", instances, busy, mps_slots, unhealthy })
        })
        .collect()
}

/// The pods the agent reports holding each MIG instance, from its `gpupart.io/gpus` annotation:
/// (GPU index, placement start) → `namespace/name`s. Entries it cannot read are left out (an
/// agent too old to write them reports none).
pub fn holders_from_annotation(text: &str) -> BTreeMap<(u32, u32), Vec<String>> {
    let mut out = BTreeMap::new();
    let Ok(Value::Array(gpus)) = serde_json::from_str::<Value>(text) else { return out };
    for g in &gpus {
        let (Some(index), Some(pods)) = (g["i"].as_u64(), g["pods"].as_object()) else { continue };
        for (instance, who) in pods {
            let Some(start) = instance.split_once('@').and_then(|(_, s)| s.parse::<u32>().ok()) else { continue };
            let who: Vec<String> =
                who.as_array().into_iter().flatten().filter_map(|w| w.as_str().map(str::to_string)).collect();
            out.insert((index as u32, start), who);
        }
    }
    out
}

/// Gives the fleet's placeholder nodes (named from a group's `count:`) the names of today's
/// nodes outside the fleet that have the same GPU model and count, in name order; returns
/// (placeholder, real name) pairs. Placeholders with no such node keep their names.
pub fn adopt_names(input: &mut super::input::Input, today: &Current) -> Vec<(String, String)> {
    let mut free: Vec<&String> = today.keys().filter(|name| !input.nodes.iter().any(|n| &n.name == *name)).collect();
    let mut renamed = Vec::new();
    for node in input.nodes.iter_mut().filter(|n| !n.named && !today.contains_key(&n.name)) {
        let fits = |name: &&String| {
            let gpus = &today[*name];
            gpus.len() == node.gpus as usize && gpus.iter().all(|g| g.model == node.model.id)
        };
        if let Some(k) = free.iter().position(fits) {
            let real = free.remove(k).clone();
            renamed.push((std::mem::replace(&mut node.name, real.clone()), real));
            node.named = true;
        }
    }
    renamed
}
