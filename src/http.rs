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
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Health {
    /// Marks the agent ready (a first reconcile reached success or a clear failure).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Whether the agent is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
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
        (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            crate::metrics::to_text(&s.metrics.render()),
        )
    }
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
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Longest time for one connection: reading the request, answering it (one request per
    /// connection; no keep-alive).
    pub timeout: std::time::Duration,
}

/// Serves `app` on `listener` under `limits` until the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, app: Router, limits: ServeLimits) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!("too many HTTP connections; closing one at accept");
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(limits.timeout).keep_alive(false);
            let conn = http.serve_connection(TokioIo::new(stream), service);
            if tokio::time::timeout(limits.timeout, conn).await.is_err() {
                tracing::debug!("an HTTP connection ran past its time limit; closed");
            }
        });
    }
}
