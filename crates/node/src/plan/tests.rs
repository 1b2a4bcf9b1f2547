use super::*;
use crate::mig::catalog;
use crate::observed::{CiState, GiState, Process};

/// Fixture builder: a GPU model with existing instances.
struct Gpu {
    table: ProfileTable,
    gis: Vec<GiState>,
}

fn mk_gpu(model: &str) -> Gpu {
    Gpu { table: catalog::lookup(model).unwrap().profile_table(), gis: Vec::new() }
}

impl Gpu {
    /// Adds a GI of `name` at `start` with its full CI.
    fn gi(mut self, name: &str, start: u32) -> Self {
        let (p, ci) = self.table.resolve(&name.parse().unwrap()).unwrap();
        let id = self.gis.len() as u32 + 1;
        let slices = p.ci(ci).unwrap().slices;
        self.gis.push(GiState {
            id,
            profile_id: p.id,
            placement: Placement::new(start, p.memory_slices),
            cis: vec![CiState {
                id: 0,
                profile_id: ci,
                placement: Placement::new(0, slices),
                uuid: format!("MIG-test-{id}"),
                processes: Vec::new(),
                pods: Vec::new(),
            }],
            processes: Vec::new(),
        });
        self
    }

    /// Adds `count` GIs of `name` at its first free placements.
    fn with(mut self, name: &str, count: u32) -> Self {
        for _ in 0..count {
            let (p, _) = self.table.resolve(&name.parse().unwrap()).unwrap();
            let occ =
                crate::mig::capacity::Occupancy::of(&self.table, self.gis.iter().map(|g| (g.profile_id, g.placement)));
            let start = occ.free_placements(p).next().unwrap().start;
            self = self.gi(name, start);
        }
        self
    }

    /// Marks the last GI busy.
    fn busy(mut self, pid: u32) -> Self {
        let gi = self.gis.last_mut().unwrap();
        gi.cis[0].processes.push(Process { pid, name: "python".into(), used_memory_mib: 1000 });
        self
    }

    fn want(&self, spec: &[(&str, u32)]) -> DesiredDevices {
        let names: Vec<_> = spec.iter().map(|(n, c)| (n.parse().unwrap(), *c)).collect();
        DesiredDevices::resolve(&self.table, &names).unwrap()
    }

    fn plan(&self, spec: &[(&str, u32)], force: bool) -> Result<Plan, PlanError> {
        plan(&self.table, &self.gis, &self.want(spec), force)
    }
}

#[test]
fn applied_layout_is_a_noop() {
    let g = mk_gpu("A100-SXM4-80GB").gi("1g.10gb", 0).gi("1g.10gb", 1).gi("2g.20gb", 2).gi("3g.40gb", 4);
    let p = g.plan(&[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)], false).unwrap();
    assert!(p.is_noop());
    assert_eq!(p.keep.len(), 4);
}

#[test]
fn only_what_must_change_is_touched() {
    let g = mk_gpu("A100-SXM4-80GB").with("1g.10gb", 7);
    let p = g.plan(&[("1g.10gb", 5), ("2g.20gb", 1)], false).unwrap();
    assert_eq!(p.destroy.len(), 2, "{p:?}");
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.keep.len(), 5);
    let freed: u32 = p.destroy.iter().map(|d| d.placement.mask()).fold(0, |a, b| a | b);
    assert_eq!(freed, p.create[0].placement.mask(), "the 2g goes exactly where the two 1g were");
}

#[test]
fn busy_instances_are_never_destroyed_without_force() {
    let g = mk_gpu("A100-SXM4-80GB").gi("1g.10gb", 0).busy(4242).gi("1g.10gb", 5).busy(77);
    let err = g.plan(&[("1g.10gb", 2), ("3g.40gb", 1)], false).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PlanError::Blocked { ref instances, .. } if instances.len() == 1), "{text}");
    assert!(text.contains("no legal placement for 3g.40gb once 1g.10gb@0,1g.10gb@5 are kept"), "{text}");
    assert!(text.contains("pid") && text.contains("(python)"), "{text}");
    let forced = g.plan(&[("1g.10gb", 2), ("3g.40gb", 1)], true).unwrap();
    assert_eq!(forced.destroy.len(), 1);
    assert!(forced.destroy[0].busy);
}

#[test]
fn busy_instance_outside_the_layout_blocks() {
    let g = mk_gpu("H100-SXM5-80GB").gi("7g.80gb", 0).busy(1);
    let err = g.plan(&[("1g.10gb", 7)], false).unwrap_err().to_string();
    assert!(err.contains("7g.80gb@0 (GPU instance 1, MIG-test-1) is used by pid 1 (python)"), "{err}");
    assert!(err.contains("not part of the desired layout"), "{err}");
}

#[test]
fn a_busy_instance_that_can_stay_stays() {
    let g = mk_gpu("A100-SXM4-80GB").gi("1g.10gb", 3).busy(9).with("1g.10gb", 6);
    let p = g.plan(&[("1g.10gb", 3), ("3g.40gb", 1)], false).unwrap();
    assert!(p.destroy.iter().all(|d| !d.busy));
    assert!(p.keep.iter().any(|k| k.placement.start == 3));
    assert_eq!(p.create[0].placement.start, 4);
}

#[test]
fn infeasible_layouts_say_why() {
    let g = mk_gpu("A100-SXM4-80GB");
    let e = g.plan(&[("3g.40gb", 3)], false).unwrap_err().to_string();
    assert_eq!(e, "layout cannot fit: needs 3 GPU instances of 3g.40gb but the GPU allows 2");
    let e = g.plan(&[("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)], false).unwrap_err().to_string();
    assert_eq!(e, "layout cannot fit: needs 9 of 8 memory slices");
    let e = g.plan(&[("2g.20gb", 3), ("1g.20gb", 2)], false).unwrap_err().to_string();
    assert!(e.contains("memory slices") || e.contains("no legal placement"), "{e}");
    let e = g.plan(&[("4g.40gb", 1), ("2g.20gb", 2)], false).unwrap_err().to_string();
    assert_eq!(e, "layout cannot fit: needs 8 of 7 compute slices");
    let a30 = mk_gpu("A30-24GB");
    let e = a30.plan(&[("1g.6gb+me", 1), ("2g.12gb+me", 1)], false).unwrap_err().to_string();
    assert!(e.contains("media engines"), "{e}");
}

#[test]
fn free_space_stays_usable() {
    let g = mk_gpu("A100-SXM4-80GB");
    let p = g.plan(&[("1g.10gb", 1)], false).unwrap();
    assert!(p.create[0].placement.start >= 4, "keeps 4g.40gb@0 creatable: {p:?}");
    assert_eq!(p.quality.largest, (4, 4));
    // The guide's known issue (3-2-1-1 needs the 3g first) is moot with explicit placements.
    let p = g.plan(&[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)], false).unwrap();
    assert_eq!(p.create.len(), 4);
}

#[test]
fn empty_instances_are_replaced_and_ci_layouts_count() {
    // A GPU instance without compute instances keeps its slot and gets its CI.
    let mut g = mk_gpu("A100-SXM4-80GB").gi("3g.40gb", 0);
    g.gis[0].cis.clear();
    let p = g.plan(&[("3g.40gb", 1)], false).unwrap();
    assert_eq!((p.destroy.len(), p.create.len(), p.reshape.len()), (0, 0, 1));
    assert_eq!(p.reshape[0].device_names, vec!["3g.40gb"]);
    let g = mk_gpu("A100-SXM4-80GB").gi("3g.40gb", 4);
    let p = g.plan(&[("1c.3g.40gb", 3), ("3g.40gb", 1)], false).unwrap();
    assert_eq!(p.keep.len(), 1);
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].device_names, vec!["1c.3g.40gb"; 3]);
}

#[test]
fn a_new_compute_instance_split_keeps_the_gpu_instance() {
    // 3g.40gb ×2 → one of them as three 1c.3g.40gb: only the CIs of one GI change.
    let g = mk_gpu("A100-SXM4-80GB").gi("3g.40gb", 0).gi("3g.40gb", 4);
    let p = g.plan(&[("1c.3g.40gb", 3), ("3g.40gb", 1)], false).unwrap();
    assert_eq!((p.keep.len(), p.reshape.len(), p.destroy.len(), p.create.len()), (1, 1, 0, 0), "{p:?}");
    let r = &p.reshape[0];
    assert_eq!(r.ci_ids, vec![0]);
    assert_eq!(r.device_names, vec!["1c.3g.40gb"; 3]);
    let starts: Vec<u32> = r.cis.iter().map(|(_, pl)| pl.start).collect();
    assert_eq!(starts, vec![0, 1, 2]);
    // And back: a GI with three 1c CIs becomes one full 3g.40gb in place.
    let mut g = mk_gpu("A100-SXM4-80GB").gi("3g.40gb", 4);
    let one = g.table.resolve(&"1c.3g.40gb".parse().unwrap()).unwrap().1;
    g.gis[0].cis = (0..3)
        .map(|k| CiState {
            id: k,
            profile_id: one,
            placement: Placement::new(k, 1),
            uuid: format!("MIG-{k}"),
            processes: Vec::new(),
            pods: Vec::new(),
        })
        .collect();
    let p = g.plan(&[("3g.40gb", 1)], false).unwrap();
    assert_eq!((p.reshape.len(), p.destroy.len(), p.create.len()), (1, 0, 0));
    assert_eq!(p.reshape[0].ci_ids, vec![0, 1, 2]);
    assert_eq!(p.reshape[0].placement.start, 4);
}

#[test]
fn a_busy_gpu_instance_is_never_reshaped() {
    let g = mk_gpu("A100-SXM4-80GB").gi("3g.40gb", 0).busy(7);
    assert!(matches!(g.plan(&[("1c.3g.40gb", 3)], false), Err(PlanError::Blocked { .. })));
    let p = g.plan(&[("1c.3g.40gb", 3)], true).unwrap();
    assert!(p.reshape.is_empty());
    assert_eq!((p.destroy.len(), p.create.len()), (1, 1));
}
