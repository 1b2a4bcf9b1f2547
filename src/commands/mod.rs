//! The verbs: each reads its inputs, calls the pure core and a backend, and prints.

/// `print!` that returns [`StdoutClosed`] (through `?`) when the reader went away.
macro_rules! out {
    ($($t:tt)*) => { $crate::commands::write_stdout(&format!($($t)*))? };
}

/// `println!` that returns [`StdoutClosed`] (through `?`) when the reader went away.
macro_rules! outln {
    ($($t:tt)*) => { $crate::commands::write_stdout(&format!("{}\n", format!($($t)*)))? };
}

mod apply;
mod assert;
mod checkpoint;
mod export;
mod frag;
mod generate;
mod interrupt;
mod plan;
mod status;
mod validate;

pub use crate::backend::open as open_backend;
use crate::cli::{Cli, Command, GpuArgs};
use crate::config::{self, ConfigFile};
use anyhow::Context;
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let top = &cli.gpu;
    let debug = cli.global.debug;
    let as_mig_parted = cli.global.as_mig_parted;
    let gpu = |verb: &GpuArgs| {
        let mut g = verb.resolve(top, debug).map_err(anyhow::Error::msg)?;
        g.as_mig_parted = as_mig_parted;
        anyhow::Ok(g)
    };
    match &cli.command {
        Command::Apply(a) => apply::run(&gpu(&a.gpu)?, a),
        Command::Assert(a) => assert::run(&gpu(&a.gpu)?, a),
        Command::Export(a) => export::run(&gpu(&a.gpu)?, a),
        Command::Status(a) => status::run(&gpu(&a.gpu)?, a),
        Command::Agent(a) => crate::agent::run(&gpu(&a.gpu)?, a),
        Command::Frag(a) => frag::run(&gpu(&a.gpu)?, a),
        Command::GenerateConfig(a) => generate::run(&gpu(&a.gpu)?, a),
        Command::Checkpoint(a) => checkpoint::save(&gpu(&a.gpu)?, a),
        Command::Restore(a) => checkpoint::restore(&gpu(&a.gpu)?, a),
        Command::Controller(a) => {
            offline("controller", top, &[]);
            crate::controller::run::run(a)
        }
        Command::Validate(a) => {
            offline("validate", top, &["--simulate"]);
            validate::run(top.simulate.as_deref(), a)
        }
        Command::Plan(a) => {
            offline("plan", top, &[]);
            plan::run(a)
        }
    }
}

/// Warns about GPU options (given before the verb) that an offline verb ignores; after the
/// verb they are not offered at all.
fn offline(verb: &str, top: &GpuArgs, used: &[&str]) {
    let ignored: Vec<_> = top.given().into_iter().filter(|o| !used.contains(o)).collect();
    if !ignored.is_empty() {
        tracing::warn!("{} ignored: `{verb}` reads no GPU", ignored.join(", "));
    }
}

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
