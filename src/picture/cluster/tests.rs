use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;
use crate::health::HealthBook;
use std::collections::BTreeMap;

/// What one simulated node publishes, drawn from its GPUs as the agent reads them.
#[derive(Default)]
struct Sim<'a> {
    spec: &'a str,
    /// Per GPU with MIG: its instances (profile, start).
    mig: Vec<(u32, Vec<(&'a str, u32)>)>,
    /// (GPU, start) of the instances a process uses.
    busy: Vec<(u32, u32)>,
    /// (GPU, start) of the instances the layout does not hold.
    foreign: Vec<(u32, u32)>,
    /// (GPU, slots, used) of GPUs serving MPS.
    mps: Vec<(u32, u32, u32)>,
    /// GPUs fenced by XID 79.
    unhealthy: Vec<u32>,
}

/// The node's `gpus` and `fragmentation` annotations, written by the agent's own summary.
fn annotations(sim: &Sim) -> (String, String) {
    let b = SimBackend::open(Some(sim.spec), None).unwrap();
    for (gpu, gis) in &sim.mig {
        b.set_mig_mode(*gpu, true).unwrap();
        let _ = b.reset_gpu(*gpu);
        let table = b.observe(*gpu).unwrap().profiles;
        for (name, start) in gis {
            let p = table.profiles.iter().find(|p| p.name.to_string() == *name).unwrap();
            let placement = *p.placements.iter().find(|pl| pl.start == *start).unwrap();
            b.create_gpu_instance(*gpu, p.id, placement).unwrap();
        }
    }
    let mut states = b.observe_all().unwrap();
    for (gpu, start) in &sim.busy {
        let gi = states[*gpu as usize].instances.iter_mut().find(|g| g.placement.start == *start).unwrap();
        gi.processes.push(crate::observed::Process { pid: 42, name: String::new(), used_memory_mib: 0 });
    }
    let mut frags = crate::frag::node_gpu_frags(&states, &[], None);
    for (gpu, slots, used) in &sim.mps {
        crate::frag::count_mps_slots(&mut frags[*gpu as usize], *slots, *used);
    }
    let mut book = HealthBook::default();
    let all: Vec<u32> = (0..states.len() as u32).collect();
    for gpu in &sim.unhealthy {
        let e = crate::health::GpuEvent { gpu: *gpu, kind: crate::health::EventKind::Xid(79), instance: None, at: 1 };
        book.record(&e, &all, &crate::health::XidPolicy::default()).unwrap();
    }
    let mut foreign: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (gpu, start) in &sim.foreign {
        foreign.entry(*gpu).or_default().push(*start);
    }
    let mut s = crate::kube::summary::summarize(&states, frags, false, &book, &foreign);
    (s.annotations.remove("gpus").unwrap(), s.annotations.remove("fragmentation").unwrap())
}

/// The nodes (name, pool, annotations) as `frag --cluster -o svg` reads them, in drawing order,
/// with the cluster's figures.
fn cluster(nodes: &[(&str, Option<&str>, (String, String))]) -> (Vec<NodeView>, ClusterFrag) {
    let published: Vec<(String, Option<String>)> =
        nodes.iter().map(|(n, _, (_, f))| (n.to_string(), Some(f.clone()))).collect();
    let c = gpupart_cluster::frag::cluster(&published).unwrap();
    let mut views: Vec<NodeView> = nodes
        .iter()
        .zip(&c.nodes)
        .map(|((name, pool, (gpus, _)), e)| NodeView {
            name: name.to_string(),
            pool: pool.map(str::to_string),
            gpus: gpupart_cluster::fleet::current::from_annotation(name, gpus).unwrap(),
            frag: e.clone(),
        })
        .collect();
    order(&mut views);
    (views, c)
}

fn svg(views: &[NodeView], c: &ClusterFrag, page: Page) -> String {
    let text = render(views, c, page).unwrap();
    roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not well-formed XML: {e}\n{text}"));
    text
}

const ALL: Page = Page { number: 1, size: 200 };

/// (node, gpu) → (profile, start, size, x, width, busy, foreign) of every instance rectangle,
/// x relative to its GPU's bar.
type Drawn = BTreeMap<(String, u32), Vec<crate::picture::Drawn>>;

fn drawn(text: &str) -> Drawn {
    let doc = roxmltree::Document::parse(text).unwrap();
    let mut out = Drawn::new();
    for node in doc.descendants().filter(|e| e.attribute("class") == Some("node")) {
        for gpu in node.children().filter(|e| e.attribute("data-gpu").is_some()) {
            let key =
                (node.attribute("data-node").unwrap().to_string(), gpu.attribute("data-gpu").unwrap().parse().unwrap());
            out.insert(key, crate::picture::drawn_instances(gpu));
        }
    }
    out
}

#[test]
fn each_instance_spans_exactly_its_placements_slices_in_the_small_bars() {
    let cases = [
        (
            "A100-SXM4-80GB:2",
            vec![(0, vec![("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)]), (1, vec![("7g.80gb", 0)])],
        ),
        ("H100-SXM5-80GB:1", vec![(0, vec![("4g.40gb", 0), ("1g.10gb", 6)])]),
        ("A30-24GB:1", vec![(0, vec![("2g.12gb", 0), ("1g.6gb", 3)])]),
    ];
    let nodes: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(k, (spec, mig))| {
            let sim = Sim { spec, mig: mig.clone(), busy: vec![(0, 0)], ..Default::default() };
            (["a", "h", "t"][k], Some("shared"), annotations(&sim))
        })
        .collect();
    let (views, c) = cluster(&nodes);
    let text = svg(&views, &c, ALL);
    let drawn = drawn(&text);
    for ((name, _, _), (spec, mig)) in nodes.iter().zip(&cases) {
        let slices = catalog::lookup(spec.split(':').next().unwrap()).unwrap().profile_table().memory_slices;
        let sw = GPU_W / slices;
        for (gpu, gis) in mig {
            let rects = &drawn[&(name.to_string(), *gpu)];
            assert_eq!(rects.len(), gis.len(), "{spec} GPU {gpu}: {rects:?}");
            for (profile, start) in gis {
                let r = rects.iter().find(|r| r.0 == *profile && r.1 == *start).expect("drawn");
                assert_eq!((r.3, r.4), (start * sw, r.2 * sw), "{spec} {profile}@{start}");
                assert_eq!(r.5, *start == 0 && *gpu == 0, "{spec} {profile}@{start}: hatched only when busy");
            }
        }
    }
    // The sizes are the catalog's: a 7g.80gb covers all 8 slices, a 3g.40gb 4, an A30 2g 2 of 4.
    assert_eq!(drawn[&("a".into(), 1)][0].2, 8);
    assert_eq!(drawn[&("a".into(), 0)].iter().find(|r| r.0 == "3g.40gb").unwrap().2, 4);
    assert_eq!(drawn[&("t".into(), 0)].iter().find(|r| r.0 == "2g.12gb").unwrap().4, 24);
}

#[test]
fn foreign_stranded_mps_and_unhealthy_gpus_are_marked_on_their_own_gpu() {
    let sim = Sim {
        spec: "A100-SXM4-80GB:2,T4-16GB:2",
        mig: vec![(0, vec![("4g.40gb", 0), ("1g.10gb", 5)]), (1, vec![("3g.40gb", 4), ("1g.10gb", 0)])],
        foreign: vec![(1, 0)],
        mps: vec![(2, 4, 2)],
        unhealthy: vec![3],
        ..Default::default()
    };
    let (views, c) = cluster(&[("n", None, annotations(&sim))]);
    let text = svg(&views, &c, ALL);
    let d = drawn(&text);
    assert!(d[&("n".into(), 1)].iter().any(|r| r.0 == "1g.10gb" && r.6), "{:?}", d[&("n".into(), 1)]);
    assert!(d[&("n".into(), 0)].iter().all(|r| !r.6), "only the named instance is foreign");
    let doc = roxmltree::Document::parse(&text).unwrap();
    let gpu = |k: &str| {
        doc.descendants()
            .find(|e| e.attribute("data-node") == Some("n"))
            .unwrap()
            .children()
            .find(|e| e.attribute("data-gpu") == Some(k))
            .unwrap()
    };
    let classes = |k: &str| -> Vec<String> {
        gpu(k).children().filter_map(|e| e.attribute("class").map(str::to_string)).collect()
    };
    // As many stranded cells as the node picture's own rule finds on those instances.
    for k in ["0", "1"] {
        let states_stranded = classes(k).iter().filter(|c| *c == "stranded").count();
        let want = {
            let t = catalog::lookup("A100-SXM4-80GB").unwrap().profile_table();
            let g = &views[0].gpus[k.parse::<usize>().unwrap()];
            let placed: Vec<_> = g
                .instances
                .iter()
                .map(|i| {
                    let (p, _) = t.resolve(&i.profile).unwrap();
                    (
                        p.id,
                        crate::mig::Placement::new(
                            i.start,
                            p.placements.iter().find(|pl| pl.start == i.start).unwrap().size,
                        ),
                    )
                })
                .collect();
            stranded(&t, placed).len()
        };
        assert_eq!(states_stranded, want, "GPU {k}");
    }
    assert!(classes("2").iter().any(|c| c == "mps"), "{:?}", classes("2"));
    assert!(classes("3").iter().any(|c| c.starts_with("whole")), "{:?}", classes("3"));
    assert!(classes("3").iter().any(|c| c == "unhealthy") && !classes("2").iter().any(|c| c == "unhealthy"));
    assert!(text.contains("1 unhealthy"), "the pool's strip counts it");
    assert!(text.contains(NO_POOL), "a node without the pool label is drawn under its own heading");
}

#[test]
fn a_gpu_with_a_stranded_slice_has_it_cross_hatched() {
    // 3g.40gb@0 and 1g.10gb@6 leave slices 4, 5 and 7 free: 1g.10gb fits at 4 and 5 (its
    // placements are 0-6), but every placement over slice 7 (1g.20gb@6, 2g.20gb@6) overlaps the 1g.
    let sim =
        Sim { spec: "A100-SXM4-80GB:1", mig: vec![(0, vec![("3g.40gb", 0), ("1g.10gb", 6)])], ..Default::default() };
    let (views, c) = cluster(&[("n", Some("p"), annotations(&sim))]);
    let text = svg(&views, &c, ALL);
    let doc = roxmltree::Document::parse(&text).unwrap();
    let row = doc.descendants().find(|e| e.attribute("data-node") == Some("n")).unwrap();
    let stranded: Vec<u32> = row
        .descendants()
        .filter(|e| e.attribute("class") == Some("stranded") && e.attribute("x").is_some())
        .map(|e| e.attribute("x").unwrap().parse::<u32>().unwrap() / (GPU_W / 8))
        .collect();
    assert_eq!(stranded, vec![7], "{text}");
}

#[test]
fn nodes_are_grouped_by_pool_and_sorted_by_free_room() {
    let idle = annotations(&Sim { spec: "A100-SXM4-80GB:2", ..Default::default() });
    let half =
        annotations(&Sim { spec: "A100-SXM4-80GB:2", mig: vec![(0, vec![("7g.80gb", 0)])], ..Default::default() });
    let full = annotations(&Sim {
        spec: "A100-SXM4-80GB:2",
        mig: vec![(0, vec![("7g.80gb", 0)]), (1, vec![("7g.80gb", 0)])],
        ..Default::default()
    });
    let nodes = [
        ("z-full", Some("shared"), full.clone()),
        ("b-idle", Some("shared"), idle.clone()),
        ("a-half", Some("shared"), half.clone()),
        ("c-idle", Some("dedicated"), idle.clone()),
        ("loose", None, half),
        ("a-full", Some("dedicated"), full),
    ];
    let (views, c) = cluster(&nodes);
    let text = svg(&views, &c, ALL);
    let doc = roxmltree::Document::parse(&text).unwrap();
    let rows: Vec<&str> = doc.descendants().filter_map(|e| e.attribute("data-node")).collect();
    assert_eq!(rows, ["c-idle", "a-full", "b-idle", "a-half", "z-full", "loose"]);
    let headings: Vec<&str> = doc
        .descendants()
        .filter(|e| e.is_element())
        .filter_map(|e| e.text())
        .filter(|t| t.starts_with("pool "))
        .collect();
    assert_eq!(headings, ["pool dedicated", "pool shared", &format!("pool {NO_POOL}")]);
}

#[test]
fn pages_split_the_rows_and_the_strips_count_every_node() {
    let one =
        annotations(&Sim { spec: "A100-SXM4-80GB:1", mig: vec![(0, vec![("3g.40gb", 0)])], ..Default::default() });
    let names: Vec<String> = (0..450).map(|k| format!("node-{k:03}")).collect();
    let nodes: Vec<_> = names.iter().map(|n| (n.as_str(), Some("shared"), one.clone())).collect();
    let (views, c) = cluster(&nodes);
    let page = |number| svg(&views, &c, Page { number, size: 200 });
    let rows = |text: &str| -> Vec<String> {
        let doc = roxmltree::Document::parse(text).unwrap();
        doc.descendants().filter_map(|e| e.attribute("data-node").map(str::to_string)).collect()
    };
    let (first, third) = (page(1), page(3));
    assert_eq!(rows(&first).len(), 200);
    assert_eq!(rows(&third), names[400..].to_vec());
    assert!(third.contains("nodes 401–450 of 450, page 3 of 3"), "{}", &third[..3000]);
    assert!(third.contains("pool shared (continued)"));
    for text in [&first, &third] {
        assert!(text.contains("shared: 450 nodes, 450 GPUs"), "every page's strip covers every node");
        assert!(text.contains("450 nodes · fragmentation"));
    }
    let e = render(&views, &c, Page { number: 4, size: 200 }).unwrap_err();
    assert_eq!(e.to_string(), "page 4 does not exist: 450 nodes make 3 page(s) of 200");
    assert!(render(&views, &c, Page { number: 0, size: 200 }).is_err());
}

#[test]
fn odd_annotations_draw_without_panicking() {
    // A model this catalog lacks (a newer agent), a placement no profile has, a profile name
    // the model lacks, an empty cluster, and a long node name.
    let gpus = r#"[{"i":0,"model":"B999-NEW","mode":"mig","layout":["1g.10gb@0"]},
        {"i":1,"model":"A100-SXM4-80GB","mode":"mig","layout":["1g.10gb@7","3g.40gb@1","1g.6gb@0"]}]"#;
    let frag = r#"{"ratio":0,"fragmentedGpus":0,"unallocatedGpus":1,"wholeFreeGpus":0}"#;
    let long = "a-very-long-node-name-that-goes-on-and-on.example.internal";
    let (views, c) = cluster(&[(long, Some("p"), (gpus.to_string(), frag.to_string()))]);
    let text = svg(&views, &c, ALL);
    let d = drawn(&text);
    assert!(d[&(long.to_string(), 0)].is_empty(), "an unknown model is one whole bar");
    assert!(d[&(long.to_string(), 1)].is_empty(), "no legal placement, nothing drawn: {:?}", d[&(long.to_string(), 1)]);
    assert!(text.contains('…'), "the long name is shortened in its row");
    let empty = gpupart_cluster::frag::cluster(&[]).unwrap();
    svg(&[], &empty, ALL);
}

/// The example in docs/pictures/cluster.svg: three pools of A100, H100 and T4 nodes with busy,
/// foreign and stranded instances, MPS and an unhealthy GPU, and a node without an agent.
/// Compared byte for byte; `GPUPART_BLESS=1 cargo test --lib picture` writes it again after a
/// reviewed change.
#[test]
fn the_documented_example_is_what_is_drawn() {
    let a100 = |mig: Vec<(u32, Vec<(&'static str, u32)>)>, busy: Vec<(u32, u32)>, foreign: Vec<(u32, u32)>| {
        annotations(&Sim { spec: "A100-SXM4-80GB:4", mig, busy, foreign, ..Default::default() })
    };
    let balanced = || vec![("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)];
    let ones = || (0..7).map(|s| ("1g.10gb", s)).collect::<Vec<_>>();
    let nodes = [
        (
            "gpu-a-1",
            Some("shared"),
            a100(
                vec![(0, balanced()), (1, ones()), (2, balanced()), (3, ones())],
                vec![(0, 4), (1, 0), (1, 1), (3, 5)],
                vec![],
            ),
        ),
        (
            "gpu-a-2",
            Some("shared"),
            a100(
                vec![
                    (0, vec![("4g.40gb", 0), ("3g.40gb", 4)]),
                    (1, balanced()),
                    (2, vec![("1g.10gb", 6)]),
                    (3, vec![]),
                ],
                vec![(0, 0)],
                vec![(2, 6)],
            ),
        ),
        ("gpu-a-3", Some("shared"), a100(vec![(0, balanced()), (1, balanced())], vec![(0, 4), (1, 4)], vec![])),
        (
            "gpu-h-1",
            Some("dedicated"),
            annotations(&Sim {
                spec: "H100-SXM5-80GB:4",
                mig: vec![(0, vec![("7g.80gb", 0)]), (1, vec![("7g.80gb", 0)])],
                busy: vec![(0, 0), (1, 0)],
                ..Default::default()
            }),
        ),
        ("gpu-h-2", Some("dedicated"), annotations(&Sim { spec: "H100-SXM5-80GB:4", ..Default::default() })),
        (
            "gpu-t-1",
            Some("mps"),
            annotations(&Sim {
                spec: "T4-16GB:4",
                mps: vec![(0, 4, 3), (1, 4, 0)],
                unhealthy: vec![3],
                ..Default::default()
            }),
        ),
    ];
    let (views, mut c) = cluster(&nodes);
    c.without_agent.push("cpu-1".to_string());
    let text = svg(&views, &c, ALL);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/pictures/cluster.svg");
    if std::env::var_os("GPUPART_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&path).expect("docs/pictures/cluster.svg (GPUPART_BLESS=1 writes it)");
    assert_eq!(text, golden, "the picture changed: review it, then GPUPART_BLESS=1");
}
