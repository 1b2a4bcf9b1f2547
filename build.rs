//! Compiles the kubelet's gRPC APIs (proto/) with protox, a pure-Rust protobuf compiler, so a
//! fresh clone builds without protoc; and records the commit the binary is built from
//! (`GPUPART_COMMIT`: the environment's value, else `git rev-parse`, else `unknown`).

use std::path::Path;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    println!("cargo:rustc-env=GPUPART_COMMIT={}", commit());
    Ok(())
}

/// The commit: `$GPUPART_COMMIT` (an image build passes it), else git's short hash.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=GPUPART_COMMIT");
    if let Some(c) = std::env::var("GPUPART_COMMIT").ok().filter(|c| !c.trim().is_empty()) {
        return c.trim().to_string();
    }
    // Rebuild when HEAD moves (a watched path that does not exist would rerun every build).
    for p in [".git/HEAD", ".git/packed-refs"] {
        if Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD") {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            let p = format!(".git/{r}");
            if Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}
