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

/// Writes the state atomically: a sibling temporary file, fsync, then rename over `path`.
pub fn save(path: &Path, state: &SimState) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: path.display().to_string(), source };
    let mut text = serde_json::to_string_pretty(state).map_err(|e| io(std::io::Error::other(e)))?;
    text.push('\n');
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state.json");
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}
