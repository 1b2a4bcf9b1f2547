//! The agent's HTTP server under slow and flooding clients: connections that never finish their
//! request are closed after `--http-timeout`, a connection beyond `--http-max-connections` takes
//! the place of the oldest one still sending its request, so `/metrics` answers even while
//! hundreds of half-sent requests are open, and the reconcile goes on meanwhile.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::baremetal::start;
use support::Node;

fn try_scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then_some(out)
}

#[test]
fn slow_and_flooding_clients_cannot_hold_the_server() {
    let node = Node::new("A100-SXM4-80GB:1");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    let agent =
        start(&node, &layout, &["--poll-interval", "100ms", "--http-max-connections", "4", "--http-timeout", "500ms"]);
    agent.wait_for("success", "all-balanced");
    assert!(try_scrape(agent.port).is_some());

    // Slow clients take every slot with a request they never finish.
    let mut slow: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc").unwrap();
            s
        })
        .collect();
    // A flood of idle connections on top.
    let flood: Vec<TcpStream> = (0..64).filter_map(|_| TcpStream::connect(("127.0.0.1", agent.port)).ok()).collect();
    let t = Instant::now();
    // The reconcile is not held: a layout change lands while the server is saturated.
    std::fs::write(&layout, "mixed-3g-2g\n").unwrap();
    agent.wait_for("success", "mixed-3g-2g");
    // The slow clients are cut off: replaced by the flood, or after the time limit.
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => {
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"), "slow client got an answer")
            }
            // Replaced by a newer connection: closed with its request unread, so reset.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("slow client not cut off within 3 s: {e}"),
        }
    }
    let cut = t.elapsed();
    assert!(cut < Duration::from_secs(3), "slow clients held the server for {cut:?}");
    // And a scrape succeeds again right after.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut answered = None;
    while answered.is_none() && Instant::now() < deadline {
        answered = try_scrape(agent.port);
        std::thread::sleep(Duration::from_millis(20));
    }
    let back = t.elapsed();
    assert!(answered.is_some_and(|m| m.contains("gpupart_build_info")), "/metrics did not come back");
    println!(
        "slow clients cut after {} ms; /metrics answering again {} ms after the flood",
        cut.as_millis(),
        back.as_millis()
    );
    drop(flood);
}

/// Opens `n` connections that each send half a request and wait.
fn half_sent(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: loc").ok()?;
            Some(s)
        })
        .collect()
}

#[test]
fn a_scrape_is_answered_while_hundreds_of_half_sent_requests_are_open() {
    let node = Node::new("A100-SXM4-80GB:1");
    let layout = node.dir.path().join("layout");
    std::fs::write(&layout, "all-balanced\n").unwrap();
    // The default limits: 32 connections, 5 s per connection.
    let agent = start(&node, &layout, &["--poll-interval", "100ms"]);
    agent.wait_for("success", "all-balanced");
    let mut open = Vec::new();
    for total in [300, 1000] {
        open.extend(half_sent(agent.port, total - open.len()));
        assert_eq!(open.len(), total, "the flood itself connected");
        let t = Instant::now();
        let answer = try_scrape(agent.port);
        let took = t.elapsed();
        assert!(
            answer.is_some_and(|m| m.contains("gpupart_build_info")),
            "no /metrics with {total} half-sent requests"
        );
        println!("/metrics answered in {} ms with {total} half-sent requests open", took.as_millis());
    }
}
