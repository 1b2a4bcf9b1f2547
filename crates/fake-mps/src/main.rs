//! `fake-nvidia-cuda-mps-control`: a test double of NVIDIA's MPS control program.
//!
//! Like the real program: `-d` daemonizes (pid file `nvidia-cuda-mps-control.pid` and a control
//! socket in `CUDA_MPS_PIPE_DIRECTORY`, `control.log` in `CUDA_MPS_LOG_DIRECTORY`); `-f` runs the
//! daemon in the foreground; without options one command is read from stdin, sent to the
//! daemon and its reply printed, failing with "Cannot find MPS control daemon process" when none
//! runs. See README.md for the commands it serves and how tests steer it.

mod daemon;
mod paths;
mod reply;

use paths::{pipe_dir, SOCKET};

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => client(),
        Some("-d") => daemon::spawn_background(),
        Some("-f") | Some(daemon::CHILD_FLAG) => daemon::run(),
        Some(other) => {
            eprintln!("fake-nvidia-cuda-mps-control: option '{other}' is not served by this test double (serves -d, -f, or a command on stdin)");
            ExitCode::from(2)
        }
    }
}

/// Client mode: one command from stdin to the daemon, its reply to stdout.
fn client() -> ExitCode {
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        eprintln!("fake-nvidia-cuda-mps-control: cannot read the command from stdin");
        return ExitCode::FAILURE;
    }
    let Some(command) = input.lines().map(str::trim).find(|l| !l.is_empty()) else {
        return ExitCode::SUCCESS;
    };
    let Ok(mut stream) = UnixStream::connect(pipe_dir().join(SOCKET)) else {
        println!("Cannot find MPS control daemon process");
        return ExitCode::FAILURE;
    };
    if stream.write_all(format!("{command}\n").as_bytes()).is_err() {
        println!("Cannot find MPS control daemon process");
        return ExitCode::FAILURE;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    // The real client fails when the daemon goes away mid-command; so does this one.
    let Some(reply) = reply.strip_suffix(reply::END) else {
        eprintln!(
            "fake-nvidia-cuda-mps-control: the MPS control daemon closed the connection before answering '{command}'"
        );
        return ExitCode::FAILURE;
    };
    match reply.strip_prefix(reply::REFUSED) {
        Some(why) => {
            eprint!("{why}");
            ExitCode::FAILURE
        }
        None => {
            print!("{reply}");
            ExitCode::SUCCESS
        }
    }
}
