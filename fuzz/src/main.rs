//! One libFuzzer binary for every gpupart fuzz target; `GPUPART_FUZZ_TARGET` picks it (the
//! names are `gpupart::fuzzing::TARGETS`). Built with coverage instrumentation by scripts/fuzz.
#![no_main]

use std::sync::OnceLock;

fn target() -> fn(&[u8]) {
    static T: OnceLock<fn(&[u8])> = OnceLock::new();
    *T.get_or_init(|| {
        let name = std::env::var("GPUPART_FUZZ_TARGET").unwrap_or_default();
        match gpupart::fuzzing::TARGETS.iter().find(|(n, _)| *n == name) {
            Some((_, f)) => *f,
            None => {
                let names: Vec<&str> = gpupart::fuzzing::TARGETS.iter().map(|(n, _)| *n).collect();
                eprintln!("set GPUPART_FUZZ_TARGET to one of: {}", names.join(", "));
                std::process::exit(2)
            }
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| target()(data));
