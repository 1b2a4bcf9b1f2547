//! The node-local lock file: one agent per node (a second one, e.g. during a rolling update,
//! refuses to start instead of reconfiguring GPUs concurrently).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Held for the agent's lifetime; the lock is released when the process exits.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
    path: PathBuf,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("another gpupart agent (pid {holder}) holds {path}; refusing to start a second one on this node")]
    Held {
        /// The lock file.
        path: String,
        /// The PID written by the holder, when readable.
        holder: String,
    },
    /// The file could not be opened or locked.
    #[error("lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Refuses a lock file that is also another file the agent uses (the simulator's state file or
/// its lock, the status file, the config): one process would then wait on its own lock.
pub fn check_distinct(lock: &Path, others: &[(&str, PathBuf)]) -> Result<(), String> {
    let me = normalize(lock);
    for (what, other) in others {
        if normalize(other) == me {
            return Err(format!(
                "--lock-file {} is also {what} ({}): use a lock file of its own",
                lock.display(),
                other.display()
            ));
        }
    }
    Ok(())
}

/// An absolute path with its directory's symlinks resolved (the file itself need not exist).
fn normalize(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match (abs.parent().and_then(|d| d.canonicalize().ok()), abs.file_name()) {
        (Some(dir), Some(name)) => dir.join(name),
        _ => abs,
    }
}

impl NodeLock {
    /// Takes the lock at `path` (creating the file and its directory), writing this PID into it.
    pub fn acquire(path: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io { path: path.display().to_string(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = File::options().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim().to_string();
                return Err(LockError::Held {
                    path: path.display().to_string(),
                    holder: if holder.is_empty() { "unknown".into() } else { holder },
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file, path: path.to_path_buf() })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_shared_with_another_file_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("agent.lock");
        let via_dot = dir.path().join(".").join("agent.lock");
        let err = check_distinct(&lock, &[("the simulator's lock", via_dot.clone())]).unwrap_err();
        assert!(err.contains("agent.lock") && err.contains("the simulator's lock"), "{err}");
        check_distinct(&lock, &[("the simulator's lock", dir.path().join("sim.lock"))]).unwrap();
    }

    #[test]
    fn second_holder_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/agent.lock");
        let first = NodeLock::acquire(&p).unwrap();
        let err = NodeLock::acquire(&p).unwrap_err().to_string();
        assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
        drop(first);
        NodeLock::acquire(&p).unwrap();
    }
}
