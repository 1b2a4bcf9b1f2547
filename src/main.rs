//! The `gpupart` binary: parse the command line, set up logging, run the verb.

use gpupart::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse_invoked();
    let cli_format = cli.global.log_format;
    let as_mig_parted = cli.global.as_mig_parted;
    gpupart::logging::init(cli_format, cli.global.debug);
    match gpupart::commands::run(cli) {
        Ok(code) => code,
        // `gpupart status | head -1`: the reader has what it wanted.
        Err(e) if e.is::<gpupart::commands::StdoutClosed>() => ExitCode::SUCCESS,
        Err(e) if as_mig_parted => {
            gpupart::commands::mig_parted::fatal(&format!("{e:#}"));
            ExitCode::FAILURE
        }
        Err(e) => {
            gpupart::logging::final_error(cli_format, &e);
            ExitCode::FAILURE
        }
    }
}
