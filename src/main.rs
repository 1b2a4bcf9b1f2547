//! The `gpupart` binary: parse the command line, set up logging, run the verb.

use clap::Parser;
use gpupart::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    gpupart::logging::init(cli.global.log_format, cli.global.debug);
    match gpupart::commands::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
