//! The verbs: each reads its inputs, calls the pure core and a backend, and prints.

/// `print!` that returns [`StdoutClosed`] (through `?`) when the reader went away.
macro_rules! out {
    ($($t:tt)*) => { $crate::commands::io::write_stdout(&format!($($t)*))? };
}

/// `println!` that returns [`StdoutClosed`] (through `?`) when the reader went away.
macro_rules! outln {
    ($($t:tt)*) => { $crate::commands::io::write_stdout(&format!("{}\n", format!($($t)*)))? };
}

mod apply;
mod assert;
mod checkpoint;
mod export;
mod frag;
mod generate;
mod health;
mod interrupt;
mod io;
pub mod mig_parted;
mod plan;
mod status;
mod validate;

pub use crate::backend::open as open_backend;
use crate::cli::{Cli, Command, GpuArgs};
pub use io::{read_config, read_input, write_stdout, StdoutClosed};
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
        Command::Health(a) => health::run(&gpu(&a.gpu)?, a),
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
