//! The pictures end to end. `gpupart status -o svg` on both backends: a well-formed,
//! self-contained SVG whose instance rectangles span exactly the placements `status -o json`
//! reports, busy ones marked, and instances outside a layout marked foreign. `gpupart frag
//! --cluster -o svg` against the API test server: the rows are what a real agent published.

#[macro_use]
mod support;

use support::{example_config, gpupart, Backend, Node};

on_both_backends!(status_draws_each_instance_over_its_placement);

fn status_draws_each_instance_over_its_placement(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2");
    node.apply(&example_config(), "all-balanced");
    let gi = node.load().gpus[1].gpu_instances[0].id;
    node.attach(1, gi, 4242);
    let text = node.run(&["status", "-o", "svg"]).ok().stdout;
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(!text.contains("<script") && !text.contains("@font-face") && !text.contains("href=\"http"));
    let json = node.status();
    let n = |e: &roxmltree::Node, k: &str| e.attribute(k).unwrap().parse::<u64>().unwrap();
    for (gpu, g) in json["gpus"].as_array().unwrap().iter().enumerate() {
        let group = doc.descendants().find(|e| e.attribute("data-gpu") == Some(&gpu.to_string())).unwrap();
        let rects: Vec<_> =
            group.descendants().filter(|e| e.attribute("class").is_some_and(|c| c.starts_with("instance"))).collect();
        let instances = g["instances"].as_array().unwrap();
        assert_eq!(rects.len(), instances.len(), "GPU {gpu}: one rectangle per GPU instance");
        for i in instances {
            let (start, size) = (i["placement"]["start"].as_u64().unwrap(), i["placement"]["size"].as_u64().unwrap());
            let r = rects.iter().find(|r| n(r, "data-start") == start).expect("a rectangle at the placement");
            assert_eq!((n(r, "x"), n(r, "width")), (16 + 64 * start, 64 * size), "GPU {gpu} {i}");
            assert_eq!(r.attribute("data-profile"), i["gpu_instance_profile"].as_str());
            let busy = r.attribute("class").unwrap().contains("busy");
            assert_eq!(busy, i["busy"].as_bool().unwrap(), "GPU {gpu} {i}");
        }
    }
}

/// (x, width) per (profile, start) of the instance rectangles in `group`, with busy and foreign.
fn rects_in(group: roxmltree::Node) -> Vec<(String, u64, u64, u64, bool, bool)> {
    let n = |e: &roxmltree::Node, k: &str| e.attribute(k).unwrap().parse::<u64>().unwrap();
    group
        .descendants()
        .filter(|e| e.attribute("class").is_some_and(|c| c.starts_with("instance")))
        .map(|e| {
            let class = e.attribute("class").unwrap();
            let busy = class.contains("busy")
                || e.next_sibling_element().is_some_and(|s| s.attribute("fill") == Some("url(#busy)"));
            (
                e.attribute("data-profile").unwrap().to_string(),
                n(&e, "data-start"),
                n(&e, "x"),
                n(&e, "width"),
                busy,
                class.contains("foreign"),
            )
        })
        .collect()
}

#[test]
fn status_marks_the_instances_a_layout_does_not_hold_as_foreign() {
    let node = Node::new("A100-SXM4-80GB:1");
    node.apply(&example_config(), "all-balanced");
    let cfg = example_config();
    let text = node.run(&["status", "-o", "svg", "-f", &cfg, "--layout", "all-1g.10gb"]).ok().stdout;
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    let rects = rects_in(doc.root_element());
    // all-balanced is 1 × 3g.40gb, 1 × 2g.20gb, 2 × 1g.10gb; all-1g.10gb keeps the 1g only.
    assert_eq!(rects.len(), 4, "{rects:?}");
    for r in &rects {
        assert_eq!(r.5, r.0 != "1g.10gb", "{r:?}");
    }
    // Against the layout that is applied, nothing is foreign; without one, nothing either.
    let same = node.run(&["status", "-o", "svg", "-f", &cfg, "--layout", "all-balanced"]).ok().stdout;
    assert!(!same.contains("instance foreign") && !same.contains("foreign\" data-profile"), "{same}");
    // An unknown layout is refused, naming it and the file.
    let bad = node.run(&["status", "-o", "svg", "-f", &cfg, "--layout", "all-9g"]).failed();
    assert!(
        bad.stderr.contains("unknown config 'all-9g'") && bad.stderr.contains("examples/config.yaml"),
        "{}",
        bad.stderr
    );
    // `frag -o svg` is the same picture.
    assert_eq!(node.run(&["frag", "-o", "svg"]).ok().stdout, node.run(&["status", "-o", "svg"]).ok().stdout);
    let alone = node.run(&["status", "-o", "svg", "--layout", "all-3g.40gb"]).failed();
    assert!(alone.stderr.contains("--config-file"), "{}", alone.stderr);
}

#[test]
fn the_cluster_picture_draws_what_the_agents_publish() {
    use support::apiserver::ApiServer;
    use support::kube_agent::{start, wait_state, LAYOUT, NODE};
    // gpu-node-1 runs a real agent: all-balanced with the 3g.40gb of GPU 0 busy, while the node
    // asks for all-1g.10gb; the busy 3g blocks the change, and the 3g and 2g instances are
    // outside the layout: foreign.
    let node = Node::new("A100-SXM4-80GB:2");
    node.apply(&example_config(), "all-balanced");
    let gi = node.load().gpus[0].gpu_instances.iter().find(|g| g.placement.size == 4).unwrap().id;
    node.attach(0, gi, 4242);
    let api = ApiServer::start(NODE);
    api.label("gpu-pool", Some("shared"));
    api.label(LAYOUT, Some("all-1g.10gb"));
    let _agent = start(&node, &api, &["--annotation-min-interval", "100ms"]);
    wait_state(&api, "failed", "all-1g.10gb");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !api.state().annotations.get("gpupart.io/gpus").is_some_and(|g| g.contains("foreign")) {
        assert!(std::time::Instant::now() < deadline, "no foreign instance in {:?}", api.state().annotations);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // gpu-node-2 as its agent would publish it, in another pool; cpu-node has no agent.
    let gpus = r#"[{"i":0,"model":"H100-SXM5-80GB","mode":"mig","layout":["7g.80gb@0*"]},{"i":1,"model":"H100-SXM5-80GB","mode":"none","busy":false}]"#;
    let frag = r#"{"ratio":0,"fragmentedGpus":0,"unallocatedGpus":1,"wholeFreeGpus":1}"#;
    api.put(
        "nodes",
        serde_json::json!({"apiVersion": "v1", "kind": "Node", "spec": {}, "status": {},
            "metadata": {"name": "gpu-node-2", "labels": {"gpu-pool": "dedicated"},
                "annotations": {"gpupart.io/gpus": gpus, "gpupart.io/fragmentation": frag}}}),
    );
    api.add_node("cpu-node", &[]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let kc = [("KUBECONFIG", kubeconfig.to_str().unwrap())];
    let text = gpupart(&["frag", "--cluster", "-o", "svg"], &kc).ok().stdout;
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    assert!(!text.contains("<script") && !text.contains("@font-face") && !text.contains("href=\"http"));
    let rows: Vec<_> = doc.descendants().filter(|e| e.attribute("class") == Some("node")).collect();
    let names: Vec<&str> = rows.iter().map(|r| r.attribute("data-node").unwrap()).collect();
    assert_eq!(names, ["gpu-node-2", "gpu-node-1"], "pools in name order: dedicated, then shared");
    assert!(text.contains("without a gpupart agent: cpu-node"), "{text}");
    // gpu-node-1's bars are its published layout, each instance over its placement (6 px a slice).
    let published: serde_json::Value = serde_json::from_str(&api.state().annotations["gpupart.io/gpus"]).unwrap();
    for g in published.as_array().unwrap() {
        let i = g["i"].as_u64().unwrap().to_string();
        let bar = rows[1].children().find(|e| e.attribute("data-gpu") == Some(i.as_str())).unwrap();
        let drawn = rects_in(bar);
        let layout = g["layout"].as_array().unwrap();
        assert_eq!(drawn.len(), layout.len(), "GPU {i}: {drawn:?}");
        for entry in layout {
            let entry = entry.as_str().unwrap();
            let (profile, start) = entry.trim_end_matches('*').split_once('@').unwrap();
            let start: u64 = start.parse().unwrap();
            let r = drawn.iter().find(|r| r.0 == profile && r.1 == start).expect("drawn");
            let size = [("3g.40gb", 4), ("2g.20gb", 2), ("1g.10gb", 1)].iter().find(|p| p.0 == profile).unwrap().1;
            assert_eq!((r.2, r.3), (start * 6, size * 6), "GPU {i} {entry}: 6 px a slice");
            assert_eq!(r.4, entry.ends_with('*'), "GPU {i} {entry}: hatched when busy");
            let foreign = g["foreign"].as_array().is_some_and(|f| f.iter().any(|f| f == entry.trim_end_matches('*')));
            assert_eq!(r.5, foreign, "GPU {i} {entry}");
            assert_eq!(foreign, profile != "1g.10gb", "GPU {i} {entry}: all-1g.10gb holds only 1g.10gb");
        }
    }
    // Paging: one row a page; a page past the end is refused.
    let second = gpupart(&["frag", "--cluster", "-o", "svg", "--page-size", "1", "--page", "2"], &kc).ok().stdout;
    assert!(second.contains("nodes 2–2 of 2, page 2 of 2") && second.contains("data-node=\"gpu-node-1\""));
    assert!(!second.contains("data-node=\"gpu-node-2\""));
    let past = gpupart(&["frag", "--cluster", "-o", "svg", "--page", "3"], &kc).failed();
    assert!(past.stderr.contains("page 3 does not exist: 2 nodes make 1 page(s) of 200"), "{}", past.stderr);
}
