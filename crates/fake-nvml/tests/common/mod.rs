//! Helpers shared by the fake NVML's tests.

use std::path::PathBuf;

/// The built cdylib: `cargo test` leaves it in `deps/`, `cargo build` in the profile directory;
/// the newer one wins.
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    [dir.join("libfake_nvml.so"), dir.join("deps/libfake_nvml.so")]
        .into_iter()
        .filter_map(|p| std::fs::metadata(&p).and_then(|m| m.modified()).ok().map(|t| (t, p)))
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("libfake_nvml.so missing under {}", dir.display()))
}
