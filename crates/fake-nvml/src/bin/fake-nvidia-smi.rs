//! A stand-in for the parts of `nvidia-smi` that MIG tooling and scripts use, over the fake NVML
//! state (`FAKE_NVML_STATE`, else a fresh node from `FAKE_NVML_GPUS`):
//!
//! - `--gpu-reset | -r -i <ids>`: applies each GPU's pending MIG mode, refusing while it has
//!   processes, as the real tool does (needs `FAKE_NVML_STATE`);
//! - `-L | --list-gpus [-i <ids>]`: the real tool's lines, MIG devices included;
//! - `-q | --query [-i <ids>]`: a subset of the real report (product, UUID, serial, bus id, MIG
//!   mode, memory).
//!
//! `<ids>` takes what the real `-i` takes: an index, a `GPU-…` UUID, a serial or a PCI bus id
//! in any form, or a comma-separated list of those. Anything else prints usage and exits 2.

use fake_nvml::ident;
use fake_nvml::runtime::{write_file, DEFAULT_GPUS};
use gpupart_mig::catalog;
use gpupart_mig::sim::{parse_spec, store, NvmlCode, SimError, SimGpu, SimState};
use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: fake-nvidia-smi (--gpu-reset|-r) -i <ids> | (-L|--list-gpus) [-i <ids>] | (-q|--query) [-i <ids>]\n\
         <ids>: index, UUID, serial or PCI bus id, comma-separated (state from FAKE_NVML_STATE or FAKE_NVML_GPUS)"
    );
    ExitCode::from(2)
}

fn state() -> Result<SimState, String> {
    if let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from).filter(|p| p.exists()) {
        return store::load(&path).map_err(|e| e.to_string());
    }
    let spec = std::env::var("FAKE_NVML_GPUS").unwrap_or_else(|_| DEFAULT_GPUS.to_string());
    parse_spec(&spec).map(|p| SimState::new(&p)).map_err(|e| format!("FAKE_NVML_GPUS: {e}"))
}

/// The GPUs `ids` names, in the order given; the first id matching none is the error.
fn select<'a>(s: &'a SimState, ids: Option<&str>) -> Result<Vec<&'a SimGpu>, String> {
    let Some(ids) = ids else { return Ok(s.gpus.iter().collect()) };
    ids.split(',')
        .map(|id| {
            s.gpus.iter().find(|g| ident::names(g, id)).ok_or_else(|| format!("No devices were found matching {id}"))
        })
        .collect()
}

fn product(g: &SimGpu) -> String {
    catalog::lookup(&g.model).map_or_else(|| g.model.clone(), |m| m.nvml_name.to_string())
}

fn list(gpus: &[&SimGpu]) -> String {
    let mut out = String::new();
    for g in gpus {
        out += &format!("GPU {}: {} (UUID: {})\n", g.index, product(g), g.uuid);
        let table = catalog::lookup(&g.model).map(|m| m.profile_table());
        let mut n = 0;
        for gi in &g.gpu_instances {
            for ci in &gi.compute_instances {
                let name = table
                    .as_ref()
                    .and_then(|t| t.by_id(gi.profile_id))
                    .map_or_else(|| "unknown".to_string(), |p| p.device_name(ci.profile_id).to_string());
                out += &format!("  MIG {name:<12} Device {n:>2}: (UUID: {})\n", ci.uuid);
                n += 1;
            }
        }
    }
    out
}

fn query(s: &SimState, gpus: &[&SimGpu]) -> String {
    let mut out = format!(
        "\n==============NVSMI LOG==============\n\nDriver Version                            : fake-nvml\nAttached GPUs                             : {}\n",
        s.gpus.len()
    );
    let on = |b: bool| if b { "Enabled" } else { "Disabled" };
    for g in gpus {
        let m = catalog::lookup(&g.model);
        out += &format!(
            "GPU {}\n    Product Name                          : {}\n    Serial Number                         : {}\n    GPU UUID                              : {}\n    Minor Number                          : {}\n    MIG Mode\n        Current                           : {}\n        Pending                           : {}\n    PCI\n        Bus Id                            : {}\n    FB Memory Usage\n        Total                             : {} MiB\n",
            g.bus_id,
            product(g),
            ident::serial(g),
            g.uuid,
            g.index,
            if m.is_some_and(|m| m.mig_capable()) { on(g.mig_mode.current) } else { "N/A" },
            if m.is_some_and(|m| m.mig_capable()) { on(g.mig_mode.pending) } else { "N/A" },
            g.bus_id,
            m.map_or(0, |m| m.memory_mib),
        );
    }
    out
}

fn reset(ids: &str) -> ExitCode {
    let Some(path) = std::env::var_os("FAKE_NVML_STATE").map(PathBuf::from) else {
        eprintln!("FAKE_NVML_STATE is not set");
        return ExitCode::from(2);
    };
    let result = write_file(&path, |s: &mut SimState| {
        let indices: Vec<(u32, String)> = select(s, Some(ids))
            .map_err(|detail| SimError { code: NvmlCode::NotFound, detail })?
            .iter()
            .map(|g| (g.index, g.bus_id.clone()))
            .collect();
        for (index, _) in &indices {
            s.reset(*index)?;
        }
        Ok(indices)
    });
    match result {
        Ok(done) => {
            for (_, bus) in done {
                println!("GPU {bus} was successfully reset.");
            }
            println!("All done.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Unable to reset GPU {ids}: {e}");
            ExitCode::from(3)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |names: &[&str]| args.iter().any(|a| names.contains(&a.as_str()));
    let ids = args.iter().position(|a| a == "-i" || a == "--id").and_then(|i| args.get(i + 1)).cloned();
    let ids = ids.or_else(|| args.iter().find_map(|a| a.strip_prefix("--id=").map(str::to_string)));
    if has(&["--gpu-reset", "-r"]) {
        return match ids {
            Some(ids) => reset(&ids),
            None => usage(),
        };
    }
    let listing = has(&["-L", "--list-gpus"]);
    if !listing && !has(&["-q", "--query"]) {
        return usage();
    }
    let s = match state() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match select(&s, ids.as_deref()) {
        Ok(gpus) => {
            print!("{}", if listing { list(&gpus) } else { query(&s, &gpus) });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(6)
        }
    }
}
