//! The node's NVML event source on both backends: the simulator's, and NVML through nvml-wrapper
//! on the fake libnvidia-ml (the real code path), with XID and ECC events injected into the state
//! file. Only events injected after the first wait are seen, in order, with their GPU, XID and MIG
//! instance; a wait with nothing new returns none after its timeout.

mod support;

use gpupart::backend::GpuBackend;
use gpupart::health::{EventKind, GpuEvent};
use std::time::{Duration, Instant};
use support::{Backend, Node};

fn kinds(b: &dyn GpuBackend, node: &Node) -> Vec<GpuEvent> {
    node.inject_event(1, 0x8, 31, None); // before the first wait: not seen
    let t = Instant::now();
    assert_eq!(b.next_event(Duration::from_millis(80)).unwrap(), None, "{}", b.describe());
    assert!(t.elapsed() >= Duration::from_millis(80));
    node.inject_event(1, 0x8, 79, None);
    node.inject_event(0, 0x2, 0, None);
    node.inject_event(1, 0x8, 94, Some((3, 0)));
    node.inject_event(1, 0x1, 0, None);
    let mut got = Vec::new();
    while let Some(e) = b.next_event(Duration::from_millis(500)).unwrap() {
        got.push(e);
    }
    got
}

/// (GPU, what, MIG instance).
type Seen = (u32, EventKind, Option<(u32, u32)>);

fn check(got: &[GpuEvent]) {
    let seen: Vec<Seen> = got.iter().map(|e| (e.gpu, e.kind, e.instance)).collect();
    assert_eq!(
        seen,
        vec![
            (1, EventKind::Xid(79), None),
            (0, EventKind::DoubleBitEcc, None),
            (1, EventKind::Xid(94), Some((3, 0))),
            (1, EventKind::SingleBitEcc, None),
        ]
    );
}

#[test]
fn events_come_in_order_from_the_simulator_and_from_nvml_on_the_fake() {
    let sim_node = Node::with(Backend::Sim, "A100-SXM4-80GB:2");
    let sim = gpupart::backend::sim::SimBackend::open(None, Some(&sim_node.state)).unwrap();
    check(&kinds(&sim, &sim_node));

    let node = Node::with(Backend::Nvml, "A100-SXM4-80GB:2");
    std::env::set_var("FAKE_NVML_STATE", &node.state);
    let (lib, smi) = support::fake_nvml();
    let nvml = gpupart::backend::nvml::NvmlBackend::open(Some(&lib), Some(&smi)).unwrap();
    check(&kinds(&nvml, &node));
}
