//! The test double behaves like `nvidia-cuda-mps-control` for the calls it serves: no daemon →
//! "Cannot find MPS control daemon process" and failure; `-d` daemonizes and writes the pid file;
//! get_* return what was set (limits in whole G from 1 GiB on); unknown commands are refused
//! clearly; `quit` ends the daemon; `fake-hang` makes it stop answering.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn ctl(dir: &Path, stdin: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fake-nvidia-cuda-mps-control"));
    c.args(args)
        .env("CUDA_MPS_PIPE_DIRECTORY", dir.join("pipe"))
        .env("CUDA_MPS_LOG_DIRECTORY", dir.join("log"))
        .env("CUDA_VISIBLE_DEVICES", "GPU-1234")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(format!("{s}\n").as_bytes()).unwrap();
    } else {
        drop(child.stdin.take());
    }
    child.wait_with_output().unwrap()
}

/// Makes the daemon stop answering and sends `cmd` from a client left waiting (output piped).
fn hung_client(dir: &Path, cmd: &str) -> std::process::Child {
    std::fs::write(dir.join("pipe/fake-hang"), "").unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_fake-nvidia-cuda-mps-control"))
        .env("CUDA_MPS_PIPE_DIRECTORY", dir.join("pipe"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(format!("{cmd}\n").as_bytes()).unwrap();
    c
}

fn say(dir: &Path, cmd: &str) -> String {
    let o = ctl(dir, Some(cmd), &[]);
    assert!(o.status.success(), "{cmd}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn behaves_like_the_control_program() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let none = ctl(d, Some("get_server_list"), &[]);
    assert!(!none.status.success());
    assert_eq!(String::from_utf8_lossy(&none.stdout).trim(), "Cannot find MPS control daemon process");

    assert!(ctl(d, None, &["-d"]).status.success());
    let pid: u32 = std::fs::read_to_string(d.join("pipe/nvidia-cuda-mps-control.pid")).unwrap().trim().parse().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let again = ctl(d, None, &["-d"]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already running"));

    assert_eq!(say(d, "get_default_active_thread_percentage"), "100.0");
    say(d, "set_default_active_thread_percentage 25");
    assert_eq!(say(d, "get_default_active_thread_percentage"), "25.0");
    say(d, "set_default_device_pinned_mem_limit GPU-1234 7500M");
    assert_eq!(say(d, "get_default_device_pinned_mem_limit 0"), "7G");
    say(d, "set_default_device_pinned_mem_limit 0 512M");
    assert_eq!(say(d, "get_default_device_pinned_mem_limit GPU-1234"), "512M");
    let wrong = ctl(d, Some("set_default_device_pinned_mem_limit GPU-9999 1G"), &[]);
    assert!(!wrong.status.success() && String::from_utf8_lossy(&wrong.stderr).contains("invalid device 'GPU-9999'"));
    assert_eq!(say(d, "get_server_list"), "");
    std::fs::write(d.join("pipe/fake-clients"), "4242\n4243\n").unwrap();
    let server = say(d, "get_server_list");
    assert_eq!(say(d, &format!("get_client_list {server}")), "4242\n4243");
    let refused = ctl(d, Some("terminate_client 1 2"), &[]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not served by this test double"));

    let log = std::fs::read_to_string(d.join("log/control.log")).unwrap();
    assert!(log.contains("Cmd:set_default_active_thread_percentage 25"), "{log}");

    // Hang: the client blocks; the caller's timeout is what ends it.
    let mut c = hung_client(d, "get_server_list");
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.try_wait().unwrap().is_none(), "a hung daemon must not answer");
    c.kill().unwrap();
    c.wait().unwrap();
    std::fs::remove_file(d.join("pipe/fake-hang")).unwrap();

    say(d, "quit");
    for _ in 0..200 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!d.join("pipe/nvidia-cuda-mps-control.pid").exists());
    assert!(!ctl(d, Some("get_server_list"), &[]).status.success());
}

#[test]
fn a_daemon_that_dies_mid_command_fails_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(ctl(d, None, &["-d"]).status.success());
    let pid = std::fs::read_to_string(d.join("pipe/nvidia-cuda-mps-control.pid")).unwrap().trim().to_string();
    let c = hung_client(d, "get_default_device_pinned_mem_limit 0");
    std::thread::sleep(Duration::from_millis(200));
    assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let out = c.wait_with_output().unwrap();
    assert!(!out.status.success(), "an answer that never came is not an empty answer");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(String::from_utf8_lossy(&out.stderr).contains("closed the connection"), "{out:?}");
}
