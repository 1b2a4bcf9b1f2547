//! Process liveness and termination by pid (the only `unsafe` of the MPS module: two `kill(2)`s).

/// Whether a process with this pid exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else { return false };
    if raw <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the pid can be signalled; no memory is touched.
    let exists =
        unsafe { libc::kill(raw, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !zombie(pid)
}

/// Whether `/proc/<pid>/stat` says the process has exited but was not reaped.
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Sends SIGKILL (a daemon that ignores `quit` or hangs).
pub fn kill(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        if raw > 0 {
            // SAFETY: kill(2) takes plain integers and touches no memory of this process.
            unsafe { libc::kill(raw, libc::SIGKILL) };
        }
    }
}
