//! The verbs: each reads its inputs, calls the pure core and a backend, and prints.

mod apply;
mod assert;
mod export;
mod frag;
mod plan;
mod status;
mod validate;

use crate::backend::nvml::NvmlBackend;
use crate::backend::sim::SimBackend;
use crate::backend::GpuBackend;
use crate::cli::{Cli, Command, GlobalArgs};
use crate::config::{self, ConfigFile};
use anyhow::Context;
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Apply(a) => apply::run(&cli.global, &a),
        Command::Assert(a) => assert::run(&cli.global, &a),
        Command::Export(a) => export::run(&cli.global, &a),
        Command::Validate(a) => validate::run(&cli.global, &a),
        Command::Status(a) => status::run(&cli.global, &a),
        Command::Agent(a) => crate::agent::run(&cli.global, &a),
        Command::Frag(a) => frag::run(&cli.global, &a),
        Command::Plan(a) => plan::run(&a),
    }
}

/// Opens the GPU backend the global options ask for.
pub fn open_backend(g: &GlobalArgs) -> anyhow::Result<Box<dyn GpuBackend>> {
    if g.simulate.is_none() && g.sim_state.is_none() {
        let backend = NvmlBackend::open(g.nvml_lib.as_deref(), g.nvidia_smi.as_deref())
            .context("no GPU backend (pass --simulate MODEL:COUNT to use simulated GPUs)")?;
        tracing::debug!(backend = %backend.describe(), "backend ready");
        return Ok(Box::new(backend));
    }
    let mut backend = SimBackend::open(g.simulate.as_deref(), g.sim_state.as_deref())?;
    if let Ok(ms) = std::env::var("GPUPART_SIM_OP_DELAY_MS") {
        let ms: u64 = ms
            .trim()
            .parse()
            .with_context(|| format!("GPUPART_SIM_OP_DELAY_MS={ms} is not a number of milliseconds"))?;
        backend = backend.with_op_delay(Duration::from_millis(ms));
    }
    if let Ok(spec) = std::env::var("GPUPART_SIM_FAIL") {
        let faults = crate::mig::sim::fault::Faults::parse(&spec).context("GPUPART_SIM_FAIL")?;
        backend = backend.with_faults(faults);
    }
    tracing::debug!(backend = %backend.describe(), "backend ready");
    Ok(Box::new(backend))
}

/// Reads a file, `-` being stdin; returns its text and a name for messages. `what` names the
/// file's role in errors ("config file").
pub fn read_input(path: &Path, what: &str) -> anyhow::Result<(String, String)> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).with_context(|| format!("reading the {what} from stdin"))?;
        Ok((s, "<stdin>".to_string()))
    } else {
        let s = std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))?;
        Ok((s, path.display().to_string()))
    }
}

/// Reads and parses a config file (`-` is stdin).
pub fn read_config(path: &Path) -> anyhow::Result<ConfigFile> {
    let (text, name) = read_input(path, "config file")?;
    config::parse(&text).with_context(|| format!("invalid config file {name}"))
}
