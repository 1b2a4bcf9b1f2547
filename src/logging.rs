//! Tracing setup: human lines or JSON on stderr.

use crate::cli::LogFormat;
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// kube-client logs every failed HTTP request at ERROR ("failed with error client error
/// (Connect)"), once per reconnect attempt; gpupart's own loops say it once per outage instead
/// (`kube::outage`), so that line is off unless `RUST_LOG` names `kube_client`.
const QUIET: &str = "kube_client::client::builder=off";

/// Installs the global subscriber (`RUST_LOG` overrides the level).
pub fn init(format: LogFormat, debug: bool) {
    let default = if debug { "debug" } else { "info" };
    let asked = std::env::var("RUST_LOG").ok();
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    if !asked.is_some_and(|v| v.contains("kube_client")) {
        if let Ok(quiet) = QUIET.parse() {
            filter = filter.add_directive(quiet);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Human => builder.with_target(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Prints the error that ends the program: `error: …` for people, or one JSON object (as the
/// log lines are) with `--log-format json`.
pub fn final_error(format: LogFormat, e: &anyhow::Error) {
    match format {
        LogFormat::Human => eprintln!("error: {e:#}"),
        LogFormat::Json => tracing::error!(target: "gpupart", error = %format!("{e:#}"), "failed"),
    }
}
