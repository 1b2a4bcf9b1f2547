//! Command-line definitions (clap). Flag names and environment variables follow NVIDIA
//! mig-parted where the verbs overlap (`-f`, `-c`, `-o`, `-l`, `-m`, `-a`, `--skip-reset`).

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// `gpupart --version`: the version and the commit it was built from (`unknown` outside git).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("GPUPART_COMMIT"), ")");

/// gpupart: partition NVIDIA GPUs (MIG) with minimal-diff reconfiguration.
#[derive(Debug, Parser)]
#[command(name = "gpupart", version = VERSION, about, propagate_version = true)]
pub struct Cli {
    /// Options of every verb.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// GPU options given before the verb (`gpupart --simulate A100-SXM4-80GB:8 apply …`); the
    /// same options after the verb take precedence.
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every verb takes (before or after the verb).
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Log format on stderr (`RUST_LOG` sets the levels, e.g. `RUST_LOG=gpupart=debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Verbose logs (debug level).
    #[arg(long, short = 'd', global = true, env = "MIG_PARTED_DEBUG", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub debug: bool,
    /// Answer as NVIDIA's mig-parted does where the two differ (set when invoked as
    /// `nvidia-mig-parted`): `apply` of a config that selects none of the GPUs succeeds.
    #[arg(long, global = true, hide = true)]
    pub as_mig_parted: bool,
}

/// The program name under which gpupart answers as NVIDIA's mig-parted (a symlink or copy).
pub const MIG_PARTED_NAME: &str = "nvidia-mig-parted";

impl Cli {
    /// Parses the command line; invoked as `nvidia-mig-parted`, the usage names that program and
    /// mig-parted's answers apply.
    pub fn parse_invoked() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let invoked = args
            .first()
            .and_then(|a| std::path::Path::new(a).file_name())
            .is_some_and(|n| n == std::ffi::OsStr::new(MIG_PARTED_NAME));
        let mut command = Cli::command();
        if invoked {
            command = command.name(MIG_PARTED_NAME).bin_name(MIG_PARTED_NAME);
        }
        let matches = command.get_matches_from(args);
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.global.as_mig_parted |= invoked;
        cli
    }
}

/// Options of the verbs that read or change GPUs (apply, assert, export, status, frag, agent).
/// Every one may also come from its environment variable (named in its help).
#[derive(Debug, Args, Clone, Default)]
#[command(next_help_heading = "GPU options")]
pub struct GpuArgs {
    /// Use simulated GPUs instead of NVML: MODEL:COUNT[,MODEL:COUNT…], e.g. A100-SXM4-80GB:8
    /// [env: GPUPART_SIMULATE].
    #[arg(long, value_name = "SPEC")]
    pub simulate: Option<String>,
    /// Simulator state file: created from --simulate when missing, reused when present
    /// [env: GPUPART_SIM_STATE].
    #[arg(long, value_name = "FILE")]
    pub sim_state: Option<PathBuf>,
    /// NVML library to load [default: the system libnvidia-ml.so.1].
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// nvidia-smi used for per-GPU resets on hardware [default: nvidia-smi on PATH].
    #[arg(long, value_name = "PATH")]
    pub nvidia_smi: Option<PathBuf>,
    /// MPS control program [default: nvidia-cuda-mps-control on PATH] [env: GPUPART_MPS_CONTROL].
    #[arg(long, value_name = "PATH")]
    pub mps_control: Option<PathBuf>,
    /// Directory of the per-GPU MPS daemons: `<root>/<gpu-uuid>/{pipe,log,shm}`
    /// [default: /run/gpupart/mps] [env: GPUPART_MPS_ROOT].
    #[arg(long, value_name = "DIR")]
    pub mps_root: Option<PathBuf>,
    /// Longest wait for one MPS control command, a daemon's start or its quit [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub mps_timeout: Option<std::time::Duration>,
    /// Size of the tmpfs mounted on each GPU's MPS shm directory (the clients' /dev/shm):
    /// `auto` (half the host memory), `0` (a plain directory), or e.g. `8G` [default: auto]
    /// [env: GPUPART_MPS_SHM_SIZE].
    #[arg(long, value_name = "SIZE", value_parser = parse_shm_size)]
    pub mps_shm_size: Option<String>,
    /// The kubelet's PodResources socket: devices allocated to pods count as in use
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock] [env: GPUPART_POD_RESOURCES_SOCKET].
    #[arg(long, value_name = "PATH")]
    pub pod_resources_socket: Option<PathBuf>,
    /// The record of unhealthy GPUs the agent keeps and `status`, `export` and `health` read
    /// [default: /var/lib/gpupart/health.json] [env: GPUPART_HEALTH_FILE].
    #[arg(long, value_name = "FILE")]
    pub health_file: Option<PathBuf>,
}

pub use crate::backend::GpuOptions;

/// A non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl GpuArgs {
    /// The option names of this group, as typed on the command line (`--simulate`, …), of
    /// those set in `self`.
    pub fn given(&self) -> Vec<&'static str> {
        let set = [
            ("--simulate", self.simulate.is_some()),
            ("--sim-state", self.sim_state.is_some()),
            ("--nvml-lib", self.nvml_lib.is_some()),
            ("--nvidia-smi", self.nvidia_smi.is_some()),
            ("--mps-control", self.mps_control.is_some()),
            ("--mps-root", self.mps_root.is_some()),
            ("--mps-timeout", self.mps_timeout.is_some()),
            ("--mps-shm-size", self.mps_shm_size.is_some()),
            ("--pod-resources-socket", self.pod_resources_socket.is_some()),
            ("--health-file", self.health_file.is_some()),
        ];
        set.into_iter().filter(|(_, on)| *on).map(|(n, _)| n).collect()
    }

    /// Resolves the options: `self` (after the verb) over `top` (before it), then the
    /// environment, then the defaults. A bad value from the environment is an error naming it.
    pub fn resolve(&self, top: &GpuArgs, debug: bool) -> Result<GpuOptions, String> {
        let pick = |a: &Option<String>, b: &Option<String>, env: &str| a.clone().or(b.clone()).or_else(|| env_var(env));
        let path = |a: &Option<PathBuf>, b: &Option<PathBuf>, env: Option<&str>| {
            a.clone().or(b.clone()).or_else(|| env.and_then(env_var).map(PathBuf::from))
        };
        let mps_shm_size = match pick(&self.mps_shm_size, &top.mps_shm_size, "GPUPART_MPS_SHM_SIZE") {
            Some(s) => parse_shm_size(&s).map_err(|e| format!("--mps-shm-size / GPUPART_MPS_SHM_SIZE: {e}"))?,
            None => "auto".to_string(),
        };
        // Where each backend choice came from, for an error that names both.
        let origin = |flag: &str, a: bool, b: bool, env: Option<&str>| -> Option<String> {
            if a || b {
                Some(flag.to_string())
            } else {
                env.and_then(|e| env_var(e).map(|v| format!("{e}={v}")))
            }
        };
        let sim_origins: Vec<String> = [
            origin("--simulate", self.simulate.is_some(), top.simulate.is_some(), Some("GPUPART_SIMULATE")),
            origin("--sim-state", self.sim_state.is_some(), top.sim_state.is_some(), Some("GPUPART_SIM_STATE")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let nvml_origins: Vec<String> = [
            origin("--nvml-lib", self.nvml_lib.is_some(), top.nvml_lib.is_some(), None),
            origin("--nvidia-smi", self.nvidia_smi.is_some(), top.nvidia_smi.is_some(), None),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !sim_origins.is_empty() && !nvml_origins.is_empty() {
            return Err(format!(
                "{} asks for real GPUs through NVML and {} for simulated ones: give one or the other \
                 (unset the variable or drop the option you did not mean)",
                nvml_origins.join(" and "),
                sim_origins.join(" and ")
            ));
        }
        Ok(GpuOptions {
            simulate: pick(&self.simulate, &top.simulate, "GPUPART_SIMULATE"),
            sim_state: path(&self.sim_state, &top.sim_state, Some("GPUPART_SIM_STATE")),
            nvml_lib: path(&self.nvml_lib, &top.nvml_lib, None),
            nvidia_smi: path(&self.nvidia_smi, &top.nvidia_smi, None),
            mps_control: path(&self.mps_control, &top.mps_control, Some("GPUPART_MPS_CONTROL"))
                .unwrap_or_else(|| PathBuf::from("nvidia-cuda-mps-control")),
            mps_root: path(&self.mps_root, &top.mps_root, Some("GPUPART_MPS_ROOT"))
                .unwrap_or_else(|| PathBuf::from(crate::mps::node::DEFAULT_ROOT)),
            mps_timeout: self.mps_timeout.or(top.mps_timeout).unwrap_or(std::time::Duration::from_secs(10)),
            mps_shm_size,
            pod_resources_socket: path(
                &self.pod_resources_socket,
                &top.pod_resources_socket,
                Some("GPUPART_POD_RESOURCES_SOCKET"),
            )
            .unwrap_or_else(|| PathBuf::from(crate::kubelet::pod_resources::DEFAULT_SOCKET)),
            health_file: path(&self.health_file, &top.health_file, Some("GPUPART_HEALTH_FILE"))
                .unwrap_or_else(|| PathBuf::from(crate::gpu_health::DEFAULT_FILE)),
            debug,
            as_mig_parted: false,
        })
    }
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

/// Output format of `status`: a table, the JSON schema, or a picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeFormat {
    /// A table per GPU.
    Table,
    /// The documented JSON schema (docs/status-json.md).
    Json,
    /// One self-contained SVG: each GPU's memory slices and instances (docs/pictures.md).
    Svg,
}

/// Output format of `frag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FragFormat {
    /// A table per GPU (with `--cluster`, per node).
    Table,
    /// The documented JSON (docs/fragmentation.md).
    Json,
    /// One self-contained SVG: the node's picture, or with `--cluster` the cluster's (docs/pictures.md).
    Svg,
}

/// Output format of `frag` and `health`.
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
    /// Run the cluster controller: node layouts follow the pending GPU pods (docs/controller.md).
    Controller(Box<ControllerArgs>),
    /// Print the layouts the GPUs' profiles allow as a v1 config (as mig-parted generates them).
    #[command(name = "generate-config")]
    GenerateConfig(GenerateConfigArgs),
    /// Save the node's MIG state (modes, instances, placements) to a mig-parted checkpoint file.
    Checkpoint(CheckpointArgs),
    /// Bring back a checkpoint's MIG state: exact placements, keeping what already matches.
    Restore(RestoreArgs),
    /// Show the GPUs the agent fenced after NVML errors, or bring them back (docs/health.md).
    Health(HealthArgs),
}

/// `health` options.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Mark these GPUs healthy again: `1,3` or `all` (a running agent picks it up).
    #[arg(long, value_name = "GPUS")]
    pub recover: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusFormat::Table)]
    pub output: StatusFormat,
}

/// `generate-config` options.
#[derive(Debug, Args)]
pub struct GenerateConfigArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Write the config here instead of standard output.
    #[arg(short = 'f', long = "output-file", value_name = "FILE", env = "MIG_PARTED_OUTPUT_FILE")]
    pub output_file: Option<PathBuf>,
    /// Output format (`--output-format`, mig-parted's spelling, works too).
    #[arg(short = 'o', long = "output", visible_alias = "output-format", value_enum, default_value_t = ExportFormat::Yaml)]
    pub output: ExportFormat,
}

/// `checkpoint` options.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The checkpoint file to write.
    #[arg(short = 'f', long = "checkpoint-file", value_name = "FILE", env = "MIG_PARTED_CHECKPOINT_FILE")]
    pub checkpoint_file: PathBuf,
}

/// `restore` options.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// The checkpoint file to restore.
    #[arg(short = 'f', long = "checkpoint-file", value_name = "FILE", env = "MIG_PARTED_CHECKPOINT_FILE")]
    pub checkpoint_file: PathBuf,
    /// mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit).
    #[arg(short = 'k', long = "hooks-file", value_name = "FILE", env = "MIG_PARTED_HOOKS_FILE")]
    pub hooks_file: Option<PathBuf>,
    /// Only restore MIG modes; leave instances alone.
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub mode_only: bool,
    /// Destroy busy instances the checkpoint does not hold.
    #[arg(long)]
    pub force: bool,
}

/// `NAMESPACE/NAME` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Parses `NAMESPACE/NAME`.
pub fn parse_object_name(s: &str) -> Result<ObjectName, String> {
    let valid = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match s.split_once('/') {
        Some((ns, name)) if valid(ns) && valid(name) => Ok(ObjectName { namespace: ns.into(), name: name.into() }),
        _ => Err(format!("'{s}' is not NAMESPACE/NAME (lowercase letters, digits, '-' and '.')")),
    }
}

/// `controller` options.
#[derive(Debug, Args, Clone)]
pub struct ControllerArgs {
    /// Decide and report (logs, Events "will repartition node X: …"), change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Longest wait to batch pending pods after the first one; cut short after a quiet second
    /// (at least 100ms).
    #[arg(long, default_value = "5s", value_parser = parse_period, allow_hyphen_values = true)]
    pub batch_window: std::time::Duration,
    /// Nodes reconfiguring at once, counting those already under way.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_concurrent_nodes: u32,
    /// A controller-made dedicated node without pods this long goes back to the shared pool
    /// (at least 1s).
    #[arg(long, default_value = "30m", value_parser = parse_second_or_more, allow_hyphen_values = true)]
    pub reclaim_after: std::time::Duration,
    /// A tensor-parallel pod that no idle node serves gets the shared node with the fewest pods
    /// reserved: tainted so no new shared pod lands there, converted once its pods end.
    #[arg(long)]
    pub reserve_for_dedicated: bool,
    /// Least time between two changes of one node.
    #[arg(long, default_value = "1m", value_parser = parse_duration, allow_hyphen_values = true)]
    pub cooldown: std::time::Duration,
    /// The agents' config: a ConfigMap whose `config.yaml` holds the hand-written layouts and
    /// the generated ones; its annotation `gpupart.io/controller: off` pauses the controller.
    #[arg(long, value_name = "NS/NAME", default_value = "gpupart-system/gpupart-config", value_parser = parse_object_name)]
    pub layouts_configmap: ObjectName,
    /// The leader-election Lease.
    #[arg(long, value_name = "NS/NAME", default_value = "gpupart-system/gpupart-controller", value_parser = parse_object_name)]
    pub lease: ObjectName,
    /// Lease duration: a new leader takes over this long after the old one stopped renewing
    /// (at least 1s).
    #[arg(long, default_value = "15s", value_parser = parse_second_or_more, allow_hyphen_values = true)]
    pub lease_duration: std::time::Duration,
    /// Events a batch may queue (repeats of one still queued fold into it); the rest are dropped
    /// and counted in `gpupart_controller_events_dropped_total`.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub events_per_batch: u32,
    /// This replica's name in the Lease [default: $POD_NAME, else host name and pid].
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Re-evaluate this often even without changes (cool-downs, reclaim times; at least 100ms).
    #[arg(long, default_value = "30s", value_parser = parse_period, allow_hyphen_values = true)]
    pub resync_interval: std::time::Duration,
    /// Extended resource name of the agents' MPS slots.
    #[arg(long, value_name = "NAME", default_value = crate::kubelet::device_plugin::DEFAULT_RESOURCE)]
    pub mps_resource: String,
    /// Client slots of an MPS daemon the controller asks for.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=48))]
    pub mps_replicas: u32,
    /// Listen address for /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9478")]
    pub metrics_addr: std::net::SocketAddr,
    /// The node label naming a node's pool (as `gpupart plan` labels nodes).
    #[arg(long, value_name = "KEY", default_value = gpupart_cluster::pools::DEFAULT_POOL_LABEL)]
    pub pool_label: String,
    /// The pool label's value on shared nodes (set again when a dedicated node returns, if it had it).
    #[arg(long, value_name = "VALUE", default_value = gpupart_cluster::pools::DEFAULT_SHARED_POOL)]
    pub shared_pool: String,
    /// The pool label's value on dedicated nodes (set when the controller dedicates a node).
    #[arg(long, value_name = "VALUE", default_value = gpupart_cluster::pools::DEFAULT_DEDICATED_POOL)]
    pub dedicated_pool: String,
    /// The dedicated pool's taint, `key=value:Effect` (set when the controller dedicates a node).
    #[arg(long, value_name = "TAINT", default_value = gpupart_cluster::pools::DEFAULT_DEDICATED_TAINT)]
    pub dedicated_taint: String,
    /// Defragmentation by moving pods (docs/defrag.md).
    #[command(flatten)]
    pub defrag: DefragArgs,
}

impl DefragArgs {
    /// Which pods may move, as the flags say.
    pub fn rules(&self) -> gpupart_cluster::defrag::movable::MoveRules {
        gpupart_cluster::defrag::movable::MoveRules {
            namespaces: self.defrag_namespaces.iter().filter(|n| !n.is_empty()).cloned().collect(),
            max_priority: self.defrag_max_priority,
            min_age_secs: self.defrag_min_age.as_secs() as i64,
        }
    }
}

/// `gpupart controller --defrag` and its limits.
#[derive(Debug, Clone, clap::Args)]
pub struct DefragArgs {
    /// Make room for a pod that waits by evicting the fewest movable pods (off by default; with
    /// --dry-run the plans are logged and nothing is evicted).
    #[arg(long)]
    pub defrag: bool,
    /// Namespaces whose pods may be moved without the `gpupart.io/movable: "true"` annotation
    /// (comma-separated).
    #[arg(long, value_name = "NS,...", value_delimiter = ',')]
    pub defrag_namespaces: Vec<String>,
    /// Pods with this priority or higher are never moved.
    #[arg(long, value_name = "PRIORITY", default_value_t = 1000, allow_negative_numbers = true)]
    pub defrag_max_priority: i32,
    /// Pods younger than this are never moved.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub defrag_min_age: std::time::Duration,
    /// Evictions per hour, cluster-wide.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub defrag_max_evictions: u32,
    /// Evictions per hour on one node.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub defrag_max_evictions_per_node: u32,
    /// Most pods one plan moves.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub defrag_max_pods: u32,
    /// The waiting pod must be bound into the room this long after the plan starts, or the room
    /// is released and the plan counts as failed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub defrag_confirm_timeout: std::time::Duration,
    /// After a failed plan, no new plan for the same pod for this long.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub defrag_cooldown: std::time::Duration,
    /// The DRA driver whose nodes are defragmented (`gpupart agent --dra --driver-name`).
    #[arg(long, value_name = "NAME", default_value = crate::dra::DEFAULT_DRIVER)]
    pub dra_driver: String,
}

impl ControllerArgs {
    /// The pools as the flags name them; an error names the flag and the value.
    pub fn pools(&self) -> Result<gpupart_cluster::pools::Pools, gpupart_cluster::pools::PoolError> {
        gpupart_cluster::pools::Pools::new(
            &self.pool_label,
            &self.shared_pool,
            &self.dedicated_pool,
            &self.dedicated_taint,
        )
    }
}

/// Output format of `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    /// A readable summary.
    Text,
    /// The documented JSON (docs/plan.md).
    Json,
    /// A multi-document stream for `kubectl apply --server-side` (the ConfigMap and the
    /// descheduler policy; node labels and taints are in `kubectl`).
    Yaml,
    /// A shell script: `kubectl apply` of the `yaml` stream, then `kubectl label` / `kubectl
    /// taint` of each existing node.
    Kubectl,
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
    #[arg(long, value_name = "PCT", default_value_t = 10, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=400))]
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
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Config file whose `gpupart.workload` block sets the target workload mix.
    #[arg(short = 'f', long = "config-file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = FragFormat::Table)]
    pub output: FragFormat,
    /// The whole cluster instead of this node: every Node's `<prefix>fragmentation`, per node
    /// and in total (the default kubeconfig or the in-cluster account).
    #[arg(long, conflicts_with = "config_file")]
    pub cluster: bool,
    /// The agents' `--annotation-prefix` (for `--cluster`).
    #[arg(long, default_value = "gpupart.io/")]
    pub annotation_prefix: String,
    /// The label naming a node's pool, to group the cluster picture by (`--cluster -o svg`).
    #[arg(long, value_name = "KEY", default_value = gpupart_cluster::pools::DEFAULT_POOL_LABEL)]
    pub pool_label: String,
    /// Which page of the cluster picture to draw (`--cluster -o svg`), from 1.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub page: u32,
    /// Node rows per page of the cluster picture (`--cluster -o svg`).
    #[arg(long, value_name = "N", default_value_t = crate::picture::cluster::DEFAULT_PAGE_SIZE, value_parser = clap::value_parser!(u32).range(1..))]
    pub page_size: u32,
}

/// Checks `--mps-shm-size` (`0`, `auto`, `512M`, `8G`).
fn parse_shm_size(s: &str) -> Result<String, String> {
    crate::mps::shm::parse_size(s).map(|_| s.to_string())
}

/// Checks a DRA driver name: a lowercase DNS subdomain (RFC 1123 labels joined by dots) of at
/// most 63 characters, as the API server validates a ResourceSlice's `spec.driver`; it also
/// names the plugin's sockets and folder, so nothing else may reach the file system.
pub fn parse_driver_name(s: &str) -> Result<String, String> {
    let label = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.len() <= 63 && s.split('.').all(label) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}' is not a DRA driver name: lowercase letters, digits and '-' in dot-separated parts, at most 63 characters (e.g. gpu.gpupart.io)"
        ))
    }
}

/// A duration of at least 100 ms (a loop's period or wait).
pub fn parse_period(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_millis(100))
}

/// A duration of at least one second.
pub fn parse_second_or_more(s: &str) -> Result<std::time::Duration, String> {
    at_least(s, std::time::Duration::from_secs(1))
}

fn at_least(s: &str, min: std::time::Duration) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!("'{s}' is too short: at least {}", duration_words(min)));
    }
    Ok(d)
}

fn duration_words(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
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
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Config file in mig-parted v1 format (a ConfigMap mount is fine: changes are picked up)
    /// [env: MIG_PARTED_CONFIG_FILE, or CONFIG_FILE as NVIDIA's MIG manager names it].
    #[arg(short = 'f', long = "config-file", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Read the config from this ConfigMap's `config.yaml` through the API, watched, so a layout
    /// `gpupart controller` writes is usable at once (Kubernetes mode; instead of `-f`).
    #[arg(long, value_name = "NS/NAME", value_parser = parse_object_name, conflicts_with = "config_file")]
    pub config_map: Option<ObjectName>,
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
    /// mig-parted hooks file run around every change, as `apply -k` runs it (apply-start,
    /// pre-apply-mode, pre-apply-config, apply-exit).
    #[arg(long = "hooks", value_name = "FILE", env = "MIG_PARTED_HOOKS_FILE")]
    pub hooks: Option<PathBuf>,
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
    /// HTTP connections held at once; a new one beyond them replaces the oldest still sending its
    /// request.
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
    /// Run as a Dynamic Resource Allocation kubelet plugin instead of following the layout label:
    /// publish this node's MIG placements and whole GPUs as ResourceSlices and create each MIG
    /// device when the kubelet prepares the claim it was allocated to (docs/dra.md).
    #[arg(long)]
    pub dra: bool,
    /// The DRA driver name (DeviceClasses select it): a lowercase DNS subdomain of at most 63
    /// characters, as the API server requires of a ResourceSlice's driver.
    #[arg(long, default_value = crate::dra::DEFAULT_DRIVER, value_parser = parse_driver_name, allow_hyphen_values = true)]
    pub driver_name: String,
    /// The kubelet's plugin registry directory (the plugin serves `<driver-name>-reg.sock` there).
    #[arg(long, value_name = "DIR", default_value = crate::kubelet::dra_plugin::DEFAULT_REGISTRY_DIR)]
    pub kubelet_registry_dir: PathBuf,
    /// The kubelet's plugins directory (the DRA service listens on `<dir>/<driver-name>/dra.sock`).
    #[arg(long, value_name = "DIR", default_value = crate::kubelet::dra_plugin::DEFAULT_PLUGINS_DIR)]
    pub kubelet_plugins_dir: PathBuf,
    /// Where CDI spec files for prepared claims are written.
    #[arg(long, value_name = "DIR", default_value = crate::dra::DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,
    /// The NVIDIA driver's MIG capability minors file.
    #[arg(long, value_name = "FILE", default_value = crate::dra::DEFAULT_MIG_MINORS)]
    pub nvidia_caps_minors: PathBuf,
    /// Where the DRA plugin keeps its checkpoint.
    #[arg(long, value_name = "DIR", default_value = crate::dra::DEFAULT_STATE_DIR)]
    pub dra_state_dir: PathBuf,
    /// Watch ResourceClaims so a device allocated from this node counts as taken before the
    /// kubelet prepares it (`--watch-claims=false`: only Prepare and Unprepare republish).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub watch_claims: bool,
    /// Memory an MPS share takes when its claim names none (a quantity: `1Gi`, `4096Mi`).
    #[arg(long, value_name = "BYTES", default_value = "1Gi", value_parser = bytes)]
    pub dra_mps_default_memory: u64,
    /// MPS shares' memory requests are rounded up to a multiple of this (and take at least it).
    #[arg(long, value_name = "BYTES", default_value = "256Mi", value_parser = bytes)]
    pub dra_mps_memory_step: u64,
    /// Publish an MPS device for MIG-capable GPUs too: shared while no MIG device is allocated
    /// there (the first share turns MIG mode off, the last turns it on again).
    #[arg(long)]
    pub dra_mps_on_mig_gpus: bool,
    /// XIDs that do not fence a GPU besides NVIDIA's application XIDs (13,31,43,45,68,109), comma
    /// separated; `-43` fences on XID 43 after all (docs/health.md) [env: GPUPART_IGNORE_XIDS].
    #[arg(long, value_name = "LIST", env = "GPUPART_IGNORE_XIDS", default_value = "", value_parser = xid_policy, allow_hyphen_values = true)]
    pub ignore_xids: gpupart_node::health::XidPolicy,
    /// The effect of the `<driver-name>/unhealthy` taint on every device of an unhealthy GPU
    /// (`agent --dra`): `NoSchedule` keeps new claims off it, `NoExecute` also evicts the pods
    /// using it.
    #[arg(long, value_enum, default_value_t = TaintEffect::NoSchedule)]
    pub health_taint_effect: TaintEffect,
}

/// A device taint's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaintEffect {
    /// No new allocation of the device.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// No new allocation, and the pods using it are evicted.
    #[value(name = "NoExecute")]
    NoExecute,
}

impl TaintEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// `--ignore-xids`.
fn xid_policy(s: &str) -> Result<gpupart_node::health::XidPolicy, String> {
    gpupart_node::health::XidPolicy::parse(s).map_err(|e| e.to_string())
}

/// A byte quantity as Kubernetes writes it (`1Gi`, `256Mi`, `1073741824`).
fn bytes(s: &str) -> Result<u64, String> {
    let q = gpupart_node::dra::slices::Quantity { value: s.to_string() };
    match q.as_u64() {
        Some(0) => Err(format!("'{s}' is zero bytes")),
        Some(n) => Ok(n),
        None => Err(format!("'{s}' is not a byte quantity (e.g. 1Gi, 512Mi, 1073741824)")),
    }
}

impl AgentArgs {
    /// The flags given that only the label-driven agent reads (`--dra` refuses them).
    pub fn label_mode_flags(&self) -> Vec<&'static str> {
        [
            ("-f/--config-file", self.config_file.is_some()),
            ("--config-map", self.config_map.is_some()),
            ("--layout", self.layout.is_some()),
            ("--layout-file", self.layout_file.is_some()),
            ("--default-layout", self.default_layout.is_some()),
            ("--pause-gpu-clients", self.pause_gpu_clients),
            ("--allow-reboot", self.allow_reboot),
            ("--force", self.force),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The DRA plugin's options (`--dra`).
    pub fn dra_options(&self) -> crate::dra::DraOptions {
        crate::dra::DraOptions {
            node_name: self.node_name.clone(),
            no_kube: self.no_kube,
            driver_name: self.driver_name.clone(),
            kubelet_registry_dir: self.kubelet_registry_dir.clone(),
            kubelet_plugins_dir: self.kubelet_plugins_dir.clone(),
            cdi_dir: self.cdi_dir.clone(),
            nvidia_caps_minors: self.nvidia_caps_minors.clone(),
            dra_state_dir: self.dra_state_dir.clone(),
            watch_claims: self.watch_claims,
            lock_file: self.lock_file.clone(),
            ignore_xids: self.ignore_xids.clone(),
            health_taint_effect: self.health_taint_effect.as_str(),
            metrics_addr: self.metrics_addr,
            http_max_connections: self.http_max_connections,
            http_timeout: self.http_timeout,
            resync_interval: self.resync_interval,
            annotation_prefix: self.annotation_prefix.clone(),
            annotation_min_interval: self.annotation_min_interval,
            mps_policy: gpupart_node::dra::publish::MpsPolicy {
                default_memory: self.dra_mps_default_memory,
                memory_step: self.dra_mps_memory_step,
            },
            mps_on_mig: self.dra_mps_on_mig_gpus,
        }
    }
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
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
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
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub mode_only: bool,
    /// Never reset a GPU; a pending mode is reported as "reset required".
    #[arg(short = 's', long, env = "MIG_PARTED_SKIP_RESET", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub skip_reset: bool,
    /// mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit).
    #[arg(short = 'k', long = "hooks-file", value_name = "FILE", env = "MIG_PARTED_HOOKS_FILE")]
    pub hooks_file: Option<PathBuf>,
}

/// `assert` options.
#[derive(Debug, Args)]
pub struct AssertArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Config file and name.
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Only check MIG modes.
    #[arg(short = 'm', long, env = "MIG_PARTED_MODE_CHANGE_ONLY", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub mode_only: bool,
    /// Only check that the file parses and holds the selected config.
    #[arg(short = 'a', long, env = "MIG_PARTED_VALID_CONFIG", action = ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub valid_config: bool,
}

/// `export` options.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Output format (`--output-format`, mig-parted's spelling, works too).
    #[arg(short = 'o', long = "output", visible_alias = "output-format", value_enum, default_value_t = ExportFormat::Yaml)]
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
    /// Check against this node instead of every catalog model: MODEL[:COUNT][,…]
    /// (`--simulate SPEC` means the same).
    #[arg(long, value_name = "SPEC", visible_alias = "simulate")]
    pub gpu: Option<String>,
    /// Treat warnings (entries no catalog model can check) as problems.
    #[arg(long)]
    pub strict: bool,
}

/// `status` options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// GPU options (also accepted before the verb).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = NodeFormat::Table)]
    pub output: NodeFormat,
    /// With `-o svg`: mark the instances this layout of `--config-file` does not hold as foreign.
    #[arg(long, value_name = "NAME", requires = "config_file")]
    pub layout: Option<String>,
    /// The config file holding `--layout`.
    #[arg(short = 'f', long = "config-file", value_name = "FILE", requires = "layout")]
    pub config_file: Option<PathBuf>,
}
