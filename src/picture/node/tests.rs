use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;
use crate::mig::Placement;

/// Turns MIG on for GPU `gpu` of `b` and creates GPU instances `(profile, start)` there.
fn with_instances(b: &SimBackend, gpu: u32, gis: &[(&str, u32)]) {
    b.set_mig_mode(gpu, true).unwrap();
    let _ = b.reset_gpu(gpu);
    let table = b.observe(gpu).unwrap().profiles;
    for (name, start) in gis {
        let p = table.profiles.iter().find(|p| p.name.to_string() == *name).unwrap();
        let placement = *p.placements.iter().find(|pl| pl.start == *start).unwrap();
        b.create_gpu_instance(gpu, p.id, placement).unwrap();
    }
}

/// A node of `spec` with MIG on GPU `gpu` and GPU instances `(profile, start)` there.
fn node(spec: &str, gpu: u32, gis: &[(&str, u32)]) -> SimBackend {
    let b = SimBackend::open(Some(spec), None).unwrap();
    with_instances(&b, gpu, gis);
    b
}

fn svg(states: &[GpuState], extra: &[Extra], fenced: &HealthBook) -> String {
    let text = render(states, extra, fenced);
    roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{text}"));
    text
}

/// Every instance rectangle, read back.
fn instances(text: &str) -> Vec<crate::picture::Drawn> {
    crate::picture::drawn_instances(roxmltree::Document::parse(text).unwrap().root())
}

fn stranded_slices(text: &str) -> Vec<u32> {
    let doc = roxmltree::Document::parse(text).unwrap();
    doc.descendants()
        .filter(|e| e.attribute("class") == Some("free stranded"))
        .map(|e| e.attribute("data-slice").unwrap().parse().unwrap())
        .collect()
}

#[test]
fn each_instance_spans_exactly_its_placements_slices_on_every_model() {
    for (spec, gis) in [
        ("A100-SXM4-80GB:1", vec![("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)]),
        ("H100-SXM5-80GB:1", vec![("4g.40gb", 0), ("1g.10gb", 6)]),
        ("A30-24GB:1", vec![("2g.12gb", 0), ("1g.6gb", 3)]),
    ] {
        let b = node(spec, 0, &gis);
        let states = b.observe_all().unwrap();
        let text = svg(&states, &[], &HealthBook::default());
        let drawn = instances(&text);
        assert_eq!(drawn.len(), gis.len(), "{spec}");
        for g in &states[0].instances {
            let Placement { start, size } = g.placement;
            let want = (states[0].gi_name(g), start, size, BAR_X + start * SLICE_W, size * SLICE_W, false, false);
            assert!(drawn.contains(&want), "{spec}: {want:?} not in {drawn:?}");
        }
        let slices = roxmltree::Document::parse(&text)
            .unwrap()
            .descendants()
            .filter(|e| e.attribute("data-slice").is_some())
            .count();
        assert_eq!(slices as u32, states[0].profiles.memory_slices, "{spec}: one rectangle per memory slice");
    }
}

#[test]
fn busy_instances_are_hatched_and_unusable_slices_are_marked_stranded() {
    // 1g.10gb at 6 leaves slice 7 free, and every placement over slice 7 overlaps slice 6.
    let b = node("A100-SXM4-80GB:1", 0, &[("1g.10gb", 6), ("3g.40gb", 0)]);
    let mut s = b.observe_all().unwrap();
    s[0].instances.iter_mut().find(|g| g.placement.start == 0).unwrap().processes.push(crate::observed::Process {
        pid: 42,
        name: String::new(),
        used_memory_mib: 0,
    });
    assert_eq!(stranded(&s[0]), vec![7]);
    let text = svg(&s, &[], &HealthBook::default());
    assert_eq!(stranded_slices(&text), vec![7]);
    let busy: Vec<(String, bool)> = instances(&text).into_iter().map(|i| (i.0, i.5)).collect();
    assert_eq!(busy, vec![("3g.40gb".to_string(), true), ("1g.10gb".to_string(), false)]);
    assert!(text.contains("fill=\"url(#busy)\""));
    assert!(text.contains("largest creatable: 2g.20gb"), "{text}");
}

#[test]
fn whole_gpus_show_their_mps_slots_and_unhealthy_gpus_their_fault() {
    let b = SimBackend::open(Some("T4-16GB:2"), None).unwrap();
    let states = b.observe_all().unwrap();
    let mut fenced = HealthBook::default();
    let e = crate::health::GpuEvent { gpu: 1, kind: crate::health::EventKind::Xid(79), instance: None, at: 1 };
    fenced.record(&e, &[0, 1], &crate::health::XidPolicy::default()).unwrap();
    let text = svg(&states, &[Extra { mps: Some((4, 1)), ..Extra::default() }, Extra::default()], &fenced);
    assert!(text.contains("GPU 0 · T4-16GB · MPS, 1 of 4 slots used"), "{text}");
    assert!(text.contains("GPU 1 · T4-16GB · whole GPU — UNHEALTHY (XID 79)"), "{text}");
    assert!(text.contains("class=\"whole busy\"") && text.contains("class=\"whole\""));
    assert_eq!(text.matches("class=\"unhealthy\" x=").count(), 1);
    assert!(!text.contains("<script") && !text.contains("@font-face") && !text.contains("href=\"http"));
}

/// The example in docs/pictures/node.svg: an A100 with a busy instance and a stranded slice, an
/// H100 with a foreign instance, an A30, a T4 serving MPS and an unhealthy T4. Compared byte for byte;
/// `GPUPART_BLESS=1 cargo test --lib picture` writes it again after a reviewed change.
#[test]
fn the_documented_example_is_what_is_drawn() {
    let b = SimBackend::open(Some("A100-SXM4-80GB:1,H100-SXM5-80GB:1,A30-24GB:1,T4-16GB:2"), None).unwrap();
    for (gpu, gis) in [
        (0, vec![("3g.40gb", 0), ("1g.10gb", 6)]),
        (1, vec![("4g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)]),
        (2, vec![("2g.12gb", 0), ("1g.6gb", 3)]),
    ] {
        with_instances(&b, gpu, &gis);
    }
    let mut states = b.observe_all().unwrap();
    states[0].instances[0].processes.push(crate::observed::Process {
        pid: 42,
        name: String::new(),
        used_memory_mib: 0,
    });
    let mut fenced = HealthBook::default();
    let e = crate::health::GpuEvent { gpu: 4, kind: crate::health::EventKind::Xid(79), instance: None, at: 1 };
    fenced.record(&e, &[0, 1, 2, 3, 4], &crate::health::XidPolicy::default()).unwrap();
    // The H100's 1g.10gb@5 is not in the node's layout: foreign.
    let extra = [
        Extra::default(),
        Extra { foreign: vec![5], ..Extra::default() },
        Extra::default(),
        Extra { mps: Some((4, 1)), ..Extra::default() },
        Extra::default(),
    ];
    let text = svg(&states, &extra, &fenced);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/pictures/node.svg");
    if std::env::var_os("GPUPART_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&path).expect("docs/pictures/node.svg (GPUPART_BLESS=1 writes it)");
    assert_eq!(text, golden, "the picture changed: review it, then GPUPART_BLESS=1");
}
