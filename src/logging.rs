//! Tracing setup: human lines or JSON on stderr.

use crate::cli::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber (`RUST_LOG` overrides the level).
pub fn init(format: LogFormat, debug: bool) {
    let default = if debug { "debug" } else { "info" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
