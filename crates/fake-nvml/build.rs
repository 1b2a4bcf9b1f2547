//! Gives the cdylib NVML's SONAME, so loaders and tools treat it as `libnvidia-ml.so.1`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
