//! The backend the options ask for: NVML on hardware, the simulator with `--simulate` or
//! `--sim-state` (with the `GPUPART_SIM_*` delay and faults).

use super::{nvml, sim, GpuBackend, GpuOptions};
use anyhow::Context;
use std::time::Duration;

/// Opens the GPU backend the global options ask for.
pub fn open(g: &GpuOptions) -> anyhow::Result<Box<dyn GpuBackend>> {
    if g.simulate.is_none() && g.sim_state.is_none() {
        let backend = nvml::NvmlBackend::open(g.nvml_lib.as_deref(), g.nvidia_smi.as_deref())
            .context("no GPU backend (pass --simulate MODEL:COUNT to use simulated GPUs)")?;
        tracing::debug!(backend = %backend.describe(), "backend ready");
        return Ok(Box::new(backend));
    }
    let mut backend = sim::SimBackend::open(g.simulate.as_deref(), g.sim_state.as_deref())?;
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
    tracing::warn!("simulated GPUs ({}): no real GPU is read or changed", backend.describe());
    Ok(Box::new(backend))
}
