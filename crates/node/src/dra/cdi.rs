//! Container Device Interface specs for prepared claims (pure): one spec per claim whose devices
//! give a container the parent GPU's device node, the control and UVM nodes, a MIG device's two
//! capability nodes (from `/proc/driver/nvidia-caps/mig-minors`) and `NVIDIA_VISIBLE_DEVICES`.
//! An MPS share also gets its daemon's pipe directory and shared memory mounted and the
//! environment that holds its client to the share: `CUDA_MPS_PIPE_DIRECTORY`,
//! `CUDA_MPS_LOG_DIRECTORY`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (this GPU's UUID at the share's
//! memory) and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.

use super::checkpoint::PreparedDevice;
use super::devices::DeviceKind;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The CDI vendor/class of gpupart's devices.
pub const KIND: &str = "k8s.gpu.gpupart.io/claim";
/// The CDI spec version written.
pub const CDI_VERSION: &str = "0.6.0";

/// Capability minors from the `mig-minors` file: (gpu minor, gi, ci or none) → minor, and the
/// file they were read from (named when a minor is missing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    map: BTreeMap<(u32, u32, Option<u32>), u32>,
    source: Option<std::path::PathBuf>,
}

impl MigMinors {
    /// Reads `gpu<G>/gi<I>/access <minor>` and `gpu<G>/gi<I>/ci<C>/access <minor>` lines (others,
    /// such as `config` and `monitor`, are skipped).
    pub fn parse(text: &str) -> Self {
        let mut map = BTreeMap::new();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(path), Some(minor)) = (words.next(), words.next()) else { continue };
            let Ok(minor) = minor.parse::<u32>() else { continue };
            let parts: Vec<&str> = path.split('/').collect();
            let num = |p: &str, prefix: &str| p.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
            match parts.as_slice() {
                [g, i, "access"] => {
                    if let (Some(g), Some(i)) = (num(g, "gpu"), num(i, "gi")) {
                        map.insert((g, i, None), minor);
                    }
                }
                [g, i, c, "access"] => {
                    if let (Some(g), Some(i), Some(c)) = (num(g, "gpu"), num(i, "gi"), num(c, "ci")) {
                        map.insert((g, i, Some(c)), minor);
                    }
                }
                _ => {}
            }
        }
        Self { map, source: None }
    }

    /// Reads the file at `path` (one that cannot be read lists nothing), remembering it for the
    /// error of a missing minor.
    pub fn read(path: &std::path::Path) -> Self {
        let mut m = Self::parse(&std::fs::read_to_string(path).unwrap_or_default());
        m.source = Some(path.to_path_buf());
        m
    }

    /// Whether it lists an access minor for some GPU instance of the GPU of minor `gpu_minor`.
    pub fn covers(&self, gpu_minor: u32) -> bool {
        self.map.keys().any(|(g, _, _)| *g == gpu_minor)
    }

    /// A file for simulated GPUs, which have no NVIDIA driver to write one: the driver's lines
    /// (`config`, `monitor`, then per GPU minor each GPU instance's access and its compute
    /// instances'), numbered in that order.
    pub fn simulated(gpu_minors: &[u32]) -> String {
        let mut out = String::from("config 1\nmonitor 2\n");
        let mut next = 3;
        for g in gpu_minors {
            for gi in 0..15 {
                out.push_str(&format!("gpu{g}/gi{gi}/access {next}\n"));
                next += 1;
                for ci in 0..8 {
                    out.push_str(&format!("gpu{g}/gi{gi}/ci{ci}/access {next}\n"));
                    next += 1;
                }
            }
        }
        out
    }

    /// The access minor of a GPU instance (`ci` none) or compute instance.
    pub fn get(&self, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
        self.map.get(&(gpu_minor, gi, ci)).copied()
    }
}

/// The CDI device name of a claim's device.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI id of a claim's device.
pub fn device_id(claim_uid: &str, device: &str) -> String {
    format!("{KIND}={}", device_name(claim_uid, device))
}

/// The spec file's name for a claim.
pub fn file_name(claim_uid: &str) -> String {
    format!("{}_{claim_uid}.json", KIND.replace('/', "-"))
}

fn node(path: &str) -> Value {
    json!({"path": path, "hostPath": path, "permissions": "rw"})
}

fn mount(path: &str, container: &str) -> Value {
    json!({"hostPath": path, "containerPath": container, "options": ["rw", "bind"]})
}

/// The container edits of an MPS share whose daemon lives in `paths`.
fn share_edits(d: &PreparedDevice, paths: &crate::mps::DaemonPaths) -> Result<(Vec<String>, Vec<Value>), String> {
    let share = d.share.as_ref().ok_or_else(|| format!("device {} has no share recorded", d.device))?;
    let (pipe, log, shm) =
        (paths.pipe().display().to_string(), paths.log().display().to_string(), paths.shm().display().to_string());
    let mib = (share.memory_bytes >> 20).max(1);
    let env = vec![
        format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"),
        format!("CUDA_MPS_LOG_DIRECTORY={log}"),
        format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={}={mib}M", paths.gpu_uuid),
        format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={}", share.thread_percentage),
        format!("GPUPART_MPS_SHARE={}", share.id),
    ];
    Ok((env, vec![mount(&pipe, &pipe), mount(&log, &log), mount(&shm, "/dev/shm")]))
}

/// The spec for a claim's devices; `gpu_minor(gpu index)` gives `/dev/nvidia<minor>`, `mps_root`
/// where MPS daemons live (`--mps-root`). Errors name a MIG device whose capability minors the
/// file does not list, or a share without MPS.
pub fn spec(
    claim_uid: &str,
    devices: &[PreparedDevice],
    gpu_minor: impl Fn(u32) -> u32,
    minors: &MigMinors,
    mps_root: Option<&std::path::Path>,
) -> Result<Value, String> {
    let mut out = Vec::new();
    for d in devices {
        let minor = gpu_minor(d.gpu);
        let mut nodes = vec![node(&format!("/dev/nvidia{minor}"))];
        if let DeviceKind::Mig { .. } = d.kind {
            let (Some(gi), Some(ci)) = (d.gi, d.ci) else {
                return Err(format!("device {} has no instance yet", d.device));
            };
            for (what, m) in
                [("GPU instance", minors.get(minor, gi, None)), ("compute instance", minors.get(minor, gi, Some(ci)))]
            {
                let m = m.ok_or_else(|| {
                    let from = minors.source.as_ref().map(|p| format!(" in {} (--nvidia-caps-minors)", p.display()));
                    format!(
                        "no capability minor for the {what} of {} (gpu{minor}/gi{gi}){}",
                        d.device,
                        from.unwrap_or_default()
                    )
                })?;
                nodes.push(node(&format!("/dev/nvidia-caps/nvidia-cap{m}")));
            }
        }
        let uuid = d.uuid.clone().unwrap_or_default();
        let mut env = vec![format!("NVIDIA_VISIBLE_DEVICES={uuid}")];
        let mut edits = json!({"deviceNodes": nodes});
        if d.kind == DeviceKind::Mps {
            let root = mps_root.ok_or_else(|| format!("device {} is an MPS share but MPS is not set up", d.device))?;
            let (more, mounts) = share_edits(d, &crate::mps::DaemonPaths::new(root, &d.gpu_uuid))?;
            env.extend(more);
            edits["mounts"] = json!(mounts);
        }
        edits["env"] = json!(env);
        out.push(json!({"name": device_name(claim_uid, &d.device), "containerEdits": edits}));
    }
    Ok(json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": out,
        "containerEdits": {
            "deviceNodes": [node("/dev/nvidiactl"), node("/dev/nvidia-uvm"), node("/dev/nvidia-uvm-tools")],
        },
    }))
}
