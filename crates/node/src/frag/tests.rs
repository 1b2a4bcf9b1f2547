use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;
use crate::mig::capacity::Occupancy;
use crate::mig::{catalog, Placement, ProfileTable};
use crate::observed::{CiState, GiState};
use proptest::prelude::*;

/// A MIG-enabled GPU of `model` with GIs (profile name, start), each with its full CI.
fn gpu(model: &str, gis: &[(&str, u32)]) -> GpuState {
    let backend = SimBackend::open(Some(&format!("{model}:1")), None).unwrap();
    let mut s = backend.observe(0).unwrap();
    s.mig_mode.current = true;
    s.mig_mode.pending = true;
    for (i, (name, start)) in gis.iter().enumerate() {
        let (p, ci) = s.profiles.resolve(&name.parse().unwrap()).unwrap();
        let slices = p.ci(ci).unwrap().slices;
        s.instances.push(GiState {
            id: i as u32 + 1,
            profile_id: p.id,
            placement: Placement::new(*start, p.memory_slices),
            cis: vec![CiState {
                id: 0,
                profile_id: ci,
                placement: Placement::new(0, slices),
                uuid: String::new(),
                processes: vec![],
                pods: Vec::new(),
            }],
            processes: vec![],
        });
    }
    s
}

fn profile<'a>(g: &'a GpuFrag, name: &str) -> &'a ProfileFrag {
    g.profiles.iter().find(|p| p.profile == name).unwrap()
}

#[test]
fn reference_example_h100_1g_at_0_1_5() {
    let g = gpu_frag(&gpu("H100-SXM5-80GB", &[("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 5)]), None);
    assert_eq!((g.free_memory_slices, g.free_compute_slices), (5, 4));
    for big in ["3g.40gb", "4g.40gb", "7g.80gb"] {
        assert_eq!(profile(&g, big).creatable, 0, "{big}");
        assert_eq!(profile(&g, big).stranded_slices, 5, "{big}");
        assert_eq!(profile(&g, big).unusable_ratio, 1.0);
    }
    assert_eq!(g.largest_creatable.as_deref(), Some("2g.20gb"));
    assert_eq!(profile(&g, "2g.20gb").creatable, 1);
    assert_eq!(profile(&g, "1g.10gb").stranded_slices, 1, "slot 7 is no 1g placement");
}

#[test]
fn empty_gpu_against_uniform_and_configured_mixes() {
    let s = gpu("A100-SXM4-80GB", &[]);
    let g = gpu_frag(&s, None);
    // Base profiles: 1g.10gb (stranded 1), 2g (2), 3g (0), 4g (4), 7g (0), 1g.20gb (0).
    assert_eq!(g.workload.len(), 6);
    assert!((g.expected_fragmentation_slices - 7.0 / 6.0).abs() < 1e-9, "{}", g.expected_fragmentation_slices);
    assert!((g.expected_fragmentation_ratio - 7.0 / 48.0).abs() < 1e-9);
    assert_eq!((g.unallocated_gpus, g.whole_free), (1.0, true));
    let w = Workload {
        weights: vec![
            ("3g.40gb".parse().unwrap(), 3.0),
            ("4g.40gb".parse().unwrap(), 1.0),
            ("9g.99gb".parse().unwrap(), 5.0),
        ],
    };
    let g = gpu_frag(&s, Some(&w));
    assert_eq!(g.workload, vec![("3g.40gb".to_string(), 0.75), ("4g.40gb".to_string(), 0.25)]);
    assert!((g.expected_fragmentation_slices - 1.0).abs() < 1e-9);
}

#[test]
fn node_totals() {
    let full = gpu("A100-SXM4-80GB", &[("7g.80gb", 0)]);
    let frag = gpu("H100-SXM5-80GB", &[("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 5)]);
    let backend = SimBackend::open(Some("V100-SXM2-16GB:1"), None).unwrap();
    let v100 = backend.observe(0).unwrap();
    let gs: Vec<GpuFrag> = [full, frag, v100].iter().map(|s| gpu_frag(s, None)).collect();
    let n = node_frag(&gs);
    assert_eq!(n.gpus, 3);
    assert_eq!((n.whole_free_gpus, n.idle_without_mig_gpus), (1, 1));
    assert!((n.unallocated_gpus - (5.0 / 8.0 + 1.0)).abs() < 1e-9);
    assert!(n.fragmented_gpus > 0.0 && n.fragmentation_ratio > 0.0 && n.fragmentation_ratio <= 1.0);
    assert_eq!(gs[0].fragmented_gpus, 0.0);
}

/// Brute force: the most instances of `p` that can be added, by exhaustive search.
fn brute_creatable(t: &ProfileTable, occ: &Occupancy, pid: u32) -> u32 {
    let p = t.by_id(pid).unwrap();
    p.placements
        .iter()
        .filter(|pl| occ.check(t, p, **pl).is_ok())
        .map(|pl| {
            let mut o = *occ;
            o.add(p, *pl);
            1 + brute_creatable(t, &o, pid)
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn figures_match_brute_force_on_every_model(model in 0usize..9, picks in proptest::collection::vec((0usize..16, 0usize..8), 0..8)) {
        let models: Vec<_> = catalog::models().filter(|m| m.mig_capable()).collect();
        let m = models[model % models.len()];
        let t = m.profile_table();
        let mut occ = Occupancy::empty();
        let mut gis = Vec::new();
        for (pi, li) in picks {
            let p = &t.profiles[pi % t.profiles.len()];
            let pl = p.placements[li % p.placements.len()];
            if occ.check(&t, p, pl).is_ok() {
                occ.add(p, pl);
                gis.push((p.name.to_string(), pl.start));
            }
        }
        let names: Vec<(&str, u32)> = gis.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let g = gpu_frag(&gpu(m.id, &names), None);
        let free = g.free_memory_slices;
        let mut best: Option<(u32, u32)> = None;
        for (p, f) in t.profiles.iter().zip(&g.profiles) {
            let brute = brute_creatable(&t, &occ, p.id);
            prop_assert_eq!(f.creatable, brute, "{} {}", m.id, p.name);
            prop_assert_eq!(f.stranded_slices, free - brute * p.memory_slices);
            prop_assert!((0.0..=1.0).contains(&f.unusable_ratio));
            if brute > 0 && best.is_none_or(|b| (p.memory_slices, p.slices) > b) {
                best = Some((p.memory_slices, p.slices));
            }
        }
        prop_assert_eq!(best.map_or(0, |b| b.0), g.largest_creatable_slices);
        prop_assert!(g.expected_fragmentation_slices <= f64::from(free) + 1e-9);
        prop_assert!((0.0..=1.0).contains(&g.expected_fragmentation_ratio));
        prop_assert!(g.fragmented_gpus <= g.unallocated_gpus + 1e-9);
    }
}
