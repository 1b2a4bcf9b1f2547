//! NVIDIA's device plugin (k8s-device-plugin, built from its source) runs its NVML health checks
//! on the fake libnvidia-ml: it registers the simulated GPUs with the fake kubelet, creates its
//! event set, and turns a GPU Unhealthy on an injected XID 79 (XID 43 it ignores), and one MIG
//! device Unhealthy on an XID naming its GPU and compute instance (`--mig-strategy mixed`).
//!
//! Not run by `cargo test`: it needs NVIDIA's binary and the kubelet's device-plugin directory,
//! where that plugin always puts its socket. Run by hand, as root:
//! `NVIDIA_DEVICE_PLUGIN=/path/to/nvidia-device-plugin cargo test --test nvidia_device_plugin -- --ignored --test-threads 1`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::kubelet::FakeKubelet;
use support::{Backend, Node};

/// The kubelet's device-plugin directory (NVIDIA's plugin's socket path is fixed there).
const DIR: &str = "/var/lib/kubelet/device-plugins";

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn plugin_binary() -> PathBuf {
    let p = std::env::var_os("NVIDIA_DEVICE_PLUGIN")
        .map(PathBuf::from)
        .expect("set NVIDIA_DEVICE_PLUGIN to NVIDIA's nvidia-device-plugin binary");
    assert!(p.exists(), "{} does not exist", p.display());
    p
}

/// Starts NVIDIA's plugin on `node`'s fake GPUs, its log in the node's directory. With MIG it
/// also reads the driver's MIG capability minors (`/proc/driver/nvidia-caps/mig-minors`): the
/// plugin then runs in its own mount namespace with that file on a tmpfs over `/proc/driver`.
fn start(node: &Node, args: &[&str]) -> Plugin {
    let lib_dir = node.dir.path().join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let (lib, _) = support::fake_nvml();
    let _ = std::fs::remove_file(lib_dir.join("libnvidia-ml.so.1"));
    std::os::unix::fs::symlink(lib, lib_dir.join("libnvidia-ml.so.1")).unwrap();
    let log = std::fs::File::create(node.dir.path().join("plugin.log")).unwrap();
    let mut minors = String::from("config 1\nmonitor 2\n");
    for g in 0..node.load().gpus.len() {
        for gi in 0..16 {
            minors.push_str(&format!("gpu{g}/gi{gi}/access {}\n", 3 + 200 * g + 9 * gi));
            for ci in 0..8 {
                minors.push_str(&format!("gpu{g}/gi{gi}/ci{ci}/access {}\n", 4 + 200 * g + 9 * gi + ci));
            }
        }
    }
    std::fs::write(node.dir.path().join("mig-minors"), minors).unwrap();
    let script = "mount -t tmpfs none /proc/driver && mkdir -p /proc/driver/nvidia-caps && \
                  cp \"$MINORS\" /proc/driver/nvidia-caps/mig-minors && exec \"$@\"";
    let child = std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", script, "sh"])
        .arg(plugin_binary())
        .env("MINORS", node.dir.path().join("mig-minors"))
        .args(["--kubelet-socket", &format!("{DIR}/kubelet.sock")])
        .args(args)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env("FAKE_NVML_STATE", &node.state)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Plugin(child)
}

/// The health of `id` in the last list that has it.
fn health(k: &FakeKubelet, id: &str) -> Option<String> {
    let seen = k.seen.lock().unwrap();
    seen.lists.iter().rev().find_map(|l| l.iter().find(|d| d.id == id).map(|d| d.health.clone()))
}

fn wait_health(k: &FakeKubelet, id: &str, want: &str, log: &Path) -> Duration {
    let t = Instant::now();
    while health(k, id).as_deref() != Some(want) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{id} never {want}; plugin log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

#[test]
#[ignore = "needs NVIDIA's nvidia-device-plugin binary and /var/lib/kubelet/device-plugins (see the module doc)"]
fn nvidia_device_plugin_health_checks_run_on_the_fake() {
    let kubelet = FakeKubelet::start(Path::new(DIR));
    let node = Node::with(Backend::Nvml, "V100-SXM2-32GB:2");
    let log = node.dir.path().join("plugin.log");
    let _plugin = start(&node, &[]);
    let uuid = |i: usize| node.load().gpus[i].uuid.clone();
    let (g0, g1) = (uuid(0), uuid(1));
    wait_health(&kubelet, &g0, "Healthy", &log);
    wait_health(&kubelet, &g1, "Healthy", &log);
    // Its health check makes its event set after the first list.
    let t = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("Ignoring the following XIDs") {
        assert!(t.elapsed() < Duration::from_secs(10), "no health check started");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    node.inject_xid(0, 43, None);
    let t = node.inject_xid(1, 79, None);
    let took = t.elapsed() + wait_health(&kubelet, &g1, "Unhealthy", &log);
    println!("XID 79 → Unhealthy at the kubelet through NVIDIA's device plugin in {took:?}");
    assert_eq!(health(&kubelet, &g0).as_deref(), Some("Healthy"), "XID 43 is ignored");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("XidCriticalError: Xid=79"), "{text}");
    assert!(text.contains("Skipping event") && text.contains("EventData:43"), "{text}");
}

#[test]
#[ignore = "needs NVIDIA's nvidia-device-plugin binary and /var/lib/kubelet/device-plugins (see the module doc)"]
fn nvidia_device_plugin_fences_only_the_mig_device_an_event_names() {
    let kubelet = FakeKubelet::start(Path::new(DIR));
    let node = Node::with(Backend::Nvml, "A100-SXM4-80GB:1");
    node.run(&["apply", "-f", &support::example_config(), "-c", "all-balanced"]).ok();
    let log = node.dir.path().join("plugin.log");
    let _plugin = start(&node, &["--mig-strategy", "mixed"]);
    // The MIG devices as `status` names them: (profile, GI id, CI id, uuid).
    let devices: Vec<(String, u32, u32, String)> = node.status()["gpus"][0]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let n = |k: &str| i[k].as_u64().unwrap() as u32;
            (
                i["profile"].as_str().unwrap().to_string(),
                n("gpu_instance_id"),
                n("compute_instance_id"),
                i["uuid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (_, _, _, uuid) in &devices {
        wait_health(&kubelet, uuid, "Healthy", &log);
    }
    // The 3g.40gb is the only device of its resource (NVIDIA's plugin watches, per resource, one
    // MIG device per parent GPU: events naming the others of the same resource are dropped).
    let (_, gi, ci, faulty) = devices.iter().find(|d| d.0 == "3g.40gb").cloned().unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("Ignoring the following XIDs") {
        assert!(t.elapsed() < Duration::from_secs(10), "no health check started");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    node.inject_xid(0, 94, Some((gi, ci)));
    wait_health(&kubelet, &faulty, "Unhealthy", &log);
    for (profile, _, _, uuid) in devices.iter().filter(|d| d.3 != faulty) {
        assert_eq!(
            health(&kubelet, uuid).as_deref(),
            Some("Healthy"),
            "{profile}: only the MIG device the event names"
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("GpuInstanceId:{gi} ComputeInstanceId:{ci}")),
        "the instance ids as go-nvml reads them"
    );
}
