//! The node pipeline end to end on the simulator, without the binary: a config is observed,
//! planned and executed through the backend; a change keeps what it can; busy instances (by a
//! process or by a kubelet allocation) are never destroyed without force; a failed NVML call is
//! reported per GPU and the other GPUs still change.

use gpupart_node::allocations::AllocationSource;
use gpupart_node::backend::sim::SimBackend;
use gpupart_node::backend::GpuBackend;
use gpupart_node::config::{self, ConfigFile};
use gpupart_node::exec::{ExecOptions, Outcome};
use gpupart_node::mig::sim::fault::Faults;
use gpupart_node::mig::sim::SimProcess;
use gpupart_node::observed::{GpuState, PodUse};
use gpupart_node::reconfigure::{self, Options, PassError};

const CONFIG: &str = r#"version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
  keep-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 4, "3g.40gb": 1}
  all-7g:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
"#;

fn file() -> ConfigFile {
    config::parse(CONFIG).expect("the test config parses")
}

fn opts(force: bool) -> Options {
    Options {
        force,
        mode_only: false,
        exec: ExecOptions { dry_run: false, parallel: 2, skip_reset: false, stop: None },
    }
}

fn node(gpus: u32) -> SimBackend {
    SimBackend::open(Some(&format!("A100-SXM4-80GB:{gpus}")), None).expect("simulator")
}

fn apply(b: &dyn GpuBackend, layout: &str, force: bool) -> Result<reconfigure::Pass, PassError> {
    reconfigure::run(b, file().get(layout).expect("layout"), opts(force))
}

/// Per GPU: (profile name, placement start) of every GPU instance, sorted.
fn layout(states: &[GpuState]) -> Vec<Vec<(String, u32)>> {
    states
        .iter()
        .map(|g| {
            let mut v: Vec<(String, u32)> = g
                .instances
                .iter()
                .map(|i| {
                    let p = g.profiles.by_id(i.profile_id).map_or_else(|| "?".to_string(), |p| p.name.to_string());
                    (p, i.placement.start)
                })
                .collect();
            v.sort();
            v
        })
        .collect()
}

fn count(states: &[GpuState], profile: &str) -> usize {
    layout(states).iter().flatten().filter(|(p, _)| p == profile).count()
}

#[test]
fn a_layout_is_applied_from_scratch_on_every_gpu() {
    let b = node(2);
    let pass = apply(&b, "all-balanced", false).expect("applies");
    assert_eq!(pass.failed(), 0);
    assert!(pass.reports.iter().all(|r| r.outcome == Outcome::Applied), "{:?}", pass.reports);
    let after = b.observe_all().unwrap();
    for g in &after {
        assert!(g.mig_mode.current, "MIG mode on");
        assert_eq!(g.instances.len(), 4, "{:?}", layout(&after));
        assert!(g.instances.iter().all(|i| i.cis.len() == 1), "one full compute instance each");
    }
    assert_eq!(count(&after, "1g.10gb"), 4);
    // Applying it again changes nothing.
    let again = apply(&b, "all-balanced", false).expect("applies");
    assert!(again.reports.iter().all(|r| r.outcome == Outcome::Unchanged), "{:?}", again.reports);
}

#[test]
fn a_change_keeps_the_instances_the_new_layout_can_keep() {
    let b = node(1);
    apply(&b, "all-balanced", false).expect("applies");
    let before = b.observe_all().unwrap();
    let three = before[0].instances.iter().find(|i| i.placement.size == 4).expect("the 3g instance").clone();
    let pass = apply(&b, "keep-3g", false).expect("applies");
    let (kept, destroyed, created) = pass.instance_counts();
    assert_eq!((kept, destroyed, created), (3, 1, 2), "the 3g and both 1g stay; the 2g becomes two 1g");
    let after = b.observe_all().unwrap();
    let same = after[0].instances.iter().find(|i| i.id == three.id).expect("the 3g instance is still there");
    assert_eq!(same.cis[0].uuid, three.cis[0].uuid, "same MIG device");
    assert_eq!(count(&after, "1g.10gb"), 4);
}

fn add_process(b: &SimBackend, gpu: usize, gi: usize) -> SimBackend {
    let mut state = b.snapshot();
    state.gpus[gpu].gpu_instances[gi].compute_instances[0].processes.push(SimProcess {
        pid: 4242,
        name: "vllm".into(),
        used_memory_mib: 2048,
    });
    SimBackend::new(state, None)
}

#[test]
fn a_busy_instance_is_never_destroyed_without_force() {
    let b = node(1);
    apply(&b, "all-balanced", false).expect("applies");
    let b = add_process(&b, 0, 0);
    let before = b.observe_all().unwrap();
    let err = apply(&b, "all-7g", false).expect_err("the 7g needs every slice, one is busy");
    let PassError::Prepare(e) = err else { panic!("a prepare error, got {err}") };
    assert!(e.blocked && e.problems.iter().any(|p| p.contains("4242")), "names the process: {:?}", e.problems);
    assert_eq!(layout(&b.observe_all().unwrap()), layout(&before), "nothing changed");
    // With force the plan destroys it; the driver still refuses while the process runs, and
    // that is reported for the GPU, nothing else destroyed before it.
    let forced = apply(&b, "all-7g", true).expect("forced");
    assert_eq!(forced.instance_counts(), (0, 4, 1), "every instance planned away");
    let Outcome::Failed(e) = &forced.reports[0].outcome else { panic!("{:?}", forced.reports) };
    assert!(e.to_string().contains("NVML_ERROR_IN_USE"), "{e}");
    assert_eq!(layout(&b.observe_all().unwrap()), layout(&before), "the busy one went first and was refused");
}

/// A fixed list of kubelet allocations.
struct Allocated(Vec<PodUse>);

impl AllocationSource for Allocated {
    fn read(&self) -> Result<Vec<PodUse>, String> {
        Ok(self.0.clone())
    }
}

#[test]
fn an_instance_allocated_to_a_pod_is_busy_too() {
    let b = node(1);
    apply(&b, "all-balanced", false).expect("applies");
    let before = b.observe_all().unwrap();
    let device = before[0].instances[0].cis[0].uuid.clone();
    let pods = Allocated(vec![PodUse {
        namespace: "serving".into(),
        pod: "llm".into(),
        container: "vllm".into(),
        resource: "nvidia.com/mig-1g.10gb".into(),
        device_id: device,
    }]);
    let config = file();
    let err = reconfigure::run_with(&b, config.get("all-7g").unwrap(), opts(false), None, Some(&pods), &mut |_| Ok(()))
        .expect_err("the allocated instance is in the way");
    assert!(err.to_string().contains("serving/llm"), "names the pod: {err}");
    assert_eq!(layout(&b.observe_all().unwrap()), layout(&before), "nothing changed");
}

#[test]
fn a_failed_nvml_call_fails_its_gpu_only() {
    let b = node(2);
    let faults = Faults::parse("nvmlGpuInstanceCreateComputeInstanceWithPlacement:3:NVML_ERROR_UNKNOWN").unwrap();
    let b = b.with_faults(faults);
    let pass = apply(&b, "all-balanced", false).expect("the pass runs");
    assert_eq!(pass.failed(), 1, "{:?}", pass.reports);
    let failed = pass.reports.iter().find(|r| matches!(r.outcome, Outcome::Failed(_))).unwrap();
    let Outcome::Failed(e) = &failed.outcome else { unreachable!() };
    assert!(e.to_string().contains("NVML_ERROR_UNKNOWN"), "{e}");
    // The next pass completes the failed GPU and leaves the other as it is.
    let again = apply(&b, "all-balanced", false).expect("applies");
    assert_eq!(again.failed(), 0, "{:?}", again.reports);
    assert_eq!(count(&b.observe_all().unwrap(), "3g.40gb"), 2);
}

#[test]
fn disabling_mig_clears_the_gpu() {
    let b = node(1);
    apply(&b, "all-balanced", false).expect("applies");
    apply(&b, "all-disabled", false).expect("applies");
    let after = b.observe_all().unwrap();
    assert!(!after[0].mig_mode.current && after[0].instances.is_empty());
}

#[test]
fn foreign_instances_are_those_the_change_to_a_layout_would_destroy() {
    let b = node(2);
    apply(&b, "all-balanced", false).expect("applied");
    let states = b.observe_all().expect("observed");
    let f = file();
    let foreign = |name: &str| gpupart_node::prepare::foreign(&states, f.get(name).expect("a config"));
    // The layout applied holds everything; keep-3g keeps the 3g and two 1g, not the 2g; all-7g and
    // all-disabled hold nothing of it.
    assert!(foreign("all-balanced").is_empty());
    let starts = |gpu: usize, profile: &str| -> Vec<u32> {
        states[gpu].instances.iter().filter(|g| states[gpu].gi_name(g) == profile).map(|g| g.placement.start).collect()
    };
    for gpu in 0..2u32 {
        assert_eq!(foreign("keep-3g")[&gpu], starts(gpu as usize, "2g.20gb"), "GPU {gpu}");
        let mut all: Vec<u32> = states[gpu as usize].instances.iter().map(|g| g.placement.start).collect();
        let mut seven = foreign("all-7g")[&gpu].clone();
        let mut off = foreign("all-disabled")[&gpu].clone();
        all.sort_unstable();
        seven.sort_unstable();
        off.sort_unstable();
        assert_eq!((&seven, &off), (&all, &all), "GPU {gpu}");
    }
}
