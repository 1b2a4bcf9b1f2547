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
