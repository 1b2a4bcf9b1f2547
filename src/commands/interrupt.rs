//! Ctrl-C and SIGTERM during `apply`: the first one asks the executor to stop after the change
//! under way (so the report can say what was done); a second one ends the process at once. The
//! only `unsafe` here installs the handler, which does nothing but store to atomics and restore
//! the default action (both async-signal-safe).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set by the first SIGINT or SIGTERM.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that set [`STOP`].
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: signal(2) is async-signal-safe; the default action makes a second signal fatal.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to atomics and calls signal(2) (see above).
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// The signal that asked to stop (`SIGINT`, `SIGTERM`) and its exit code (128 + number), once
/// one arrived.
pub fn received() -> Option<(&'static str, u8)> {
    if !STOP.load(Ordering::SeqCst) {
        return None;
    }
    let sig = SIGNAL.load(Ordering::SeqCst);
    let name = if sig == libc::SIGTERM { "SIGTERM" } else { "SIGINT" };
    Some((name, 128u8.saturating_add(sig as u8)))
}
