//! The generated layouts (pure): a content-addressed name for each node layout the controller
//! writes (`gpupart-auto-<hash>`, so two nodes that need the same layout share it and a new
//! leader computes the same names), and the merge of generated layouts into the agents' mig-parted
//! config next to the hand-written ones, removing generated layouts no node uses.

use crate::fleet::layout::config_yaml;
use crate::fleet::report::{GpuSpec, Layout};
use crate::mig::catalog::Model;
use serde_json::Value;
use std::collections::BTreeSet;

/// Prefix of every layout the controller generates.
pub const GENERATED_PREFIX: &str = "gpupart-auto-";

/// Why the layouts config cannot be updated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutsError {
    /// The hand-written config does not parse.
    #[error("the layouts config does not parse: {0}")]
    Invalid(String),
    /// The merged config would not parse (a bug, never written).
    #[error("the merged layouts config would be invalid: {0}")]
    Merged(String),
}

/// FNV-1a, 64 bits: stable across Rust releases and platforms (the names must be).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The entries of one layout as mig-parted v1 YAML (the value under its name).
fn entries(model: &'static Model, specs: &[GpuSpec]) -> Result<Value, String> {
    let layout = Layout { name: "x".into(), pool: String::new(), model, specs: specs.to_vec() };
    let doc: Value = serde_saphyr::from_str(&config_yaml(&[layout])).map_err(|e| e.to_string())?;
    Ok(doc["mig-configs"]["x"].clone())
}

/// A generated layout: its name and entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// `gpupart-auto-<hash>`.
    pub name: String,
    /// The entries.
    pub entries: Value,
}

/// The generated layout for a node of `model` with these per-GPU specs.
pub fn generate(model: &'static Model, specs: &[GpuSpec]) -> Result<Generated, String> {
    let entries = entries(model, specs)?;
    let name = format!("{GENERATED_PREFIX}{:016x}", fnv1a(entries.to_string().as_bytes()));
    Ok(Generated { name, entries })
}

/// Names of the layouts in a config text (hand-written and generated).
pub fn names(text: &str) -> Result<Vec<String>, LayoutsError> {
    let doc = parse_doc(text)?;
    Ok(doc["mig-configs"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default())
}

fn parse_doc(text: &str) -> Result<Value, LayoutsError> {
    if text.trim().is_empty() {
        return Ok(serde_json::json!({"version": "v1", "mig-configs": {}}));
    }
    crate::config::parse(text).map_err(|e| LayoutsError::Invalid(e.to_string()))?;
    crate::config::yaml::from_str(text).map_err(LayoutsError::Invalid)
}

/// Merges `add` into the config `text`; generated layouts outside `add` and `in_use` are removed,
/// hand-written ones are kept as they are. `None` when nothing changes.
pub fn merge(text: &str, add: &[Generated], in_use: &BTreeSet<String>) -> Result<Option<String>, LayoutsError> {
    let mut doc = parse_doc(text)?;
    let before = doc.clone();
    if !doc["mig-configs"].is_object() {
        doc["mig-configs"] = Value::Object(Default::default());
    }
    let Some(configs) = doc["mig-configs"].as_object_mut() else { return Ok(None) };
    let wanted: BTreeSet<&str> = add.iter().map(|g| g.name.as_str()).collect();
    configs.retain(|name, _| {
        !name.starts_with(GENERATED_PREFIX) || in_use.contains(name) || wanted.contains(name.as_str())
    });
    for g in add {
        configs.insert(g.name.clone(), g.entries.clone());
    }
    if doc == before {
        return Ok(None);
    }
    let out = serde_saphyr::to_string(&doc).map_err(|e| LayoutsError::Merged(e.to_string()))?;
    crate::config::parse(&out).map_err(|e| LayoutsError::Merged(format!("{e}\n{out}")))?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> &'static Model {
        crate::mig::catalog::lookup("H100-SXM5-80GB").unwrap()
    }

    const HAND: &str = "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n  all-3g.40gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n";

    #[test]
    fn generated_layouts_merge_next_to_hand_written_ones_and_parse() {
        let specs =
            vec![GpuSpec::Mig(vec![("1g.10gb".into(), 7)]), GpuSpec::Mig(vec![("3g.40gb".into(), 2)]), GpuSpec::Off];
        let g = generate(h100(), &specs).unwrap();
        assert!(g.name.starts_with(GENERATED_PREFIX));
        assert_eq!(generate(h100(), &specs).unwrap().name, g.name, "names are content-addressed");
        let merged = merge(HAND, std::slice::from_ref(&g), &BTreeSet::new()).unwrap().unwrap();
        let cfg = crate::config::parse(&merged).unwrap();
        let names: Vec<&str> = cfg.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["all-disabled", "all-3g.40gb", g.name.as_str()]);
        let ours = cfg.configs.iter().find(|c| c.name == g.name).unwrap();
        assert_eq!(ours.specs.len(), 3);
        // The same merge again changes nothing; a generated layout no node uses is removed.
        assert_eq!(merge(&merged, std::slice::from_ref(&g), &BTreeSet::new()).unwrap(), None);
        let pruned = merge(&merged, &[], &BTreeSet::from(["all-3g.40gb".to_string()])).unwrap().unwrap();
        assert_eq!(names_of(&pruned), vec!["all-disabled", "all-3g.40gb"]);
        let kept = merge(&merged, &[], &BTreeSet::from([g.name.clone()])).unwrap();
        assert_eq!(kept, None);
        assert_eq!(
            names_of(&merge("", std::slice::from_ref(&g), &BTreeSet::new()).unwrap().unwrap()),
            vec![g.name.clone()]
        );
    }

    fn names_of(text: &str) -> Vec<String> {
        names(text).unwrap()
    }

    #[test]
    fn a_broken_hand_written_config_is_an_error_not_overwritten() {
        let e = merge(
            "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: maybe\n",
            &[],
            &BTreeSet::new(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("the layouts config does not parse"), "{e}");
    }
}
