//! The daemon: a control socket in the pipe directory, one command per connection, every command
//! appended to `control.log` as the real daemon logs it (`Cmd:<command>`).
//!
//! Steering for tests, through files in the pipe directory: `fake-clients` (client pids, one
//! per line: a server with these clients is reported), `fake-hang` (while it exists, commands
//! are read and logged but never answered). To make it die, kill the pid in the pid file. It
//! exits by itself when its pipe directory is removed.

use crate::paths::{log_dir, pipe_dir, PID_FILE, SOCKET};
use crate::reply::{self, State};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Hidden argument of the re-executed background daemon.
pub const CHILD_FLAG: &str = "--fake-daemon-child";

fn log(line: &str) {
    let path = log_dir().join("control.log");
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "[{secs}] INFO {line}");
    }
}

fn running_pid() -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pipe_dir().join(PID_FILE)).ok()?.trim().parse().ok()?;
    std::path::Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
}

/// `-d`: starts the daemon in its own process group, detached from stdio, and returns once it
/// has written its pid file.
pub fn spawn_background() -> ExitCode {
    if let Some(pid) = running_pid() {
        eprintln!("An instance of this daemon is already running (pid {pid})");
        return ExitCode::FAILURE;
    }
    let Ok(me) = std::env::current_exe() else {
        eprintln!("fake-nvidia-cuda-mps-control: cannot find its own executable");
        return ExitCode::FAILURE;
    };
    let spawned = Command::new(me)
        .arg(CHILD_FLAG)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fake-nvidia-cuda-mps-control: cannot start the daemon: {e}");
            return ExitCode::FAILURE;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if running_pid() == Some(child.id()) {
            return ExitCode::SUCCESS;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("fake-nvidia-cuda-mps-control: the daemon exited at start ({status}); see control.log");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    eprintln!("fake-nvidia-cuda-mps-control: the daemon wrote no pid file");
    ExitCode::FAILURE
}

fn clients() -> Vec<u32> {
    std::fs::read_to_string(pipe_dir().join("fake-clients"))
        .map(|t| t.split_whitespace().filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default()
}

/// The daemon itself (`-f`, or the re-executed child of `-d`).
pub fn run() -> ExitCode {
    let (pipe, logs) = (pipe_dir(), log_dir());
    if std::fs::create_dir_all(&pipe).is_err() || std::fs::create_dir_all(&logs).is_err() {
        eprintln!("fake-nvidia-cuda-mps-control: cannot create {} or {}", pipe.display(), logs.display());
        return ExitCode::FAILURE;
    }
    let socket = pipe.join(SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            log(&format!("ERROR cannot listen on {}: {e}", socket.display()));
            return ExitCode::FAILURE;
        }
    };
    let _ = listener.set_nonblocking(true);
    let mut st = State {
        pid: std::process::id(),
        visible: std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default(),
        thread_percentage: std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100.0),
        limits: Default::default(),
        clients: Vec::new(),
    };
    log(&format!("Starting control daemon using socket {}", socket.display()));
    let tmp = pipe.join(format!("{PID_FILE}.tmp"));
    if std::fs::write(&tmp, format!("{}\n", st.pid)).and_then(|()| std::fs::rename(&tmp, pipe.join(PID_FILE))).is_err()
    {
        return ExitCode::FAILURE;
    }
    let mut hung: Vec<UnixStream> = Vec::new();
    loop {
        if !pipe.exists() {
            return ExitCode::SUCCESS;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
        };
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        let command = line.trim().to_string();
        log(&format!("Cmd:{command}"));
        if pipe.join("fake-hang").exists() {
            hung.push(stream);
            continue;
        }
        if command == "quit" {
            log("Exiting");
            let _ = std::fs::remove_file(pipe.join(PID_FILE));
            let _ = std::fs::remove_file(&socket);
            let mut stream = stream;
            let _ = stream.write_all(reply::END.as_bytes());
            return ExitCode::SUCCESS;
        }
        st.clients = clients();
        let text = match reply::answer(&mut st, &command) {
            Ok(t) => t,
            Err(e) => {
                log(&format!("ERROR {}", e.trim()));
                format!("{}{e}", reply::REFUSED)
            }
        };
        let mut stream = stream;
        let _ = stream.write_all(format!("{text}{}", reply::END).as_bytes());
    }
}
