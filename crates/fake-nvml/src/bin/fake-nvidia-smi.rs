//! A stand-in for `nvidia-smi --gpu-reset -i <bus id|index>` over the fake NVML state file
//! (`FAKE_NVML_STATE`): applies the pending MIG mode, refusing while the GPU has processes, as
//! the real tool does. Any other use prints usage and exits 2.

use fake_nvml::runtime::write_file;
use gpupart_mig::sim::SimState;
use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: fake-nvidia-smi (--gpu-reset|-r) -i <bus id|index>   (state from FAKE_NVML_STATE)");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reset = args.iter().any(|a| a == "--gpu-reset" || a == "-r");
    let target = args.iter().position(|a| a == "-i" || a == "--id").and_then(|i| args.get(i + 1)).cloned();
    let (true, Some(target)) = (reset, target) else { return usage() };
    let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from) else {
        eprintln!("FAKE_NVML_STATE is not set");
        return ExitCode::from(2);
    };
    let result = write_file(&path, |s: &mut SimState| {
        let index = s
            .gpus
            .iter()
            .find(|g| g.bus_id.eq_ignore_ascii_case(&target) || g.index.to_string() == target)
            .map(|g| g.index)
            .ok_or(gpupart_mig::sim::SimError {
                code: gpupart_mig::sim::NvmlCode::NotFound,
                detail: format!("No devices were found matching {target}"),
            })?;
        s.reset(index).map(|()| index)
    });
    match result {
        Ok(index) => {
            println!("GPU {target} was successfully reset (index {index}).");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Unable to reset GPU {target}: {e}");
            ExitCode::from(3)
        }
    }
}
