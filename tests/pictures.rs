//! `gpupart status -o svg` end to end on both backends: a well-formed, self-contained SVG whose
//! instance rectangles span exactly the placements `status -o json` reports, busy ones marked.

#[macro_use]
mod support;

use support::{example_config, Backend, Node};

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
