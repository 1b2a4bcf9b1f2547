//! Entry points of the fuzz targets (`fuzz/`), one per kind of input that comes from outside the
//! process. Each takes raw bytes, must never panic, and exercises the parser and what consumes its
//! result. `tests/fuzz_regressions.rs` replays the seeds and every input that ever crashed.

use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;
use prost::Message;

fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// A small node to plan configs against (built once per call; cheap).
fn node() -> Vec<crate::observed::GpuState> {
    SimBackend::open(Some("A100-SXM4-80GB:1,A30-24GB:1,V100-SXM2-16GB:1,P100-PCIE-16GB:1"), None)
        .and_then(|b| b.observe_all())
        .unwrap_or_default()
}

/// A mig-parted v1 config file: parse, validate offline, select and plan every config on a node.
pub fn config(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let Ok(file) = crate::config::parse(t) else { return };
    let _ = crate::validate::validate(&file, None, None);
    let states = node();
    for c in &file.configs {
        let _ = crate::prepare::prepare(states.clone(), c, false, false);
    }
}

/// The layout label's value and the config it names: `<label>\n<config text>`.
pub fn layout_label(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let (label, config) = t.split_once('\n').unwrap_or((t, ""));
    let Ok(file) = crate::config::parse(config) else { return };
    if let Ok(c) = file.choose(Some(label)) {
        let _ = crate::prepare::prepare(node(), c, false, false);
    }
}

/// A MIG device or profile name (`1g.10gb`, `1c.3g.40gb+me`), resolved on every catalog model.
pub fn profile_name(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let Ok(name) = t.parse::<crate::mig::ProfileName>() else { return };
    let _ = name.to_string();
    for m in crate::mig::catalog::models() {
        let _ = m.profile_table().resolve(&name);
    }
}

/// A mig-parted hooks file and a GPU-clients file.
pub fn hooks(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let _ = crate::hooks::parse(t);
    let _ = crate::hooks::parse_gpu_clients(t);
}

/// The simulator / fake NVML state file: load, validate, and observe a valid one.
pub fn sim_state(data: &[u8]) {
    let Ok(state) = serde_json::from_slice::<crate::mig::sim::SimState>(data) else { return };
    if state.validate().is_err() {
        return;
    }
    let _ = SimBackend::new(state, None).observe_all();
}

/// The health record file (`--health-file`) and the recovery annotation's value
/// (`<record>\n<value>`): a record that reads writes back to the same record, and describes
/// every entry.
pub fn health_record(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let (record, value) = t.rsplit_once('\n').unwrap_or((t, ""));
    let Ok(book) = crate::health::HealthBook::from_file(record) else { return };
    assert_eq!(crate::health::HealthBook::from_file(&book.to_file()).as_ref(), Ok(&book));
    for (gpu, u) in book.unhealthy() {
        let _ = (crate::gpu_health::describe(*gpu, u), crate::health::taint_value(u));
    }
    for gpu in book.affected() {
        book.mig_faults(gpu).for_each(|m| drop(crate::gpu_health::describe_mig(m)));
    }
    let _ = crate::health::parse_gpus(value, &book);
}

/// The paused-clients annotation read back from the Node: `<annotation>\n<label>=<value>…`.
pub fn paused_annotation(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let mut lines = t.lines();
    let annotation = lines.next().unwrap_or_default();
    let labels = lines.filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let _ = crate::kube::pause::to_restore(annotation, &labels);
}

/// Every kubelet message gpupart decodes, from the same bytes: PodResources `List` answers
/// (mapped onto a node), and the device plugin's requests (answered against slots).
pub fn kubelet_messages(data: &[u8]) {
    use crate::kubelet::api as dp;
    use crate::kubelet::podresources as pr;
    if let Ok(list) = pr::ListPodResourcesResponse::decode(data) {
        let mut states = node();
        let uses = crate::kubelet::allocations::flatten(&list);
        let _ = crate::kubelet::allocations::attach(&mut states, &uses);
    }
    let _ = pr::AllocatableResourcesResponse::decode(data);
    let _ = pr::GetPodResourcesResponse::decode(data);
    let _ = dp::RegisterRequest::decode(data);
    let _ = dp::ListAndWatchResponse::decode(data);
    let slots = [crate::kubelet::slots::SlotGpu {
        uuid: "GPU-0".into(),
        settings: crate::mps::MpsSettings {
            replicas: 4,
            active_thread_percentage: Some(25),
            pinned_memory_limit_mib: Some(1024),
        },
        pipe_dir: "/p".into(),
        shm_dir: "/s".into(),
        healthy: true,
    }];
    if let Ok(req) = dp::AllocateRequest::decode(data) {
        for c in &req.container_requests {
            let _ = crate::kubelet::slots::allocate(&slots, &c.devices_ids);
        }
    }
    if let Ok(req) = dp::PreferredAllocationRequest::decode(data) {
        for c in &req.container_requests {
            let size = usize::try_from(c.allocation_size).unwrap_or(0).min(1024);
            let _ =
                crate::kubelet::slots::preferred(&slots, &c.available_device_i_ds, &c.must_include_device_i_ds, size);
        }
    }
}

/// What a kubelet's gRPC client sends on a plugin socket (the HTTP/2 frames after the preface),
/// through the relay that accepts any `:authority`.
pub fn kubelet_frames(data: &[u8]) {
    let mut stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    stream.extend_from_slice(data);
    let _ = crate::kubelet::authority::relay_bytes(&stream);
}

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// A `gpupart plan` demand file: parse, plan, report and render (small fleets only, so one input
/// stays fast).
pub fn plan_input(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let Ok(input) = crate::fleet::input::parse(t) else { return };
    let replicas: u64 = input.demand.iter().map(|d| u64::from(d.replicas)).sum();
    if input.nodes.len() > 64 || replicas > 2000 {
        return;
    }
    if let Ok(plan) = crate::fleet::plan(&input, &crate::fleet::Options::default()) {
        let doc = crate::fleet::report::report(&input, &plan);
        let _ = crate::fleet::render::kube_yaml(&doc);
        let _ = crate::fleet::render::text(&doc);
        let _ = crate::config::parse(&doc.config);
    }
}

/// Today's layouts for `plan --current` / `--from-cluster`: a file of `status -o json` documents
/// and a `gpupart.io/gpus` annotation, each planned from on a small fixed fleet (the annotation
/// also drawn as the cluster picture's row).
pub fn plan_current(data: &[u8]) {
    let Some(t) = text(data) else { return };
    let fleet = "fleet:\n  - {name: n, count: 2, gpu: A100-SXM4-80GB, gpus: 2}\n\
                 demand:\n  - {name: a, memory: 30Gi, replicas: 2}\n  - {name: e, profile: 1g.10gb, replicas: 3}\n  - {name: tp, gpus: 2}\n";
    let Ok(input) = crate::fleet::input::parse(fleet) else { return };
    let mut todays = Vec::new();
    if let Ok(c) = crate::fleet::current::parse_status_file(t) {
        todays.push(c);
    }
    if let Ok(g) = crate::fleet::current::from_annotation("n-0", t) {
        // The cluster picture draws whatever an annotation holds.
        let frag = gpupart_cluster::frag::NodeEntry {
            name: "n-0".into(),
            ratio: 0.0,
            fragmented_gpus: 0.0,
            unallocated_gpus: 1.0,
            whole_free_gpus: 0,
        };
        let views = [crate::picture::cluster::NodeView { name: "n-0".into(), pool: None, gpus: g.clone(), frag }];
        let totals = gpupart_cluster::frag::ClusterFrag {
            nodes: Vec::new(),
            without_agent: Vec::new(),
            fragmentation_ratio: 0.0,
            fragmented_gpus: 0.0,
            unallocated_gpus: 1.0,
            whole_free_gpus: 0,
        };
        let _ = crate::picture::cluster::render(&views, &totals, crate::picture::cluster::Page { number: 1, size: 1 });
        todays.push(std::iter::once(("n-0".to_string(), g)).collect());
    }
    let _ = crate::fleet::current::holders_from_annotation(t);
    for today in todays {
        if let Ok(plan) = crate::fleet::plan_from(&input, &crate::fleet::Options::default(), &today) {
            let _ = crate::fleet::report::report(&input, &plan);
        }
    }
}

/// Every target by name, for the fuzz binaries and the regression test.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("layout_label", layout_label),
    ("profile_name", profile_name),
    ("hooks", hooks),
    ("sim_state", sim_state),
    ("health_record", health_record),
    ("paused_annotation", paused_annotation),
    ("kubelet_messages", kubelet_messages),
    ("kubelet_frames", kubelet_frames),
    ("plan_input", plan_input),
    ("plan_current", plan_current),
];
