//! The per-GPU shared-memory directory that MPS clients get as `/dev/shm`: a tmpfs of a set size
//! (pinned host memory of MPS clients lives there), mounted by the agent when it may mount, else
//! a plain directory. Unmounted when the daemon stops.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Parses `--mps-shm-size`: `0` (plain directory), `auto` (half the host's memory, as NVIDIA's
/// device plugin sizes its MPS tmpfs), or a size in M or G. Returns bytes, `None` for `0`.
pub fn parse_size(s: &str) -> Result<Option<u64>, String> {
    match s.trim() {
        "0" => Ok(None),
        "auto" => Ok(Some(mem_total_bytes().map_or(64 << 20, |t| t / 2))),
        other => crate::config::parse_mem_limit(other)
            .map(|mib| Some(mib * 1024 * 1024))
            .ok_or_else(|| format!("invalid shm size '{other}': expected 0, auto, or e.g. 512M or 8G")),
    }
}

fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

/// Whether `path` is a mount point (per `/proc/self/mountinfo`).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = path.display().to_string();
    text.lines().any(|l| l.split_whitespace().nth(4) == Some(want.as_str()))
}

/// Mounts a tmpfs of `bytes` on `path` unless something is mounted there already.
pub fn mount(path: &Path, bytes: u64) -> Result<(), String> {
    if is_mounted(path) {
        return Ok(());
    }
    let target = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let data = CString::new(format!("size={bytes},mode=1777")).map_err(|e| e.to_string())?;
    let fstype = c"tmpfs";
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: every pointer is a valid NUL-terminated string that lives across the call.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("mounting a {bytes}-byte tmpfs on {}: {}", path.display(), std::io::Error::last_os_error()))
    }
}

/// Unmounts `path` if something is mounted there (lazily, so open files do not block it).
pub fn unmount(path: &Path) {
    if !is_mounted(path) {
        return;
    }
    let Ok(target) = CString::new(path.as_os_str().as_bytes()) else { return };
    // SAFETY: `target` is a valid NUL-terminated path string for the duration of the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        tracing::warn!(path = %path.display(), error = %std::io::Error::last_os_error(), "unmounting the MPS shm failed");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("0"), Ok(None));
        assert_eq!(super::parse_size("512M"), Ok(Some(512 << 20)));
        assert_eq!(super::parse_size("8G"), Ok(Some(8 << 30)));
        assert!(super::parse_size("auto").unwrap().unwrap() > 0);
        assert!(super::parse_size("lots").unwrap_err().contains("invalid shm size 'lots'"));
    }
}
