//! MPS client slots as kubelet devices (pure): ids `<gpu-uuid>::<n>`, the Allocate response for a
//! set of slots on one GPU, and the preferred allocation that packs slots onto the GPU already
//! most in use, so whole GPUs stay free.

use super::api::{ContainerAllocateResponse, Device, Mount};
use crate::mps::MpsSettings;
use std::collections::BTreeMap;

/// `Healthy`, as the kubelet spells it.
pub const HEALTHY: &str = "Healthy";
/// `Unhealthy`.
pub const UNHEALTHY: &str = "Unhealthy";

/// One GPU that serves MPS slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotGpu {
    /// GPU UUID.
    pub uuid: String,
    /// The daemon's settings (`replicas` slots).
    pub settings: MpsSettings,
    /// Host path of the daemon's pipe directory.
    pub pipe_dir: String,
    /// Host path of the shared-memory directory mounted as the clients' `/dev/shm`.
    pub shm_dir: String,
    /// Whether the daemon answers (its slots are advertised unhealthy otherwise).
    pub healthy: bool,
}

/// The id of slot `n` of a GPU.
pub fn slot_id(uuid: &str, n: u32) -> String {
    format!("{uuid}::{n}")
}

/// The GPU UUID and slot number of an id.
pub fn parse_slot_id(id: &str) -> Option<(&str, u32)> {
    let (uuid, n) = id.rsplit_once("::")?;
    Some((uuid, n.parse().ok()?))
}

/// The devices to advertise: every slot of every GPU, with its GPU's health.
pub fn devices(gpus: &[SlotGpu]) -> Vec<Device> {
    gpus.iter()
        .flat_map(|g| {
            (0..g.settings.replicas).map(move |n| Device {
                id: slot_id(&g.uuid, n),
                health: if g.healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: None,
            })
        })
        .collect()
}

/// Builds the response for one container asking for `ids`: they must name slots of one GPU.
/// With k slots the container gets k times the per-slot limits (capped at the whole GPU).
pub fn allocate(gpus: &[SlotGpu], ids: &[String]) -> Result<ContainerAllocateResponse, String> {
    if ids.is_empty() {
        return Err("the request names no MPS slot".into());
    }
    let mut on: Option<&SlotGpu> = None;
    for id in ids {
        let (uuid, n) = parse_slot_id(id).ok_or_else(|| format!("'{id}' is not an MPS slot id (<gpu-uuid>::<n>)"))?;
        let gpu = gpus
            .iter()
            .find(|g| g.uuid == uuid && n < g.settings.replicas)
            .ok_or_else(|| format!("MPS slot '{id}' is not served on this node"))?;
        if let Some(first) = on.filter(|f| f.uuid != gpu.uuid) {
            return Err(format!(
                "the request spans two GPUs ({} and {}); MPS slots of one container must be on one GPU",
                first.uuid, gpu.uuid
            ));
        }
        on = Some(gpu);
    }
    let Some(gpu) = on else { return Err("the request names no MPS slot".into()) };
    let k = ids.len() as u32;
    let mut envs = BTreeMap::new();
    envs.insert("NVIDIA_VISIBLE_DEVICES".to_string(), gpu.uuid.clone());
    envs.insert("CUDA_MPS_PIPE_DIRECTORY".to_string(), gpu.pipe_dir.clone());
    if let Some(pct) = gpu.settings.active_thread_percentage {
        envs.insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(), (pct * k).min(100).to_string());
    }
    if let Some(mib) = gpu.settings.pinned_memory_limit_mib {
        envs.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(), format!("0={}M", mib * u64::from(k)));
    }
    let mounts = vec![
        Mount { container_path: gpu.pipe_dir.clone(), host_path: gpu.pipe_dir.clone(), read_only: false },
        Mount { container_path: "/dev/shm".to_string(), host_path: gpu.shm_dir.clone(), read_only: false },
    ];
    Ok(ContainerAllocateResponse {
        envs: envs.into_iter().collect(),
        mounts,
        devices: Vec::new(),
        annotations: Default::default(),
        cdi_devices: Vec::new(),
    })
}

/// The preferred `size` slots among `available` (including `must`): all on one GPU, the one with
/// the most slots already in use that still has room; lowest slot numbers first.
pub fn preferred(gpus: &[SlotGpu], available: &[String], must: &[String], size: usize) -> Vec<String> {
    let free_on = |uuid: &str| -> Vec<String> {
        let mut v: Vec<(u32, String)> = available
            .iter()
            .filter_map(|id| parse_slot_id(id).filter(|(u, _)| *u == uuid).map(|(_, n)| (n, id.clone())))
            .collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    };
    let forced: Option<&str> = must.iter().find_map(|id| parse_slot_id(id).map(|(u, _)| u));
    let mut best: Option<(u32, usize, &SlotGpu)> = None;
    for g in gpus.iter().filter(|g| g.healthy || forced == Some(g.uuid.as_str())) {
        if forced.is_some_and(|u| u != g.uuid) {
            continue;
        }
        let free = free_on(&g.uuid).len();
        if free < size {
            continue;
        }
        let used = g.settings.replicas.saturating_sub(free as u32);
        // Most used first; then the one with fewer free slots (tighter fit); then node order.
        if best.is_none_or(|(bu, bf, _)| used > bu || (used == bu && free < bf)) {
            best = Some((used, free, g));
        }
    }
    let Some((_, _, g)) = best else { return must.to_vec() };
    let mut out: Vec<String> = must.to_vec();
    for id in free_on(&g.uuid) {
        if out.len() >= size {
            break;
        }
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests;
