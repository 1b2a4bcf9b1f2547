//! Text renderings of a plan (pure): the mig-parted v1 config, the `kubectl apply` stream
//! (ConfigMap, Node labels and taints, DeschedulerPolicy) and the readable summary.

use super::report::{PlanDoc, DEDICATED_TAINT, LAYOUT_LABEL, POOL_LABEL};
use std::fmt::Write as _;

/// Namespace and name of the agents' ConfigMap (daemonset.yaml).
pub const CONFIG_MAP: (&str, &str) = ("gpupart-system", "gpupart-config");

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

/// The multi-document stream for `kubectl apply --server-side`: the agents' ConfigMap and the
/// descheduler's policy. Nodes are never documents here (applying one would create a Node that
/// does not exist): their labels and taints are [`kubectl_script`]'s commands.
pub fn kube_yaml(doc: &PlanDoc) -> String {
    let mut out = String::new();
    let s = &doc.summary;
    let _ = writeln!(
        out,
        "# gpupart plan: {} of {} GPUs used, {} idle, fragmentation {:.3}; first-fit uses {} (fragmentation {:.3})",
        s.gpus_used,
        s.gpus_total,
        s.gpus_idle,
        s.fragmentation_ratio,
        doc.baseline.gpus_used,
        doc.baseline.fragmentation_ratio
    );
    for u in &doc.unplaced {
        let _ = writeln!(out, "# unplaced: {} × {}: {}", u.replicas, u.model, u.reason);
    }
    let (ns, name) = CONFIG_MAP;
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\ndata:\n  config.yaml: |\n{}",
        indent(&doc.config, "    ")
    );
    out.push_str(&descheduler_policy());
    out
}

/// A shell script that carries the plan out on existing nodes: `kubectl apply` of
/// [`kube_yaml`], then `kubectl label` and `kubectl taint` per node. kubectl refuses a node that
/// does not exist, so the script never creates one.
pub fn kubectl_script(doc: &PlanDoc) -> String {
    let mut out = String::from(
        "#!/bin/sh\n# gpupart plan: the agents' ConfigMap and the descheduler policy, then each node's labels\n",
    );
    out.push_str(
        "# and taints. kubectl refuses a node that does not exist: names made from a group's `count:`\n\
         # (<group>-<i>) are placeholders; list real names with `nodes:` or plan with --from-cluster.\n\
         set -eu\n",
    );
    out.push_str("kubectl apply --server-side --field-manager=gpupart-plan -f - <<'GPUPART_PLAN'\n");
    out.push_str(&kube_yaml(doc));
    out.push_str("GPUPART_PLAN\n");
    let key = DEDICATED_TAINT.split(['=', ':']).next().unwrap_or(DEDICATED_TAINT);
    for n in &doc.nodes {
        let _ = writeln!(
            out,
            "kubectl label node {} --overwrite {LAYOUT_LABEL}={} {POOL_LABEL}={}",
            shell_word(&n.name),
            shell_word(&n.labels[LAYOUT_LABEL]),
            shell_word(&n.labels[POOL_LABEL])
        );
        if n.taints.is_empty() {
            // A node that leaves the dedicated pool loses its taint (absent already: nothing to do).
            let _ = writeln!(out, "kubectl taint node {} {key}- 2>/dev/null || true", shell_word(&n.name));
        }
        for t in &n.taints {
            let _ = writeln!(out, "kubectl taint node {} --overwrite {}", shell_word(&n.name), shell_word(t));
        }
    }
    out
}

/// `s` quoted for a POSIX shell where it holds anything beyond name characters.
fn shell_word(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The descheduler's policy for the GPU pools, as the ConfigMap the descheduler reads: only the
/// plugins that empty a node made dedicated of the pods that no longer belong there (required
/// node affinity, the dedicated taint). No balance plugin: LowNodeUtilization moves GPU pods from
/// busy nodes to nearly idle ones, spreading them — the opposite of packing, and it would take
/// the idle node a tensor-parallel pod needs. Moving pods to make room needs GPUs and slices
/// ([`crate::defrag`]).
fn descheduler_policy() -> String {
    let key = DEDICATED_TAINT.split(':').next().unwrap_or(DEDICATED_TAINT);
    format!(
        r#"---
apiVersion: v1
kind: ConfigMap
metadata:
  name: descheduler-policy-configmap
  namespace: kube-system
data:
  policy.yaml: |
    apiVersion: "descheduler/v1alpha2"
    kind: "DeschedulerPolicy"
    nodeSelector: "{POOL_LABEL}"
    profiles:
      - name: gpupart-gpu-pools
        pluginConfig:
          - name: "DefaultEvictor"
          - name: "RemovePodsViolatingNodeAffinity"
            args:
              nodeAffinityType:
                - "requiredDuringSchedulingIgnoredDuringExecution"
          - name: "RemovePodsViolatingNodeTaints"
            args:
              includedTaints:
                - "{key}"
        plugins:
          deschedule:
            enabled:
              - "RemovePodsViolatingNodeAffinity"
              - "RemovePodsViolatingNodeTaints"
"#
    )
}

/// The readable summary.
pub fn text(doc: &PlanDoc) -> String {
    let mut out = String::new();
    let s = &doc.summary;
    out.push_str("Decisions:\n");
    for d in &doc.decisions {
        let _ = writeln!(out, "  {:<16} {:<9} {}", d.model, d.pool, d.reason);
    }
    out.push_str("Nodes:\n");
    let mut groups: Vec<(String, String, Vec<&str>)> = Vec::new();
    for n in &doc.nodes {
        match groups.iter_mut().find(|(l, p, _)| *l == n.layout && *p == n.pool) {
            Some((_, _, names)) => names.push(&n.name),
            None => groups.push((n.layout.clone(), n.pool.clone(), vec![&n.name])),
        }
    }
    for (layout, pool, names) in &groups {
        let taint = if pool == "dedicated" { format!(", tainted {DEDICATED_TAINT}") } else { String::new() };
        let _ = writeln!(out, "  {:<24} pool {pool}{taint}: {}", layout, names.join(", "));
    }
    for u in &doc.unplaced {
        let _ = writeln!(out, "Unplaced: {} × {}: {}", u.replicas, u.model, u.reason);
    }
    let _ = writeln!(
        out,
        "Summary: {} of {} GPUs used, {} idle, fragmentation {:.3} ({:.2} of {:.2} free GPU-equivalents), {} mixed node(s); MIG packing {} ({} GPUs, lower bound {})",
        s.gpus_used,
        s.gpus_total,
        s.gpus_idle,
        s.fragmentation_ratio,
        s.fragmented_gpus,
        s.unallocated_gpus,
        s.mixed_nodes,
        s.search.method,
        s.search.mig_gpus,
        s.search.lower_bound_gpus
    );
    for b in &doc.baselines {
        let _ = writeln!(
            out,
            "Baseline {}: {} GPUs used, fragmentation {:.3}, {} mixed node(s), {} unplaced",
            b.name, b.gpus_used, b.fragmentation_ratio, b.mixed_nodes, b.unplaced
        );
    }
    out
}
