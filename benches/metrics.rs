//! Metrics benches (prints a table): collection time for an 8-GPU node with 56 MIG instances
//! (observe + fragmentation + registry update), and `/metrics` latency under a bounded loopback
//! load (4 clients × 500 sequential scrapes). Run: `cargo bench --bench metrics`.

use gpupart::backend::sim::SimBackend;
use gpupart::backend::GpuBackend;
use gpupart::config;
use gpupart::exec::ExecOptions;
use gpupart::http::{router, Health, HttpState};
use gpupart::metrics::Metrics;
use gpupart::reconfigure::{self, Options};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let file = config::parse(
        "version: v1\nmig-configs:\n  seven:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n",
    )
    .expect("config");
    let backend = SimBackend::open(Some("A100-SXM4-80GB:8"), None).expect("simulator");
    let opts = Options {
        force: false,
        mode_only: false,
        exec: ExecOptions { dry_run: false, parallel: 8, skip_reset: false, stop: None },
    };
    reconfigure::run(&backend, file.get("seven").expect("config"), opts).expect("applies");
    let metrics = Arc::new(Metrics::new());

    let mut collect = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let states = backend.observe_all().expect("observe");
        metrics.update(&states, None, 0.0);
        collect.push(t.elapsed());
    }
    let instances = backend.observe_all().expect("observe").iter().map(|s| s.instances.len()).sum::<usize>();
    let text = metrics.render_text();
    println!("{:<48} {:>10} {:>10}", "bench", "p50", "p99");
    let (p50, p99) = (percentile(&mut collect, 0.5), percentile(&mut collect, 0.99));
    println!("{:<48} {:>10.1?} {:>10.1?}", format!("collect 8 GPUs, {instances} instances (simulator)"), p50, p99);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let health = Arc::new(Health::default());
    health.set_ready();
    let state = HttpState { health, max_silence_secs: 3600, metrics: metrics.clone() };
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    rt.spawn(async move { axum::serve(listener, router(state)).await.expect("serve") });
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                for _ in 0..500 {
                    let t = Instant::now();
                    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("write");
                    let mut body = Vec::new();
                    s.read_to_end(&mut body).expect("read");
                    assert!(body.len() > 1000);
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat: Vec<Duration> = clients.into_iter().flat_map(|c| c.join().expect("client")).collect();
    let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
    println!(
        "{:<48} {:>10.1?} {:>10.1?}",
        format!("/metrics, 4 clients x 500, {} KiB body", text.len() / 1024),
        p50,
        p99
    );
}
