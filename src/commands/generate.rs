//! `gpupart generate-config`: the layouts the GPUs' profiles allow, as a v1 config.

use crate::backend::open as open_backend;
use crate::cli::{ExportFormat, GenerateConfigArgs, GpuOptions};
use crate::config::generate;
use anyhow::Context;
use std::process::ExitCode;

/// Runs `generate-config`.
pub fn run(g: &GpuOptions, a: &GenerateConfigArgs) -> anyhow::Result<ExitCode> {
    let backend = open_backend(g)?;
    let states = backend.observe_all().context("reading the GPUs")?;
    let gpus: Vec<(u32, u32, &crate::mig::ProfileTable)> = states
        .iter()
        .filter(|s| s.info.mig_capable)
        .map(|s| (s.info.index, s.info.pci_device_id, &s.profiles))
        .collect();
    let configs = generate::generate(&gpus)?;
    let text = match a.output {
        ExportFormat::Yaml => generate::yaml(&configs),
        ExportFormat::Json => serde_json::to_string_pretty(&generate::json(&configs))? + "\n",
    };
    match &a.output_file {
        Some(path) => {
            crate::fsutil::write_atomic(path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            outln!("MIG configuration generated for {} GPU(s) in {}", gpus.len(), path.display());
        }
        None => out!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
