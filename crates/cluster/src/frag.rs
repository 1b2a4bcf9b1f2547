//! Cluster-wide fragmentation (pure) from the agents' `gpupart.io/fragmentation` annotations:
//! per node as published, and in total (Σ fragmented / Σ unallocated GPU-equivalents).

use serde::Serialize;

/// One node's published figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeEntry {
    /// Node name.
    pub name: String,
    /// fragmented / unallocated on the node.
    pub ratio: f64,
    /// Fragmented GPU-equivalents.
    pub fragmented_gpus: f64,
    /// Unallocated GPU-equivalents.
    pub unallocated_gpus: f64,
    /// GPUs with no instances and no processes.
    pub whole_free_gpus: u64,
}

/// The cluster's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterFrag {
    /// Nodes with an agent's annotation.
    pub nodes: Vec<NodeEntry>,
    /// Nodes without one (no gpupart agent, or not yet published).
    pub without_agent: Vec<String>,
    /// Σ fragmented / Σ unallocated (0 when nothing is unallocated).
    pub fragmentation_ratio: f64,
    /// Σ fragmented GPU-equivalents.
    pub fragmented_gpus: f64,
    /// Σ unallocated GPU-equivalents.
    pub unallocated_gpus: f64,
    /// Σ whole free GPUs.
    pub whole_free_gpus: u64,
}

/// Why an annotation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node '{node}', annotation 'gpupart.io/fragmentation': {message}")]
pub struct AnnotationError {
    /// The node.
    pub node: String,
    /// What is wrong.
    pub message: String,
}

/// Sums the nodes' annotations (`None`: the node has none).
pub fn cluster(nodes: &[(String, Option<String>)]) -> Result<ClusterFrag, AnnotationError> {
    let mut out = ClusterFrag {
        nodes: Vec::new(),
        without_agent: Vec::new(),
        fragmentation_ratio: 0.0,
        fragmented_gpus: 0.0,
        unallocated_gpus: 0.0,
        whole_free_gpus: 0,
    };
    for (name, value) in nodes {
        let Some(text) = value else {
            out.without_agent.push(name.clone());
            continue;
        };
        let bad = |message: String| AnnotationError { node: name.clone(), message };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        // Agents before 0.2 wrote `fragGpus` and `unallocGpus`; their annotations still read.
        let num = |k: &str, old: &str| {
            v[k].as_f64()
                .or_else(|| v[old].as_f64())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| bad(format!("missing '{k}'")))
        };
        let e = NodeEntry {
            name: name.clone(),
            ratio: num("ratio", "ratio")?,
            fragmented_gpus: num("fragmentedGpus", "fragGpus")?,
            unallocated_gpus: num("unallocatedGpus", "unallocGpus")?,
            whole_free_gpus: v["wholeFreeGpus"].as_u64().unwrap_or(0),
        };
        out.fragmented_gpus += e.fragmented_gpus;
        out.unallocated_gpus += e.unallocated_gpus;
        out.whole_free_gpus += e.whole_free_gpus;
        out.nodes.push(e);
    }
    if out.unallocated_gpus > 0.0 {
        out.fragmentation_ratio = out.fragmented_gpus / out.unallocated_gpus;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_weigh_nodes_by_their_free_capacity() {
        let a = r#"{"ratio":0.5,"fragGpus":1.0,"unallocGpus":2.0,"wholeFreeGpus":0}"#;
        let b = r#"{"ratio":0.0,"fragmentedGpus":0.0,"unallocatedGpus":6.0,"wholeFreeGpus":6}"#;
        let c = cluster(&[("a".into(), Some(a.into())), ("b".into(), Some(b.into())), ("c".into(), None)]).unwrap();
        assert_eq!(c.nodes.len(), 2);
        assert_eq!(c.without_agent, vec!["c"]);
        assert!((c.fragmentation_ratio - 0.125).abs() < 1e-12);
        assert_eq!(c.whole_free_gpus, 6);
        let e = cluster(&[("x".into(), Some("{}".into()))]).unwrap_err();
        assert!(e.to_string().contains("node 'x'") && e.to_string().contains("'ratio'"), "{e}");
    }
}
