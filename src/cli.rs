//! Command-line definitions (clap). Flag names and environment variables follow NVIDIA
//! mig-parted where the verbs overlap (`-f`, `-c`, `-o`, `-l`, `-m`, `-a`, `--skip-reset`).

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// gpupart: partition NVIDIA GPUs (MIG) with minimal-diff reconfiguration.
#[derive(Debug, Parser)]
#[command(name = "gpupart", version, about, propagate_version = true)]
pub struct Cli {
    /// Global options.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every verb takes.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Use simulated GPUs instead of NVML: MODEL:COUNT[,MODEL:COUNT…], e.g. A100-SXM4-80GB:8.
    #[arg(long, global = true, value_name = "SPEC", env = "GPUPART_SIMULATE")]
    pub simulate: Option<String>,
    /// Simulator state file: created from --simulate when missing, reused when present.
    #[arg(long, global = true, value_name = "FILE", env = "GPUPART_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
    /// NVML library to load (default: the system libnvidia-ml.so.1).
    #[arg(long, global = true, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// nvidia-smi used for per-GPU resets on hardware.
    #[arg(long, global = true, value_name = "PATH")]
    pub nvidia_smi: Option<PathBuf>,
    /// MPS control program (`nvidia-cuda-mps-control` on PATH by default).
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        default_value = "nvidia-cuda-mps-control",
        env = "GPUPART_MPS_CONTROL"
    )]
    pub mps_control: PathBuf,
    /// Directory of the per-GPU MPS daemons: `<root>/<gpu-uuid>/{pipe,log,shm}`.
    #[arg(long, global = true, value_name = "DIR", default_value = crate::mps::node::DEFAULT_ROOT, env = "GPUPART_MPS_ROOT")]
    pub mps_root: PathBuf,
    /// Longest wait for one MPS control command, a daemon's start or its quit.
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub mps_timeout: std::time::Duration,
    /// Size of the tmpfs mounted on each GPU's MPS shm directory (the clients' /dev/shm):
    /// `auto` (half the host memory), `0` (a plain directory), or e.g. `8G`.
    #[arg(long, global = true, value_name = "SIZE", default_value = "auto", env = "GPUPART_MPS_SHM_SIZE",
          value_parser = parse_shm_size)]
    pub mps_shm_size: String,
    /// The kubelet's PodResources socket: devices allocated to pods count as in use.
    #[arg(long, global = true, value_name = "PATH", env = "GPUPART_POD_RESOURCES_SOCKET",
          default_value = crate::kubelet::pod_resources::DEFAULT_SOCKET)]
    pub pod_resources_socket: PathBuf,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Verbose logs (debug level).
    #[arg(long, short = 'd', global = true, env = "MIG_PARTED_DEBUG")]
    pub debug: bool,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line, for clusters.
    Json,
}

/// Output format of `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// YAML with placement comments.
    Yaml,
    /// JSON.
    Json,
}

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// A table per GPU.
    Table,
    /// The documented JSON schema (docs/status-json.md).
    Json,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply a MIG config: keep what can stay, destroy and create only what must change.
    Apply(ApplyArgs),
    /// Exit 0 iff the selected config is applied (mig-parted semantics).
    Assert(AssertArgs),
    /// Print the current layout as a mig-parted v1 config.
    Export(ExportArgs),
    /// Check a config file offline against the GPU catalog.
    Validate(ValidateArgs),
    /// Show GPUs, MIG modes, instances and free capacity.
    Status(StatusArgs),
    /// Run the node agent: keep the GPUs in the layout the node label (or a file) asks for.
    Agent(Box<AgentArgs>),
    /// Fragmentation figures per GPU and for the node.
    Frag(FragArgs),
    /// Plan a cluster: node pools, MIG/MPS layouts, labels and taints from inference demand.
    Plan(PlanArgs),
}

/// Output format of `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    /// A readable summary.
    Text,
    /// The documented JSON (docs/plan.md).
    Json,
    /// A multi-document stream for `kubectl apply --server-side`.
    Yaml,
}

/// `plan` options.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The fleet and demand file (docs/plan.md; `-` reads stdin).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = PlanFormat::Text)]
    pub output: PlanFormat,
    /// Percent added to a model's memory before the smallest fitting MIG profile is chosen.
    #[arg(long, value_name = "PCT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=400))]
    pub headroom: u32,
    /// Start from today's layouts: a mapping from node name to its `gpupart status -o json`.
    #[arg(long, value_name = "FILE", conflicts_with = "from_cluster")]
    pub current: Option<PathBuf>,
    /// Start from today's layouts as the agents publish them (`<prefix>gpus` on every Node;
    /// the default kubeconfig or the in-cluster account).
    #[arg(long)]
    pub from_cluster: bool,
    /// The agents' `--annotation-prefix` (for `--from-cluster`).
    #[arg(long, default_value = "gpupart.io/")]
    pub annotation_prefix: String,
}

/// `frag` options.
#[derive(Debug, Args)]
pub struct FragArgs {
    /// Config file whose `gpupart.workload` block sets the target workload mix.
    #[arg(short = 'f', long = "config-file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusFormat::Table)]
    pub output: StatusFormat,
    /// The whole cluster instead of this node: every Node's `<prefix>fragmentation`, per node
    /// and in total (the default kubeconfig or the in-cluster account).
    #[arg(long, conflicts_with = "config_file")]
    pub cluster: bool,
    /// The agents' `--annotation-prefix` (for `--cluster`).
    #[arg(long, default_value = "gpupart.io/")]
    pub annotation_prefix: String,
}

/// Checks `--mps-shm-size` (`0`, `auto`, `512M`, `8G`).
fn parse_shm_size(s: &str) -> Result<String, String> {
    crate::mps::shm::parse_size(s).map(|_| s.to_string())
}

/// Parses `500ms`, `30s`, `5m`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid duration '{s}': expected e.g. 500ms, 30s, 5m, 1h"))?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        _ => return Err(format!("invalid duration unit in '{s}': use ms, s, m or h")),
    };
    Ok(std::time::Duration::from_millis(ms))
}

/// `agent` options.
#[derive(Debug, Args, Clone)]
pub struct AgentArgs {
    /// Config file in mig-parted v1 format (a ConfigMap mount is fine: changes are picked up).
    #[arg(short = 'f', long = "config-file", value_name = "FILE", env = "CONFIG_FILE")]
    pub config_file: PathBuf,
    /// This node's name (Kubernetes mode).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Node label holding the layout name.
    #[arg(long, default_value = "nvidia.com/mig.config")]
    pub label_key: String,
    /// Reconcile this often even without changes, to repair drift.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub resync_interval: std::time::Duration,
    /// First retry delay after a failure (doubles up to --retry-max, with jitter).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub retry_min: std::time::Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub retry_max: std::time::Duration,
    /// How often bare-metal mode checks the layout and config files for changes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: std::time::Duration,
    /// Reboot the node when only a reboot can apply a MIG mode (at most once per change).
    #[arg(long)]
    pub allow_reboot: bool,
    /// Command used to reboot.
    #[arg(long, default_value = "systemctl reboot")]
    pub reboot_command: String,
    /// Marks that a reboot was attempted, so a mode that still fails after it does not loop.
    #[arg(long, default_value = "/var/lib/gpupart/reboot-attempted")]
    pub reboot_guard: PathBuf,
    /// Layout to apply when none is requested.
    #[arg(long, value_name = "NAME")]
    pub default_layout: Option<String>,
    /// Pause NVIDIA GPU Operator clients (gpu.deploy.* labels) during a change.
    #[arg(long)]
    pub pause_gpu_clients: bool,
    /// Longest wait for paused clients to stop.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub pause_timeout: std::time::Duration,
    /// Destroy busy instances when no plan can keep them.
    #[arg(long)]
    pub force: bool,
    /// Bare-metal mode: no Kubernetes; the layout comes from --layout or --layout-file.
    #[arg(long)]
    pub no_kube: bool,
    /// Layout name (bare-metal mode).
    #[arg(long, value_name = "NAME", conflicts_with = "layout_file")]
    pub layout: Option<String>,
    /// File holding the layout name (bare-metal mode); re-read on change and on SIGHUP.
    #[arg(long, value_name = "FILE")]
    pub layout_file: Option<PathBuf>,
    /// Write the agent's state as JSON here (bare-metal mode).
    #[arg(long, value_name = "FILE")]
    pub status_file: Option<PathBuf>,
    /// Prefix of the node summary labels and annotations (Kubernetes mode).
    #[arg(long, default_value = "gpupart.io/")]
    pub annotation_prefix: String,
    /// Shortest time between two node-summary writes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub annotation_min_interval: std::time::Duration,
    /// How often the metrics snapshot is refreshed besides after every change.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub metrics_interval: std::time::Duration,
    /// Listen address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = crate::http::DEFAULT_ADDR)]
    pub metrics_addr: std::net::SocketAddr,
    /// HTTP connections served at once (more are closed at accept).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub http_max_connections: u32,
    /// Longest time one HTTP connection may take to send its request and get the answer.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub http_timeout: std::time::Duration,
    /// Node-local lock file: a second agent on the node refuses to start.
    #[arg(long, default_value = "/run/gpupart/agent.lock")]
    pub lock_file: PathBuf,
    /// GPUs reconfigured at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel: u32,
    /// The kubelet's device-plugin directory (Kubernetes mode): the MPS slot plugin registers
    /// on its `kubelet.sock` and serves `gpupart-mps.sock` there.
    #[arg(long, value_name = "DIR", default_value = crate::kubelet::device_plugin::DEFAULT_DIR)]
    pub device_plugin_dir: std::path::PathBuf,
    /// Extended resource name of the MPS slots.
    #[arg(long, value_name = "NAME", default_value = crate::kubelet::device_plugin::DEFAULT_RESOURCE)]
    pub mps_resource: String,
    /// How long slots removed by a layout change stay advertised as unhealthy before they go.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub slot_retire_grace: std::time::Duration,
    /// How often each MPS daemon gets a health round trip (a dead or hung one is restarted).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub mps_health_interval: std::time::Duration,
}

/// Which config file and config.
#[derive(Debug, Args, Clone)]
pub struct ConfigArgs {
    /// Config file in mig-parted v1 format (`-` reads stdin).
    #[arg(short = 'f', long = "config-file", value_name = "FILE", env = "MIG_PARTED_CONFIG_FILE")]
    pub config_file: PathBuf,
    /// Config to use; may be omitted when the file holds one.
    #[arg(short = 'c', long = "selected-config", value_name = "NAME", env = "MIG_PARTED_SELECTED_CONFIG")]
    pub selected_config: Option<String>,
}

/// `apply` options.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Config file and name.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Print the plan without changing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Destroy busy instances when no plan can keep them (the driver may still refuse).
    #[arg(long)]
    pub force: bool,
    /// GPUs reconfigured at once.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub parallel: u32,
    /// Only change MIG modes; leave instances alone.
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY")]
    pub mode_only: bool,
    /// Never reset a GPU; a pending mode is reported as "reset required".
    #[arg(short = 's', long, env = "MIG_PARTED_SKIP_RESET")]
    pub skip_reset: bool,
    /// mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit).
    #[arg(short = 'k', long = "hooks-file", value_name = "FILE", env = "MIG_PARTED_HOOKS_FILE")]
    pub hooks_file: Option<PathBuf>,
}

/// `assert` options.
#[derive(Debug, Args)]
pub struct AssertArgs {
    /// Config file and name.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Only check MIG modes.
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY")]
    pub mode_only: bool,
    /// Only check that the file parses and holds the selected config.
    #[arg(short = 'a', long, env = "MIG_PARTED_VALID_CONFIG")]
    pub valid_config: bool,
}

/// `export` options.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Output format.
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = ExportFormat::Yaml)]
    pub output: ExportFormat,
    /// Name of the exported config.
    #[arg(short = 'l', long = "config-label", default_value = "current")]
    pub label: String,
}

/// `validate` options.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Config file (`-` reads stdin).
    #[arg(short = 'f', long = "config-file", value_name = "FILE", env = "MIG_PARTED_CONFIG_FILE")]
    pub config_file: PathBuf,
    /// Check only this config.
    #[arg(short = 'c', long = "selected-config", value_name = "NAME")]
    pub selected_config: Option<String>,
    /// Check against this node instead of every catalog model: MODEL[:COUNT][,…].
    #[arg(long, value_name = "SPEC")]
    pub gpu: Option<String>,
    /// Treat warnings (entries no catalog model can check) as problems.
    #[arg(long)]
    pub strict: bool,
}

/// `status` options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusFormat::Table)]
    pub output: StatusFormat,
}
