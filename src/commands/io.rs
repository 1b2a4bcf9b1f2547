//! The verbs' standard input and output: input files (`-` is stdin) and a stdout whose reader
//! may go away.

use crate::config::{self, ConfigFile};
use anyhow::Context;
use std::io::Read;
use std::path::Path;

/// Reads a file, `-` being stdin; returns its text and a name for messages. `what` names the
/// file's role in errors ("config file").
pub fn read_input(path: &Path, what: &str) -> anyhow::Result<(String, String)> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).with_context(|| format!("reading the {what} from stdin"))?;
        Ok((s, "<stdin>".to_string()))
    } else {
        let s = std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))?;
        Ok((s, path.display().to_string()))
    }
}

/// Reads and parses a config file (`-` is stdin).
pub fn read_config(path: &Path) -> anyhow::Result<ConfigFile> {
    let (text, name) = read_input(path, "config file")?;
    config::parse(&text).with_context(|| format!("invalid config file {name}"))
}

/// Standard output was closed by its reader (`gpupart status | head -1`): the verb stops
/// quietly instead of failing.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct StdoutClosed;

/// Writes `text` to standard output; a closed pipe is [`StdoutClosed`], other failures errors.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

/// Reads config `name` of a config file (`-` is stdin).
pub fn read_layout(path: &Path, name: &str) -> anyhow::Result<config::MigConfig> {
    let file = read_config(path)?;
    let chosen = file.choose(Some(name)).with_context(|| format!("config file {}", path.display()))?;
    Ok(chosen.clone())
}
