//! The binary that ships runs on the hosts NVIDIA supports: `scripts/release` (which
//! `scripts/test` runs first) builds it linked against glibc 2.28, stripped and without debug
//! info. Read here as the loader reads it: the glibc symbol versions it requires, its sections,
//! its size, and that it runs.

use std::path::PathBuf;
use std::process::Command;

/// The oldest glibc the shipped binary may need: RHEL 8's.
const GLIBC_FLOOR: (u32, u32) = (2, 28);
/// Its size limit (stripped, it measured 24.2 MB on x86_64; 155 MB with the debug info it had).
const MAX_BYTES: u64 = 32 * 1024 * 1024;

fn shipped() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let arch = std::env::consts::ARCH;
    target.join(format!("{arch}-unknown-linux-gnu/release/gpupart"))
}

#[test]
fn the_shipped_binary_needs_at_most_glibc_2_28_and_is_small() {
    let bin = shipped();
    assert!(bin.exists(), "{} is missing: scripts/release builds it (scripts/test runs it first)", bin.display());
    let out = Command::new("objdump").arg("-T").arg(&bin).output().expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -T: {}", String::from_utf8_lossy(&out.stderr));
    let symbols = String::from_utf8_lossy(&out.stdout);
    let versions: Vec<(u32, u32)> = symbols
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .collect();
    assert!(!versions.is_empty(), "no glibc symbol versions read:\n{symbols}");
    let newest = versions.iter().max().copied().unwrap_or_default();
    assert!(newest <= GLIBC_FLOOR, "needs GLIBC_{}.{}, more than {:?}", newest.0, newest.1, GLIBC_FLOOR);
    let sections = Command::new("objdump").arg("-h").arg(&bin).output().expect("objdump -h");
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(!sections.contains(".debug_"), "debug info ships:\n{sections}");
    assert!(!sections.contains(".symtab"), "symbols are not stripped:\n{sections}");
    let size = std::fs::metadata(&bin).unwrap().len();
    assert!(size <= MAX_BYTES, "{size} bytes, more than {MAX_BYTES}");
    // It runs here, and as nvidia-mig-parted beside it.
    let version = Command::new(&bin).arg("--version").output().unwrap();
    assert!(version.status.success() && String::from_utf8_lossy(&version.stdout).starts_with("gpupart "));
    let link = bin.with_file_name("nvidia-mig-parted");
    let help = Command::new(&link).arg("--help").output().expect("the nvidia-mig-parted link");
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage: nvidia-mig-parted"));
    println!("{}: {size} bytes, glibc {}.{} at most", bin.display(), newest.0, newest.1);
}
