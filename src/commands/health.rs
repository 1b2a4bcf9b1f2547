//! `gpupart health`: the GPUs the agent fenced after NVML errors (its health record), and
//! `--recover` to bring them back; a running agent reads the record again within a second and
//! announces the recovery.

use crate::cli::{GpuOptions, HealthArgs, StatusFormat};
use crate::gpu_health::{describe, describe_mig, read_file, write_file};
use std::process::ExitCode;

/// Runs `health`.
pub fn run(g: &GpuOptions, a: &HealthArgs) -> anyhow::Result<ExitCode> {
    let file = &g.health_file;
    let mut book = read_file(file).map_err(anyhow::Error::msg)?;
    if let Some(which) = &a.recover {
        let gpus = crate::health::parse_gpus(which, &book).map_err(|e| anyhow::anyhow!("--recover {which}: {e}"))?;
        let back: Vec<u32> = gpus.iter().copied().filter(|gpu| book.recover(*gpu)).collect();
        let healthy: Vec<u32> = gpus.iter().copied().filter(|gpu| !back.contains(gpu)).collect();
        if !back.is_empty() {
            write_file(file, &book).map_err(anyhow::Error::msg)?;
        }
        for gpu in back {
            outln!("GPU {gpu}: recovered");
        }
        for gpu in healthy {
            outln!("GPU {gpu}: was not unhealthy");
        }
        return Ok(ExitCode::SUCCESS);
    }
    match a.output {
        StatusFormat::Json => outln!("{}", book.to_file().trim_end()),
        StatusFormat::Table if book.affected().is_empty() => outln!("no unhealthy GPUs ({})", file.display()),
        StatusFormat::Table => {
            let since = |at: i64| {
                k8s_openapi::jiff::Timestamp::from_second(at).map_or_else(|_| at.to_string(), |t| t.to_string())
            };
            for (gpu, u) in book.unhealthy() {
                outln!("{} since {}", describe(*gpu, u), since(u.since));
            }
            for gpu in book.affected() {
                for m in book.mig_faults(gpu) {
                    outln!("{} since {}", describe_mig(m), since(m.fault.since));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
