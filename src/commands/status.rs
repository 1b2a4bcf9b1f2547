//! `gpupart status`: per GPU, the MIG mode, instances and free capacity, as a table or as the
//! stable JSON schema documented in docs/status-json.md.

use crate::backend::open as open_backend;
use crate::cli::{GpuOptions, NodeFormat, StatusArgs};
use crate::mig::capacity::Occupancy;
use crate::mig::Placement;
use crate::observed::{GpuState, MigMode, Process};
use anyhow::Context;
use serde::Serialize;
use std::fmt::Write as _;
use std::process::ExitCode;

/// `status -o json` document.
#[derive(Debug, Serialize)]
pub struct StatusDoc {
    /// Schema version of this document.
    pub schema_version: u32,
    /// True when the GPUs are simulated (`--simulate`/`--sim-state`): nothing here is real.
    pub simulated: bool,
    /// The kubelet's PodResources, as read for this document (null when not read).
    pub pod_resources: Option<crate::kubelet::pod_resources::SourceStatus>,
    /// One entry per GPU.
    pub gpus: Vec<GpuStatus>,
}

/// One GPU in `status -o json`.
#[derive(Debug, Serialize)]
pub struct GpuStatus {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Model id.
    pub model: String,
    /// NVML name.
    pub name: String,
    /// PCI bus id.
    pub bus_id: String,
    /// Whether MIG is supported.
    pub mig_capable: bool,
    /// MIG mode.
    pub mig_mode: MigMode,
    /// One entry per MIG device (compute instance); a GI without CIs appears once with nulls.
    pub instances: Vec<InstanceStatus>,
    /// Free capacity (MIG GPUs only).
    pub free: Option<FreeStatus>,
    /// Processes outside MIG instances.
    pub processes: Vec<Process>,
    /// Fragmentation figures (docs/fragmentation.md), against the default workload mix.
    pub fragmentation: crate::frag::GpuFrag,
    /// Compute mode (`default`, `exclusive_process`, …).
    pub compute_mode: crate::observed::ComputeMode,
    /// Containers the kubelet allocated the whole GPU or its MPS slots to.
    pub pods: Vec<crate::observed::PodUse>,
    /// The GPU's MPS control daemon, when one runs or gpupart configured one (else null).
    pub mps: Option<MpsStatus>,
    /// Why the agent fenced the GPU (its health record, docs/health.md), else null.
    pub unhealthy: Option<crate::health::Unhealthy>,
    /// The MIG devices of the GPU an NVML event named as faulty (their slices are fenced).
    pub unhealthy_mig_devices: Vec<crate::health::MigFault>,
}

/// One GPU's MPS daemon in `status -o json`: the daemon as read (pid, up, limits read back,
/// servers, clients, error) plus what gpupart configured.
#[derive(Debug, Serialize)]
pub struct MpsStatus {
    /// The daemon as read.
    #[serde(flatten)]
    pub daemon: crate::mps::daemon::DaemonStatus,
    /// Client slots gpupart configured (null when gpupart did not start it).
    pub replicas: Option<u32>,
    /// The pipe directory clients use (`CUDA_MPS_PIPE_DIRECTORY`).
    pub pipe_directory: String,
}

/// The MPS part of `status` for one GPU, from its daemon as read.
pub fn mps_status(mps: &crate::mps::Mps, state: &GpuState, st: crate::mps::daemon::DaemonStatus) -> MpsStatus {
    let pipe_directory = mps.paths(&state.info.uuid).pipe().display().to_string();
    MpsStatus { replicas: st.settings.map(|s| s.replicas), pipe_directory, daemon: st }
}

/// One MIG device in `status -o json`.
#[derive(Debug, Serialize)]
pub struct InstanceStatus {
    /// MIG device profile name (`3g.40gb`, `1c.3g.40gb`).
    pub profile: String,
    /// GPU-instance profile name.
    pub gpu_instance_profile: String,
    /// GI placement in memory slices.
    pub placement: Placement,
    /// GI id.
    pub gpu_instance_id: u32,
    /// CI id (null for a GI without CIs).
    pub compute_instance_id: Option<u32>,
    /// `MIG-…` UUID (null for a GI without CIs).
    pub uuid: Option<String>,
    /// Whether processes use it or the kubelet allocated it to a pod.
    pub busy: bool,
    /// Those processes.
    pub processes: Vec<Process>,
    /// Containers the kubelet allocated it to (PodResources).
    pub pods: Vec<crate::observed::PodUse>,
}

/// Free capacity of a MIG GPU.
#[derive(Debug, Serialize)]
pub struct FreeStatus {
    /// Free memory slices.
    pub memory_slices: u32,
    /// Free compute slices.
    pub compute_slices: u32,
    /// Free memory slices no creatable profile can use.
    pub stranded_memory_slices: u32,
    /// Largest profile that can be created now.
    pub largest_creatable: Option<String>,
    /// Instances creatable now per GI profile.
    pub creatable: serde_json::Map<String, serde_json::Value>,
}

/// Builds the status document from observed GPUs (and their MPS daemons, when `mps` is given).
pub fn status_doc(states: &[GpuState], mps: Option<&crate::mps::Mps>) -> StatusDoc {
    let daemons: Vec<_> = states.iter().map(|s| mps.and_then(|m| m.observe(s))).collect();
    let frags = crate::frag::node_gpu_frags(states, &daemons, None);
    let gpus = states
        .iter()
        .zip(daemons.into_iter().zip(frags))
        .map(|(s, (daemon, fragmentation))| {
            let mut instances = Vec::new();
            for gi in &s.instances {
                let gi_name = s.gi_name(gi);
                let profile = s.profiles.by_id(gi.profile_id);
                if gi.cis.is_empty() {
                    instances.push(InstanceStatus {
                        profile: gi_name.clone(),
                        gpu_instance_profile: gi_name.clone(),
                        placement: gi.placement,
                        gpu_instance_id: gi.id,
                        compute_instance_id: None,
                        uuid: None,
                        busy: gi.busy(),
                        processes: gi.processes.clone(),
                        pods: Vec::new(),
                    });
                }
                for ci in &gi.cis {
                    let procs: Vec<Process> = gi.processes.iter().chain(&ci.processes).cloned().collect();
                    instances.push(InstanceStatus {
                        profile: profile.map_or_else(|| gi_name.clone(), |p| p.device_name(ci.profile_id).to_string()),
                        gpu_instance_profile: gi_name.clone(),
                        placement: gi.placement,
                        gpu_instance_id: gi.id,
                        compute_instance_id: Some(ci.id),
                        uuid: Some(ci.uuid.clone()),
                        busy: !procs.is_empty() || !ci.pods.is_empty(),
                        processes: procs,
                        pods: ci.pods.clone(),
                    });
                }
            }
            instances.sort_by_key(|i| (i.placement.start, i.gpu_instance_id, i.compute_instance_id));
            let free = (s.info.mig_capable && s.mig_mode.current).then(|| {
                let occ = Occupancy::of(&s.profiles, s.instances.iter().map(|g| (g.profile_id, g.placement)));
                FreeStatus {
                    memory_slices: occ.free_memory_slices(&s.profiles),
                    compute_slices: occ.free_compute_slices(&s.profiles),
                    stranded_memory_slices: occ.stranded_slices(&s.profiles),
                    largest_creatable: occ.largest_creatable(&s.profiles).map(|p| p.name.to_string()),
                    creatable: s
                        .profiles
                        .profiles
                        .iter()
                        .map(|p| (p.name.to_string(), occ.remaining_capacity(&s.profiles, p).into()))
                        .collect(),
                }
            });
            GpuStatus {
                index: s.info.index,
                uuid: s.info.uuid.clone(),
                model: s.info.model.clone(),
                name: s.info.name.clone(),
                bus_id: s.info.bus_id.clone(),
                mig_capable: s.info.mig_capable,
                mig_mode: s.mig_mode,
                instances,
                free,
                processes: s.processes.clone(),
                fragmentation,
                compute_mode: s.compute_mode,
                pods: s.pods.clone(),
                mps: mps.zip(daemon).map(|(m, d)| mps_status(m, s, d)),
                unhealthy: None,
                unhealthy_mig_devices: Vec::new(),
            }
        })
        .collect();
    StatusDoc { schema_version: 1, simulated: false, pod_resources: None, gpus }
}

fn table(doc: &StatusDoc) -> String {
    let mut out = String::new();
    let word = |on: bool| if on { "enabled" } else { "disabled" };
    for g in &doc.gpus {
        let mode = if !g.mig_capable {
            "MIG not supported".to_string()
        } else if g.mig_mode.current == g.mig_mode.pending {
            format!("MIG {}", word(g.mig_mode.current))
        } else {
            format!("MIG {} (pending {})", word(g.mig_mode.current), word(g.mig_mode.pending))
        };
        let _ = writeln!(out, "GPU {}  {}  {}  {}  {}", g.index, g.model, g.uuid, g.bus_id, mode);
        if let Some(u) = &g.unhealthy {
            let _ = writeln!(
                out,
                "  UNHEALTHY: {} (gpupart health --recover {})",
                crate::gpu_health::describe(g.index, u),
                g.index
            );
        }
        for m in &g.unhealthy_mig_devices {
            let _ = writeln!(
                out,
                "  UNHEALTHY: {} (gpupart health --recover {})",
                crate::gpu_health::describe_mig(m),
                g.index
            );
        }
        if !g.instances.is_empty() {
            let _ = writeln!(out, "  {:<18} {:>3} {:>3}  {:<40}  BUSY", "INSTANCE", "GI", "CI", "UUID");
            for i in &g.instances {
                let busy = if i.busy {
                    let mut users: Vec<String> = i.processes.iter().map(|p| format!("pid {}", p.pid)).collect();
                    users.extend(i.pods.iter().map(|p| format!("pod {}/{}/{}", p.namespace, p.pod, p.container)));
                    format!("yes ({})", users.join(", "))
                } else {
                    "no".into()
                };
                let _ = writeln!(
                    out,
                    "  {:<18} {:>3} {:>3}  {:<40}  {busy}",
                    format!("{}@{}", i.profile, i.placement.start),
                    i.gpu_instance_id,
                    i.compute_instance_id.map_or("-".to_string(), |c| c.to_string()),
                    i.uuid.as_deref().unwrap_or("-"),
                );
            }
        }
        if let Some(f) = &g.free {
            let _ = writeln!(
                out,
                "  free: {} memory slices, {} compute slices, {} stranded; largest creatable: {}",
                f.memory_slices,
                f.compute_slices,
                f.stranded_memory_slices,
                f.largest_creatable.as_deref().unwrap_or("none")
            );
        }
        if g.fragmentation.mig_enabled {
            let f = &g.fragmentation;
            let _ = writeln!(
                out,
                "  fragmentation: {:.2} of {} free memory slices expected unusable ({:.0}%)",
                f.expected_fragmentation_slices,
                f.free_memory_slices,
                f.expected_fragmentation_ratio * 100.0
            );
        }
        if g.compute_mode != crate::observed::ComputeMode::Default {
            let _ = writeln!(out, "  compute mode: {}", g.compute_mode.as_str());
        }
        if let Some(m) = &g.mps {
            let (replicas, m) = (m.replicas, &m.daemon);
            let state = match (m.pid, m.up) {
                (Some(pid), true) => format!("up (pid {pid})"),
                (Some(pid), false) => format!("not answering (pid {pid})"),
                (None, _) => "down".to_string(),
            };
            let clients: Vec<String> = m.clients.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "  mps: {state}, {} slots, threads {}%, pinned memory {}, clients: {}",
                replicas.map_or_else(|| "?".to_string(), |r| r.to_string()),
                m.active_thread_percentage.as_deref().unwrap_or("-"),
                m.pinned_memory_limit.as_deref().unwrap_or("-"),
                if clients.is_empty() { "none".to_string() } else { clients.join(", ") }
            );
        }
        if !g.processes.is_empty() {
            let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
            let _ = writeln!(out, "  processes: {}", pids.join(", "));
        }
    }
    out
}

/// Every GPU that answers NVML; one that fell off the bus is left out and named on stderr (as
/// `nvidia-smi` goes on past it), any other error is the error.
fn answering(backend: &dyn crate::backend::GpuBackend) -> Result<Vec<GpuState>, crate::backend::BackendError> {
    let mut states = Vec::new();
    for gpu in 0..backend.gpu_count()? {
        match backend.observe(gpu) {
            Ok(s) => states.push(s),
            Err(e) if e.is_gpu_lost() => tracing::warn!("GPU {gpu} left out: {e}"),
            Err(e) => return Err(e),
        }
    }
    Ok(states)
}

/// What `status` reads: the GPUs that answer (with the pods holding them), their status document
/// and the health record.
pub struct Observed {
    /// The GPUs as read.
    pub states: Vec<GpuState>,
    /// Their status document.
    pub doc: StatusDoc,
    /// The health record.
    pub book: crate::health::HealthBook,
    /// Where the GPUs came from (for "no GPUs found").
    pub describe: String,
}

/// Reads the node as `status` shows it.
pub fn observe(g: &GpuOptions) -> anyhow::Result<Observed> {
    let backend = open_backend(g)?;
    let mut states = answering(backend.as_ref()).context("reading the GPUs")?;
    let (uses, source) = crate::kubelet::pod_resources::PodResources::from_args(g).probe();
    crate::kubelet::allocations::attach(&mut states, &uses.unwrap_or_default());
    let mps = crate::mps::Mps::from_args(g);
    let mut doc = status_doc(&states, Some(&mps));
    doc.pod_resources = Some(source);
    doc.simulated = backend.is_simulated();
    let book = crate::gpu_health::read_or_warn(&g.health_file);
    for gpu in &mut doc.gpus {
        gpu.unhealthy = book.unhealthy().get(&gpu.index).cloned();
        gpu.unhealthy_mig_devices = book.mig_faults(gpu.index).cloned().collect();
    }
    Ok(Observed { states, doc, book, describe: backend.describe() })
}

/// The node's picture (docs/pictures.md), its instances outside `layout` (when given) foreign.
pub fn picture(o: &Observed, layout: Option<&crate::config::MigConfig>) -> String {
    let foreign = layout.map(|c| gpupart_node::prepare::foreign(&o.states, c)).unwrap_or_default();
    let extra: Vec<crate::picture::node::Extra> = o
        .doc
        .gpus
        .iter()
        .map(|g| crate::picture::node::Extra {
            mps: g.mps.as_ref().map(|m| {
                let slots = m.replicas.unwrap_or(0);
                (slots, (m.daemon.clients.len() as u32).min(slots))
            }),
            foreign: foreign.get(&g.index).cloned().unwrap_or_default(),
        })
        .collect();
    crate::picture::node::render(&o.states, &extra, &o.book)
}

/// Runs `status`.
pub fn run(g: &GpuOptions, a: &StatusArgs) -> anyhow::Result<ExitCode> {
    let layout = match (&a.config_file, &a.layout) {
        (Some(file), Some(name)) => Some(super::io::read_layout(file, name)?),
        _ => None,
    };
    let o = observe(g)?;
    match a.output {
        NodeFormat::Json => outln!("{}", serde_json::to_string_pretty(&o.doc)?),
        NodeFormat::Table if o.doc.gpus.is_empty() => outln!("no GPUs found ({})", o.describe),
        NodeFormat::Table => out!("{}", table(&o.doc)),
        NodeFormat::Svg => out!("{}", picture(&o, layout.as_ref())),
    }
    Ok(ExitCode::SUCCESS)
}
