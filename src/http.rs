//! The agent's HTTP endpoints: `/healthz` (the process and its loop are alive), `/readyz` (a
//! first reconcile has reached a result) and `/metrics` (filled by the metrics module).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Default listen address: clear of dcgm-exporter (9400) and node-exporter (9100).
pub const DEFAULT_ADDR: &str = "0.0.0.0:9477";

/// Liveness and readiness shared between the loop and the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    heartbeat: AtomicU64,
    /// A service the node needs is down (the DRA plugin's kubelet sockets): not ready meanwhile.
    down: AtomicBool,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Health {
    /// Marks the agent ready (a first reconcile reached success or a clear failure).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Whether the agent is ready: marked so, and no service it needs is down.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.down.load(Ordering::SeqCst)
    }

    /// Records whether a service the node needs is up (not ready while it is down).
    pub fn set_serving(&self, up: bool) {
        self.down.store(!up, Ordering::SeqCst);
    }

    /// Records that the loop is alive.
    pub fn beat(&self) {
        self.heartbeat.store(now(), Ordering::SeqCst);
    }

    /// Seconds since the loop last reported in.
    pub fn silence_secs(&self) -> u64 {
        now().saturating_sub(self.heartbeat.load(Ordering::SeqCst))
    }
}

/// A metrics registry the HTTP server renders.
pub trait Exposition: Send + Sync {
    /// The OpenMetrics text (a consistent view).
    fn render(&self) -> String;
}

/// Shared state of the HTTP handlers.
#[derive(Clone)]
pub struct HttpState {
    /// Liveness and readiness.
    pub health: Arc<Health>,
    /// Longest acceptable loop silence before `/healthz` fails, seconds.
    pub max_silence_secs: u64,
    /// The metrics registry.
    pub metrics: Arc<dyn Exposition>,
}

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.silence_secs() <= s.max_silence_secs {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "reconcile loop stalled\n")
    }
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first reconcile\n")
    }
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else the classic text format.
async fn metrics(State(s): State<HttpState>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("application/openmetrics-text") {
        ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.render())
    } else {
        ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], to_text(&s.metrics.render()))
    }
}

/// Listens on `addr` for `/healthz`, `/readyz` and `/metrics`, saying so in the log.
pub async fn listen(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /healthz, /readyz, /metrics");
    Ok(listener)
}

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Limits of the HTTP server: a slow or flooding client cannot hold it.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections held at once. A new connection beyond them takes the place of the oldest one
    /// that has not finished sending its request; when every held connection is being answered,
    /// the new one is closed at accept.
    pub max_connections: usize,
    /// Longest time for one connection: reading the request, answering it (one request per
    /// connection; no keep-alive).
    pub timeout: std::time::Duration,
}

/// One held connection: when it was accepted, whether its request has arrived, and how to close it.
struct Held {
    accepted: std::time::Instant,
    answering: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::AbortHandle,
}

/// The held connections by id.
type HeldMap = Arc<std::sync::Mutex<std::collections::BTreeMap<u64, Held>>>;

/// Frees a place for a new connection: nothing while below `max`, else closes the oldest
/// connection still sending its request. False when every place is taken by a connection being
/// answered.
fn make_room(held: &HeldMap, max: usize) -> bool {
    let mut map = held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if map.len() < max {
        return true;
    }
    let oldest = map
        .iter()
        .filter(|(_, h)| !h.answering.load(std::sync::atomic::Ordering::Acquire))
        .min_by_key(|(id, h)| (h.accepted, **id))
        .map(|(id, _)| *id);
    match oldest.and_then(|id| map.remove(&id)) {
        Some(victim) => {
            victim.task.abort();
            tracing::debug!("HTTP connections at their limit; closed the oldest one still sending its request");
            true
        }
        None => false,
    }
}

/// Serves `app` on `listener` under `limits` until the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, limits: ServeLimits) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt as _;
    let held: HeldMap = Arc::default();
    let max = limits.max_connections.max(1);
    let mut next_id = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if !make_room(&held, max) {
            tracing::debug!("every HTTP connection is being answered; closing a new one at accept");
            drop(stream);
            continue;
        }
        let id = next_id;
        next_id += 1;
        let answering = Arc::new(AtomicBool::new(false));
        let flag = answering.clone();
        let service =
            TowerToHyperService::new(app.clone().map_request(move |req: http::Request<hyper::body::Incoming>| {
                flag.store(true, Ordering::Release);
                req
            }));
        let map = held.clone();
        // Registered before it can finish, so its own removal below always finds it.
        let mut guard = held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let task = tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(limits.timeout).keep_alive(false);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            if tokio::time::timeout(limits.timeout, conn).await.is_err() {
                tracing::debug!("an HTTP connection ran past its time limit; closed");
            }
            map.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
        });
        guard.insert(id, Held { accepted: std::time::Instant::now(), answering, task: task.abort_handle() });
        drop(guard);
    }
}

/// The classic Prometheus text format (0.0.4) of an OpenMetrics text, for clients that do not ask
/// for OpenMetrics (curl, promtool): `info` families become `<name>_info` gauges, counter families
/// are named with their `_total` samples, and the `# EOF` marker is dropped.
pub fn to_text(open: &str) -> String {
    let mut out = String::with_capacity(open.len());
    // OpenMetrics puts HELP before TYPE; hold the HELP text until the TYPE gives the name.
    let mut help: Option<&str> = None;
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').map_or("", |(_, h)| h));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "info" => (format!("{name}_info"), "gauge"),
                "counter" => (format!("{name}_total"), "counter"),
                other => (name.to_string(), other),
            };
            if let Some(h) = help.take() {
                out.push_str(&format!("# HELP {name} {h}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}
