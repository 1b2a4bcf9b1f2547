//! The device plugin for MPS slots: serves `DevicePlugin` on `<dir>/gpupart-mps.sock`, registers
//! the resource with the kubelet on `<dir>/kubelet.sock`, and registers again whenever the
//! kubelet restarts (its socket is recreated, or ours removed). Slots that disappear from the
//! layout are advertised unhealthy first, then removed after a grace period.

use super::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::api::registration_client::RegistrationClient;
use super::api::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
};
use super::slots::{self, SlotGpu, UNHEALTHY};
use super::{inode, stopped};
use futures::StreamExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The API version the plugin registers with.
pub const VERSION: &str = "v1beta1";
/// The plugin's socket, in the device-plugin directory.
pub const SOCKET: &str = "gpupart-mps.sock";
/// Default `--device-plugin-dir`.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Default `--mps-resource`.
pub const DEFAULT_RESOURCE: &str = "gpupart.io/mps";

/// Where and as what the plugin serves.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// The extended resource name.
    pub resource: String,
    /// How long removed slots stay advertised as unhealthy.
    pub retire_grace: Duration,
    /// How often the kubelet socket is checked for a kubelet restart.
    pub poll: Duration,
}

struct Shared {
    table: RwLock<Vec<SlotGpu>>,
    devices: watch::Sender<Vec<Device>>,
    /// Removed slots still advertised (unhealthy) until their deadline.
    retiring: std::sync::Mutex<Vec<(Device, tokio::time::Instant)>>,
    registrations: AtomicU64,
}

/// The running plugin: update its slots after every change.
#[derive(Clone)]
pub struct DevicePluginHandle {
    shared: Arc<Shared>,
    grace: Duration,
}

impl DevicePluginHandle {
    /// Starts the registration loop (needs a tokio runtime).
    pub fn spawn(cfg: PluginConfig) -> Self {
        let (devices, _) = watch::channel(Vec::new());
        let shared = Arc::new(Shared {
            table: RwLock::new(Vec::new()),
            devices,
            retiring: std::sync::Mutex::new(Vec::new()),
            registrations: AtomicU64::new(0),
        });
        let grace = cfg.retire_grace;
        tokio::spawn(serve_and_register(cfg, shared.clone()));
        Self { shared, grace }
    }

    /// Replaces the slots: new ones appear at once; removed ones turn unhealthy, and vanish after
    /// the grace period (unless they come back first).
    pub fn update(&self, gpus: Vec<SlotGpu>) {
        let next = slots::devices(&gpus);
        *self.shared.table.write().unwrap_or_else(|e| e.into_inner()) = gpus;
        let current = self.shared.devices.borrow().clone();
        let deadline = tokio::time::Instant::now() + self.grace;
        let mut retiring = self.shared.retiring.lock().unwrap_or_else(|e| e.into_inner());
        retiring.retain(|(d, _)| !next.iter().any(|n| n.id == d.id));
        let mut added = false;
        for d in current {
            if !next.iter().any(|n| n.id == d.id) && !retiring.iter().any(|(r, _)| r.id == d.id) {
                retiring.push((Device { health: UNHEALTHY.to_string(), ..d }, deadline));
                added = true;
            }
        }
        drop(retiring);
        self.refresh(next.clone());
        if added {
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(deadline).await;
                let table = me.shared.table.read().unwrap_or_else(|e| e.into_inner()).clone();
                me.refresh(slots::devices(&table));
            });
        }
    }

    /// Publishes `next` plus the retiring slots whose deadline has not passed.
    fn refresh(&self, mut next: Vec<Device>) {
        let now = tokio::time::Instant::now();
        let mut retiring = self.shared.retiring.lock().unwrap_or_else(|e| e.into_inner());
        retiring.retain(|(_, until)| *until > now);
        next.extend(retiring.iter().map(|(d, _)| d.clone()));
        drop(retiring);
        self.publish(next);
    }

    fn publish(&self, devices: Vec<Device>) {
        self.shared.devices.send_if_modified(|d| {
            if *d == devices {
                return false;
            }
            *d = devices;
            true
        });
    }

    /// Marks every slot of these GPUs unhealthy now (their daemon is about to stop).
    pub fn mark_unhealthy(&self, gpu_uuids: &[String]) {
        let mut table = self.shared.table.read().unwrap_or_else(|e| e.into_inner()).clone();
        for g in table.iter_mut().filter(|g| gpu_uuids.contains(&g.uuid)) {
            g.healthy = false;
        }
        self.update(table);
    }

    /// Successful registrations with the kubelet so far.
    pub fn registrations(&self) -> u64 {
        self.shared.registrations.load(Ordering::SeqCst)
    }
}

struct Service {
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
}

type DeviceStream = Pin<Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.shared.devices.subscribe();
        let stream = tokio_stream::wrappers::WatchStream::new(rx)
            .map(|devices| Ok(ListAndWatchResponse { devices }))
            .take_until(stopped(self.stop.clone()));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let table = self.shared.table.read().unwrap_or_else(|e| e.into_inner()).clone();
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: slots::preferred(
                    &table,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size.max(0) as usize,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let table = self.shared.table.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            let r = slots::allocate(&table, &c.devices_ids).map_err(|e| {
                tracing::warn!(error = %e, ids = ?c.devices_ids, "refused an MPS slot allocation");
                Status::invalid_argument(format!("gpupart: {e}"))
            })?;
            tracing::info!(ids = ?c.devices_ids, "allocated MPS slots");
            container_responses.push(r);
        }
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

async fn register(cfg: &PluginConfig) -> Result<(), String> {
    let kubelet = cfg.dir.join("kubelet.sock");
    let channel = super::unix_channel(kubelet.clone()).await.map_err(|e| format!("{}: {e}", kubelet.display()))?;
    let req = RegisterRequest {
        version: VERSION.to_string(),
        endpoint: SOCKET.to_string(),
        resource_name: cfg.resource.clone(),
        options: Some(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }),
    };
    RegistrationClient::new(channel).register(req).await.map(|_| ()).map_err(|s| s.message().to_string())
}

/// Serves on our socket and registers; starts over whenever the kubelet's socket changes (a
/// kubelet restart) or ours disappears.
async fn serve_and_register(cfg: PluginConfig, shared: Arc<Shared>) {
    let kubelet = cfg.dir.join("kubelet.sock");
    let own = cfg.dir.join(SOCKET);
    let mut waiting_logged = false;
    loop {
        let Some(kubelet_inode) = inode(&kubelet) else {
            if !waiting_logged {
                tracing::warn!(socket = %kubelet.display(), "no kubelet device-plugin socket yet; MPS slots are not advertised until it appears");
                waiting_logged = true;
            }
            tokio::time::sleep(cfg.poll).await;
            continue;
        };
        let _ = std::fs::remove_file(&own);
        let listener = match tokio::net::UnixListener::bind(&own) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(socket = %own.display(), error = %e, "cannot listen for the kubelet");
                tokio::time::sleep(cfg.poll).await;
                continue;
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let service = Service { shared: shared.clone(), stop: stop_rx.clone() };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(super::authority::incoming(listener), stopped(stop_rx)),
        );
        match register(&cfg).await {
            Ok(()) => {
                shared.registrations.fetch_add(1, Ordering::SeqCst);
                waiting_logged = false;
                tracing::info!(resource = %cfg.resource, socket = %own.display(), "registered with the kubelet");
                while inode(&kubelet) == Some(kubelet_inode) && own.exists() {
                    tokio::time::sleep(cfg.poll).await;
                }
                tracing::info!("the kubelet restarted; registering again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "registering with the kubelet failed; retrying");
                tokio::time::sleep(cfg.poll).await;
            }
        }
        let _ = stop_tx.send(true);
        let _ = server.await;
    }
}

impl crate::agent::reconcile::SlotSink for DevicePluginHandle {
    fn leaving(&self, gpu_uuids: &[String]) {
        self.mark_unhealthy(gpu_uuids);
    }
}
