//! Loading and atomically saving the simulator state file (write to a temporary file, then
//! rename), so a process killed mid-write never leaves a torn file.

use super::state::SimState;
use std::io::Write;
use std::path::Path;

/// Why the state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O failure.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The state file is read-only: the simulated GPUs cannot change.
    #[error("{path}: the simulator's state file is read-only; nothing was changed (make it writable to change the simulated GPUs)")]
    ReadOnly {
        /// The file.
        path: String,
    },
    /// Not valid JSON for the documented format, or inconsistent.
    #[error("{path}: invalid simulator state: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Reads and validates a state file.
pub fn load(path: &Path) -> Result<SimState, StoreError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| StoreError::Io { path: path.display().to_string(), source })?;
    let state: SimState = serde_json::from_str(&text)
        .map_err(|e| StoreError::Invalid { path: path.display().to_string(), reason: e.to_string() })?;
    state.validate().map_err(|reason| StoreError::Invalid { path: path.display().to_string(), reason })?;
    Ok(state)
}

/// Writes the state atomically: a sibling temporary file, fsync, then rename over `path`. An
/// existing file keeps its permissions; a read-only one is refused (a user's statement that the
/// simulated GPUs must not change, which the rename alone would ignore).
pub fn save(path: &Path, state: &SimState) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| StoreError::Io { path: path.display().to_string(), source };
    let mode = std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o7777);
    if mode.is_some_and(|m| m & 0o222 == 0) {
        return Err(StoreError::ReadOnly { path: path.display().to_string() });
    }
    let mut text = serde_json::to_string_pretty(state).map_err(|e| io(std::io::Error::other(e)))?;
    text.push('\n');
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state.json");
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    if let Some(m) = mode {
        f.set_permissions(std::fs::Permissions::from_mode(m)).map_err(io)?;
    }
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

/// Longest wait for the state file's lock: every change under it is short, so a lock held
/// longer is a stuck or misconfigured holder, reported instead of waited on for ever.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The lock file that guards changes to the state file at `state`: `<stem>.lock` beside it.
pub fn lock_path(state: &Path) -> std::path::PathBuf {
    state.with_extension("lock")
}

/// A state file shared between processes (the CLI, the agent, the fake NVML library, test
/// harnesses): re-read when another process changed it, and changed under an exclusive lock on a
/// sibling `.lock` file so concurrent writers never lose each other's changes.
#[derive(Debug)]
pub struct SharedFile {
    path: std::path::PathBuf,
    stamp: Option<(std::time::SystemTime, u64)>,
}

/// Why a locked update failed: the store, or the change itself.
#[derive(Debug)]
pub enum UpdateError<E> {
    /// Locking, reading or writing the file failed.
    Store(StoreError),
    /// The change returned an error; nothing was written.
    Change(E),
}

fn stamp_of(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl SharedFile {
    /// Tracks `path`, taking its current version as already loaded.
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), stamp: stamp_of(path) }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> Result<std::fs::File, StoreError> {
        let lock_path = lock_path(&self.path);
        let io = |source| StoreError::Io { path: lock_path.display().to_string(), source };
        let f = std::fs::File::options().create(true).truncate(false).write(true).open(&lock_path).map_err(io)?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(f),
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() >= deadline => {
                    return Err(io(std::io::Error::other(format!(
                        "still locked by another process after {} s (a change that never ends, or another lock \
                         such as an agent's --lock-file on this file)",
                        LOCK_WAIT.as_secs()
                    ))));
                }
                Err(std::fs::TryLockError::WouldBlock) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }

    /// Replaces `state` with the file's content if another process changed the file.
    pub fn refresh(&mut self, state: &mut SimState) -> Result<(), StoreError> {
        let now = stamp_of(&self.path);
        if now != self.stamp {
            *state = load(&self.path)?;
            self.stamp = now;
        }
        Ok(())
    }

    /// Under the lock: re-reads the file into `state`, applies `change` to a copy, saves it, and
    /// only then commits it to `state`.
    pub fn update<T, E>(
        &mut self,
        state: &mut SimState,
        change: impl FnOnce(&mut SimState) -> Result<T, E>,
    ) -> Result<T, UpdateError<E>> {
        let lock = self.lock().map_err(UpdateError::Store)?;
        if self.path.exists() {
            *state = load(&self.path).map_err(UpdateError::Store)?;
        }
        let mut next = state.clone();
        let out = change(&mut next).map_err(UpdateError::Change)?;
        save(&self.path, &next).map_err(UpdateError::Store)?;
        self.stamp = stamp_of(&self.path);
        *state = next;
        drop(lock);
        Ok(out)
    }
}
