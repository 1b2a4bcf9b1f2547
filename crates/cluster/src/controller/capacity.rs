//! What each node offers and what pods hold there (pure), as the scheduler sees it: units of each
//! GPU resource that exist (or will, once the requested layout is applied), the units bound pods
//! or busy devices hold, and the first-fit placement of the pods still waiting.

use super::gpu_options::{current_offers, observed_spec, Counts};
use super::nodes::{GpuNode, Phase};
use super::pods::{GpuPod, Resource, Standing};
use crate::config::{select, ConfigFile, GpuIdent, Selection};
use crate::fleet::current::CurrentGpu;
use crate::fleet::report::GpuSpec;
use crate::mig::catalog::Model;
use crate::mig::ProfileName;

/// Adds `b` into `a`.
pub fn add(a: &mut Counts, b: &Counts) {
    for (r, n) in b {
        *a.entry(r.clone()).or_default() += n;
    }
}

/// The per-GPU specs of the node's requested layout in `config` (`None` when the layout is not
/// there or does not apply): what unchanged GPUs keep, and what a reconfiguring node will offer.
pub fn layout_specs(node: &GpuNode, model: &Model, config: Option<&ConfigFile>) -> Option<Vec<GpuSpec>> {
    let layout = node.layout()?;
    let mig = config?.configs.iter().find(|c| c.name == layout)?;
    let idents: Vec<GpuIdent> = node
        .gpus
        .iter()
        .map(|g| GpuIdent {
            index: g.index,
            device_id: model.pci_device_id,
            subsystem_id: None,
            mig_capable: model.mig_capable(),
            model: model.id.to_string(),
        })
        .collect();
    let sel = select(mig, &idents).ok()?;
    Some(
        sel.into_iter()
            .zip(&node.gpus)
            .map(|(s, g)| match s {
                Selection::Enabled { devices, .. } => {
                    let mut d: Vec<(String, u32)> =
                        devices.iter().filter(|(_, n)| *n > 0).map(|(p, n)| (p.to_string(), *n)).collect();
                    d.sort();
                    GpuSpec::Mig(d)
                }
                Selection::Disabled { mps: Some(m), .. } => {
                    GpuSpec::Mps { slots: m.replicas, limit_mib: m.pinned_memory_limit_mib }
                }
                Selection::Disabled { mps: None, .. } => GpuSpec::Off,
                Selection::Unselected | Selection::SkippedNoMig { .. } => observed_spec(g),
            })
            .collect(),
    )
}

/// What a spec offers.
pub fn spec_offers(spec: &GpuSpec) -> Counts {
    match spec {
        GpuSpec::Mig(devs) => devs
            .iter()
            .filter_map(|(n, c)| {
                let p: ProfileName = n.parse().ok()?;
                (p.gi_name() == p).then_some((Resource::Mig(p), *c))
            })
            .collect(),
        GpuSpec::Off => Counts::from([(Resource::Gpu, 1)]),
        GpuSpec::Mps { slots, .. } => Counts::from([(Resource::Mps, *slots)]),
    }
}

/// Units the agent reports in use on a GPU.
fn busy_units(g: &CurrentGpu) -> Counts {
    let mut c = Counts::new();
    if g.mig {
        for i in g.instances.iter().filter(|i| i.busy) {
            *c.entry(Resource::Mig(i.profile.clone())).or_default() += 1;
        }
    } else if g.mps_slots.is_some() {
        // The annotation's slotsUsed is folded into `busy`; a busy MPS GPU holds at least a slot.
        if g.busy {
            c.insert(Resource::Mps, 1);
        }
    } else if g.busy {
        c.insert(Resource::Gpu, 1);
    }
    c
}

/// One node's ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeLedger {
    /// Units that exist (or will once the requested layout is applied).
    pub offered: Counts,
    /// Units bound pods or busy devices hold.
    pub held: Counts,
    /// Units the simulated scheduler gives to waiting pods.
    pub assigned: Counts,
    /// Bound pods (`namespace/name`), for messages.
    pub pods: Vec<String>,
}

impl NodeLedger {
    /// Units of `r` bound pods, busy devices and placed waiting pods take.
    pub fn taken(&self, r: &Resource) -> u32 {
        self.held.get(r).copied().unwrap_or(0) + self.assigned.get(r).copied().unwrap_or(0)
    }

    /// Units of `r` still free.
    pub fn free(&self, r: &Resource) -> u32 {
        self.offered.get(r).copied().unwrap_or(0).saturating_sub(self.taken(r))
    }
}

/// Builds a node's ledger and the GPUs as the controller must treat them: where bound pods hold
/// more units of a profile than the agent flags busy (it has not seen them yet), every device of
/// that kind on the node counts as busy, so nothing a pod may use is torn down.
pub fn ledger(
    node: &GpuNode,
    model: &Model,
    pods: &[&GpuPod],
    config: Option<&ConfigFile>,
) -> (NodeLedger, Vec<CurrentGpu>) {
    let mut l = NodeLedger::default();
    let target = match node.phase() {
        Phase::Reconfiguring(_) => layout_specs(node, model, config),
        _ => None,
    };
    for (k, g) in node.gpus.iter().enumerate().filter(|(_, g)| g.unhealthy.is_none()) {
        match target.as_ref().and_then(|t| t.get(k)) {
            Some(spec) => add(&mut l.offered, &spec_offers(spec)),
            None => add(&mut l.offered, &current_offers(g)),
        }
    }
    let mut busy = Counts::new();
    for g in node.gpus.iter().filter(|g| g.unhealthy.is_none()) {
        add(&mut busy, &busy_units(g));
    }
    let mut bound = Counts::new();
    for p in pods.iter().filter(|p| p.node() == Some(node.name.as_str())) {
        for (r, n) in p.asks() {
            *bound.entry(r.clone()).or_default() += n;
        }
        l.pods.push(p.key.clone());
    }
    let mut gpus = node.gpus.clone();
    for (r, n) in &bound {
        if *n > busy.get(r).copied().unwrap_or(0) {
            for g in &mut gpus {
                match r {
                    Resource::Mig(p) => g.instances.iter_mut().filter(|i| &i.profile == p).for_each(|i| i.busy = true),
                    Resource::Gpu if !g.mig && g.mps_slots.is_none() => g.busy = true,
                    Resource::Mps if g.mps_slots.is_some() => g.busy = true,
                    _ => {}
                }
            }
        }
    }
    for (r, n) in busy.iter().chain(bound.iter()) {
        let e = l.held.entry(r.clone()).or_default();
        *e = (*e).max(*n);
    }
    (l, gpus)
}

/// Where the scheduler would put waiting pods: each placed pod with its node's position.
pub type Assigned<'p> = Vec<(&'p GpuPod, usize)>;

/// Places the waiting pods on nodes with free units as the scheduler would, in its order (higher
/// priority first, then older); returns the pods that fit nowhere and where the others went.
/// `dedicated[i]` says node `i` is in the dedicated pool (only pods tolerating its taint go
/// there); `usable[i]` false keeps pods off node `i`; `lands(p, i, placed)` says whether `p` could
/// land on node `i` apart from its GPUs, with `placed` the pods placed so far.
pub fn schedule<'p>(
    ledgers: &mut [NodeLedger],
    dedicated: &[bool],
    usable: &[bool],
    pods: &'p [GpuPod],
    lands: impl Fn(&GpuPod, usize, &[(&'p GpuPod, usize)]) -> bool,
) -> (Vec<&'p GpuPod>, Assigned<'p>) {
    let mut waiting: Vec<&GpuPod> =
        pods.iter().filter(|p| matches!(p.standing, Standing::Waiting | Standing::Unschedulable { .. })).collect();
    waiting.sort_by(|a, b| a.queue_cmp(b));
    let mut left = Vec::new();
    let mut placed: Assigned<'p> = Vec::new();
    // Until the next placement the ledgers and the placed pods stay as they are, so a pod asking
    // what one found no node for, under the same constraints, finds none either.
    let mut nowhere: std::collections::HashSet<String> = std::collections::HashSet::new();
    for p in waiting {
        let namespace = p.key.split('/').next().unwrap_or_default();
        let alike = format!("{:?}|{}|{namespace}|{:?}", p.asks().collect::<Vec<_>>(), p.dedicated, p.constraints);
        if nowhere.contains(&alike) {
            left.push(p);
            continue;
        }
        let fit = (0..ledgers.len()).find(|&i| {
            usable[i]
                && (!dedicated[i] || p.dedicated)
                && p.asks().all(|(r, n)| ledgers[i].free(r) >= n)
                && lands(p, i, &placed)
        });
        match fit {
            Some(i) => {
                for (r, n) in p.asks() {
                    *ledgers[i].assigned.entry(r.clone()).or_default() += n;
                }
                placed.push((p, i));
                nowhere.clear();
            }
            None => {
                nowhere.insert(alike);
                left.push(p);
            }
        }
    }
    (left, placed)
}

/// The pods of `counts` (units each, in the scheduler's order) that `free` units serve as the
/// scheduler serves them: each in turn if it still fits, skipped otherwise. Their positions.
pub fn served_in_order(counts: &[u32], free: u32) -> Vec<usize> {
    let mut left = free;
    let mut out = Vec::new();
    for (i, &c) in counts.iter().enumerate() {
        if c <= left {
            left -= c;
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_served_in_the_schedulers_order_skipping_what_does_not_fit() {
        assert_eq!(served_in_order(&[3, 1, 1, 2], 4), vec![0, 1]);
        assert_eq!(served_in_order(&[3, 2, 1], 4), vec![0, 2]);
        assert_eq!(served_in_order(&[2], 1), Vec::<usize>::new());
        assert_eq!(served_in_order(&[], 5), Vec::<usize>::new());
    }

    #[test]
    fn bound_pods_the_agent_has_not_flagged_make_their_kind_busy() {
        let g = r#"[{"i":0,"model":"A100-SXM4-80GB","mode":"mig","layout":["3g.40gb@0","3g.40gb@4"]}]"#;
        let node = GpuNode::read(&super::super::nodes::tests::node("n", g, &[], false)).unwrap().unwrap();
        let mut pod = super::super::pods::fixture("a", "p", Resource::Mig("3g.40gb".parse().unwrap()), 1, 0);
        pod.standing = Standing::Bound { node: "n".into() };
        let model = crate::mig::catalog::lookup("A100-SXM4-80GB").unwrap();
        let (l, gpus) = ledger(&node, model, &[&pod], None);
        assert_eq!(l.free(&Resource::Mig("3g.40gb".parse().unwrap())), 1);
        assert!(gpus[0].instances.iter().all(|i| i.busy));
        assert_eq!(l.pods, vec!["a/p"]);
    }
}
