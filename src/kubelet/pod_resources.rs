//! The kubelet's PodResources API v1 as a source of allocations (the effect edge): `List` over
//! the kubelet's unix socket, bounded by a timeout. The agent reads it right before planning and
//! again right before the first destructive call.

use super::allocations::flatten;
use super::podresources::pod_resources_lister_client::PodResourcesListerClient;
use super::podresources::{AllocatableResourcesRequest, ListPodResourcesRequest};
use crate::observed::PodUse;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Default `--pod-resources-socket`.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

pub use gpupart_node::allocations::AllocationSource;

/// The kubelet's PodResources socket.
#[derive(Debug, Clone)]
pub struct PodResources {
    /// The socket.
    pub socket: PathBuf,
    /// Longest wait for one `List`.
    pub timeout: Duration,
}

/// Whether the source could be read, for `status -o json` and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The socket read.
    pub socket: String,
    /// Whether the last read succeeded.
    pub available: bool,
    /// Allocated devices seen (0 when unavailable).
    pub allocations: usize,
    /// Devices the kubelet can allocate (`GetAllocatableResources`; null where not served).
    pub allocatable: Option<usize>,
    /// Why it could not be read.
    pub error: Option<String>,
}

impl PodResources {
    /// The socket the global options name, with a 5 s limit per read.
    pub fn from_args(g: &crate::backend::GpuOptions) -> Self {
        Self { socket: g.pod_resources_socket.clone(), timeout: Duration::from_secs(5) }
    }

    async fn list(&self) -> Result<Vec<PodUse>, String> {
        let at = self.socket.display().to_string();
        if !self.socket.exists() {
            return Err(format!("{at} does not exist"));
        }
        let call = async {
            let channel = super::unix_channel(self.socket.clone()).await.map_err(|e| format!("{at}: {e}"))?;
            let resp = PodResourcesListerClient::new(channel)
                .list(ListPodResourcesRequest {})
                .await
                .map_err(|s| format!("{at}: List failed: {}", s.message()))?;
            Ok(flatten(&resp.into_inner()))
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("{at}: no answer within {} ms", self.timeout.as_millis()))?
    }

    /// `GetAllocatableResources`: device ids the kubelet can hand out (`None` where not served).
    async fn allocatable(&self) -> Option<usize> {
        let call = async {
            let channel = super::unix_channel(self.socket.clone()).await.ok()?;
            let resp = PodResourcesListerClient::new(channel)
                .get_allocatable_resources(AllocatableResourcesRequest {})
                .await
                .ok()?;
            Some(resp.into_inner().devices.iter().map(|d| d.device_ids.len()).sum())
        };
        tokio::time::timeout(self.timeout, call).await.ok().flatten()
    }

    /// Reads once (and what is allocatable, where served) and says how it went.
    pub fn probe(&self) -> (Result<Vec<PodUse>, String>, SourceStatus) {
        let r = self.read();
        let allocatable = if r.is_ok() { self.block(self.allocatable()).ok().flatten() } else { None };
        let st = SourceStatus {
            socket: self.socket.display().to_string(),
            available: r.is_ok(),
            allocations: r.as_ref().map_or(0, Vec::len),
            allocatable,
            error: r.as_ref().err().cloned(),
        };
        (r, st)
    }

    /// Runs `f` to completion from blocking code (inside or outside a runtime).
    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T, String> {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => Ok(h.block_on(f)),
            Err(_) => Ok(tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting a runtime for PodResources: {e}"))?
                .block_on(f)),
        }
    }
}

impl AllocationSource for PodResources {
    /// Blocking: call from a blocking thread (or outside any runtime).
    fn read(&self) -> Result<Vec<PodUse>, String> {
        self.block(self.list())?
    }
}

/// A source that says once when it becomes unreadable (and once when it is back), and tells
/// `on_change` (a metric) whether it is readable. Reads go on either way: an unreadable source
/// means the GPUs are protected by their NVML processes only.
pub struct Reported {
    inner: PodResources,
    unreadable: std::sync::atomic::AtomicBool,
    on_change: Box<dyn Fn(bool) + Send + Sync>,
}

impl Reported {
    /// Wraps `inner`; `on_change(readable)` is called after every read.
    pub fn new(inner: PodResources, on_change: Box<dyn Fn(bool) + Send + Sync>) -> Self {
        Self { inner, unreadable: std::sync::atomic::AtomicBool::new(false), on_change }
    }
}

impl AllocationSource for Reported {
    fn read(&self) -> Result<Vec<PodUse>, String> {
        use std::sync::atomic::Ordering;
        let r = self.inner.read();
        match &r {
            Err(e) if !self.unreadable.swap(true, Ordering::SeqCst) => {
                tracing::warn!(error = %e, "cannot read the kubelet's PodResources; instances are protected by their processes only");
            }
            Ok(_) if self.unreadable.swap(false, Ordering::SeqCst) => {
                tracing::info!(socket = %self.inner.socket.display(), "the kubelet's PodResources are readable again");
            }
            _ => {}
        }
        (self.on_change)(r.is_ok());
        r
    }
}
