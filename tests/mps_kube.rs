//! A mixed node end to end in Kubernetes mode (both backends): 2×A100 with MIG and 2×V100 with
//! MPS. The agent applies the layout, starts the daemons, registers its device plugin with a fake
//! kubelet over real unix sockets, advertises `<gpu-uuid>::<n>` slots, answers Allocate and
//! GetPreferredAllocation, retires removed slots (unhealthy first), registers again after a kubelet
//! restart, and labels and annotates the node.

#[macro_use]
mod support;

use support::apiserver::ApiServer;
use support::kube_agent::{start_config, wait_event, wait_state, LAYOUT, NODE};
use support::kubelet::FakeKubelet;
use support::{Backend, Node};

on_both_backends!(mixed_node_serves_mig_and_mps_slots);

const CONFIG: &str = r#"version: v1
mig-configs:
  mixed:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
    - devices: [2]
      mig-enabled: false
      mps: {replicas: 4, active-thread-percentage: 25, pinned-memory-limit: 7G}
    - devices: [3]
      mig-enabled: false
      mps: {replicas: 2}
  fewer:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
    - devices: [2]
      mig-enabled: false
      mps: {replicas: 4, active-thread-percentage: 25, pinned-memory-limit: 7G}
    - devices: [3]
      mig-enabled: false
"#;

fn mixed_node_serves_mig_and_mps_slots(b: Backend) {
    let node = Node::with(b, "A100-SXM4-80GB:2,V100-SXM2-32GB:2");
    let api = ApiServer::start(NODE);
    let kubelet = FakeKubelet::start(&node.dir.path().join("device-plugins"));
    let cfg = node.config("mixed.yaml", CONFIG);
    api.label(LAYOUT, Some("mixed"));
    let pods = support::pod_resources::FakePodResources::start(&node.pod_resources_socket());
    let port = support::baremetal::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _agent = start_config(
        &node,
        &api,
        &cfg,
        &[
            "--annotation-min-interval",
            "100ms",
            "--slot-retire-grace",
            "500ms",
            "--mps-health-interval",
            "200ms",
            "--metrics-interval",
            "200ms",
            "--metrics-addr",
            &addr,
        ],
        &[],
    );
    wait_state(&api, "success", "mixed");
    let status = node.status();
    let uuid = |i: usize| status["gpus"][i]["uuid"].as_str().unwrap().to_string();
    let (v0, v1) = (uuid(2), uuid(3));
    assert_eq!(status["gpus"][0]["instances"].as_array().unwrap().len(), 2);
    assert_eq!(status["gpus"][2]["mps"]["up"], true);

    // Registration as the kubelet sees it.
    let devices = kubelet.wait_devices("6 healthy slots", |d| d.len() == 6 && d.iter().all(|(_, h)| h == "Healthy"));
    {
        let seen = kubelet.seen.lock().unwrap();
        let r = &seen.registrations[0];
        assert_eq!(
            (r.version.as_str(), r.endpoint.as_str(), r.resource_name.as_str()),
            ("v1beta1", "gpupart-mps.sock", "gpupart.io/mps")
        );
        let o = seen.options.as_ref().unwrap();
        assert!(o.get_preferred_allocation_available && !o.pre_start_required);
    }
    let ids: Vec<&str> = devices.iter().map(|(id, _)| id.as_str()).collect();
    for n in 0..4 {
        assert!(ids.contains(&format!("{v0}::{n}").as_str()), "{ids:?}");
    }
    assert!(ids.contains(&format!("{v1}::1").as_str()) && !ids.contains(&format!("{v1}::2").as_str()));

    // Allocate one slot.
    let slot = format!("{v0}::1");
    let r = kubelet.allocate(&[&slot]).unwrap();
    let c = &r.container_responses[0];
    let pipe = node.mps_dir(&v0).join("pipe").display().to_string();
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], v0);
    assert_eq!(c.envs["CUDA_MPS_PIPE_DIRECTORY"], pipe);
    assert_eq!(c.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(c.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=7168M");
    let mounts: Vec<(&str, &str)> =
        c.mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.as_str())).collect();
    let shm = node.mps_dir(&v0).join("shm").display().to_string();
    assert_eq!(mounts, [(pipe.as_str(), pipe.as_str()), ("/dev/shm", shm.as_str())]);
    println!("Allocate({slot}) = envs {:?}, mounts {mounts:?}", c.envs);
    // The kubelet reports the slot allocated (PodResources): metrics and fragmentation count it.
    pods.set(vec![("serving", "small", "llm", "gpupart.io/mps".to_string(), slot.clone())]);
    let want = format!("gpupart_mps_slots{{uuid=\"{v0}\",state=\"allocated\"}} 1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !support::http_get(port, "/metrics").contains(&want) {
        assert!(std::time::Instant::now() < deadline, "no {want}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    pods.set(vec![]);
    // Spanning two GPUs is refused with a message the pod's events show.
    let e = kubelet.allocate(&[&format!("{v0}::0"), &format!("{v1}::0")]).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("spans two GPUs"), "{}", e.message());
    // Packing: with one slot of GPU 3 in use, a one-slot request goes there, not to the idle GPU 2.
    let available: Vec<String> = ids.iter().filter(|id| **id != format!("{v1}::0")).map(|s| s.to_string()).collect();
    assert_eq!(kubelet.preferred(&available, 1), [format!("{v1}::1")]);

    // Node label and summary.
    let wait_label = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let s = api.state();
            if s.labels.get("gpupart.io/mps").map(String::as_str) == Some("true") {
                return s.annotations.get("gpupart.io/gpus").cloned().unwrap_or_default();
            }
            assert!(std::time::Instant::now() < deadline, "no gpupart.io/mps label: {:?}", s.labels);
            drop(s);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let gpus: serde_json::Value = serde_json::from_str(&wait_label()).unwrap();
    assert_eq!(gpus[2]["mode"], "mps");
    assert_eq!(gpus[2]["slots"], 4);
    assert_eq!(gpus[3]["slots"], 2);
    assert_eq!(gpus[0]["mode"], "mig");

    // A layout change that drops GPU 3's slots: they turn unhealthy first, then vanish.
    api.label(LAYOUT, Some("fewer"));
    wait_state(&api, "success", "fewer");
    let gone = format!("{v1}::0");
    kubelet.wait_devices("GPU 3 slots gone", |d| d.len() == 4 && !d.iter().any(|(id, _)| *id == gone));
    let lists = kubelet.seen.lock().unwrap().lists.clone();
    let retiring = lists.iter().position(|l| l.iter().any(|d| d.id == gone && d.health == "Unhealthy"));
    let vanished = lists.iter().rposition(|l| l.len() == 4);
    assert!(retiring.is_some_and(|r| vanished.is_some_and(|v| r < v)), "unhealthy before removal: {lists:?}");
    assert_eq!(node.mps_pid(&v1), None, "GPU 3's daemon stopped");
    assert!(kubelet.allocate(&[&gone]).unwrap_err().message().contains("is not served"));

    // A daemon killed under the agent is restarted and announced with an Event.
    let pid = node.mps_pid(&v0).unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let note = wait_event(&api, "MpsDaemonRestarted", &v0);
    assert!(note.contains("it died"), "{note}");
    assert_ne!(node.mps_pid(&v0), Some(pid));
    kubelet.wait_devices("healthy slots after the restart", |d| d.iter().all(|(_, h)| h == "Healthy"));

    // The kubelet restarts: the plugin registers again and sends its slots again.
    let before = kubelet.registrations();
    let mut kubelet = kubelet;
    kubelet.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while kubelet.registrations() == before {
        assert!(std::time::Instant::now() < deadline, "no re-registration after the kubelet restarted");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let n = kubelet.seen.lock().unwrap().lists.len();
    kubelet.wait_devices("slots after re-registration", |d| d.len() == 4);
    assert!(kubelet.seen.lock().unwrap().lists.len() > n || kubelet.devices().len() == 4);
    assert!(kubelet.allocate(&[&slot]).is_ok());
}
