//! The DRA kubelet plugin's sockets: `Registration` on `<registry>/<driver>-reg.sock` (the
//! kubelet finds it there, asks `GetInfo` and reports the outcome) and `DRAPlugin` on
//! `<plugins>/<driver>/dra.sock`. Both sockets are owner-only; when either disappears (a kubelet
//! restart cleaning its directories, or a hand), both are served again so the kubelet registers
//! the plugin anew. At start ([`Sockets::open`]) the kubelet's directories must exist (the kubelet
//! makes them under its `--root-dir`), the plugin's folder `<plugins>/<driver>/` is locked (one
//! plugin per driver and directories) and both sockets are bound once: whatever fails is an error
//! naming the path, with nothing left behind. The claims themselves are handled by a
//! [`ClaimHandler`].

use super::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use super::dra::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use super::registration::registration_server::{Registration, RegistrationServer};
use super::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::{inode, stopped};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The plugin type the kubelet expects.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service versions served.
pub const VERSIONS: &[&str] = &["v1.DRAPlugin"];
/// Default `--kubelet-registry-dir`.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default `--kubelet-plugins-dir`.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// Prepares and unprepares claims (the plugin's one job).
#[tonic::async_trait]
pub trait ClaimHandler: Send + Sync + 'static {
    /// Prepares each claim; a claim's error is its answer's `error`.
    async fn prepare(&self, claims: Vec<Claim>) -> HashMap<String, NodePrepareResourceResponse>;
    /// Unprepares each claim.
    async fn unprepare(&self, claims: Vec<Claim>) -> HashMap<String, NodeUnprepareResourceResponse>;
}

/// Where the plugin's sockets go.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// The DRA driver's name.
    pub driver: String,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory.
    pub plugins_dir: PathBuf,
    /// How often the sockets are checked.
    pub poll: Duration,
}

impl Sockets {
    /// `<registry>/<driver>-reg.sock`.
    pub fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// `<plugins>/<driver>/dra.sock`.
    pub fn service(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver).join("dra.sock")
    }
}

/// Both sockets, bound: the DRA service and the registration.
pub type Bound = (tokio::net::UnixListener, tokio::net::UnixListener);

/// The plugin's hold on its folder (`<plugins>/<driver>/plugin.lock`), kept while it runs; its
/// sockets are removed when it is dropped (the plugin stops, or fails after the start).
#[derive(Debug)]
pub struct FolderLock {
    _lock: crate::agent::lock::NodeLock,
    sockets: [PathBuf; 2],
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        for p in &self.sockets {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Sockets {
    /// Checks the kubelet's directories, creates and locks the plugin's folder and binds both
    /// sockets, for the start: an error names the path and what is wrong, and removes the
    /// sockets and folder it made.
    pub fn open(&self) -> Result<(FolderLock, Bound), String> {
        for (flag, dir) in
            [("--kubelet-registry-dir", &self.registry_dir), ("--kubelet-plugins-dir", &self.plugins_dir)]
        {
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{flag} {}: not a directory", dir.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "{flag} {}: no such directory; the kubelet makes it under its --root-dir (default /var/lib/kubelet): is its root elsewhere?",
                        dir.display()
                    ))
                }
                Err(e) => return Err(format!("{flag} {}: {e}", dir.display())),
            }
        }
        let folder = self.plugins_dir.join(&self.driver);
        let made = !folder.exists();
        let undo = |bound: &[&Path]| {
            for p in bound {
                let _ = std::fs::remove_file(p);
            }
            if made {
                let _ = std::fs::remove_file(folder.join(LOCK_FILE));
                let _ = std::fs::remove_dir(&folder);
            }
        };
        if let Err(e) = std::fs::create_dir_all(&folder) {
            return Err(format!("--kubelet-plugins-dir: cannot make the plugin's folder {}: {e}", folder.display()));
        }
        let lock = match crate::agent::lock::NodeLock::acquire(&folder.join(LOCK_FILE)) {
            Ok(l) => l,
            Err(crate::agent::lock::LockError::Held { holder, .. }) => {
                return Err(format!(
                    "another DRA plugin (pid {holder}) serves driver {} from {}; refusing to replace its sockets",
                    self.driver,
                    folder.display()
                ))
            }
            Err(e) => {
                undo(&[]);
                return Err(format!("--kubelet-plugins-dir: {e}"));
            }
        };
        let (svc_path, reg_path) = (self.service(), self.registration());
        let svc = match bind_private(&svc_path) {
            Ok(l) => l,
            Err(e) => {
                undo(&[&svc_path]);
                return Err(format!("--kubelet-plugins-dir: cannot serve {}: {e}", svc_path.display()));
            }
        };
        let reg = match bind_private(&reg_path) {
            Ok(l) => l,
            Err(e) => {
                undo(&[&svc_path, &reg_path]);
                return Err(format!("--kubelet-registry-dir: cannot serve {}: {e}", reg_path.display()));
            }
        };
        Ok((FolderLock { _lock: lock, sockets: [svc_path, reg_path] }, (svc, reg)))
    }
}

/// The lock file in the plugin's folder.
const LOCK_FILE: &str = "plugin.lock";

/// What the kubelet said of the registrations so far.
#[derive(Debug, Default)]
pub struct RegistrationLog {
    /// `GetInfo` calls answered.
    pub infos: AtomicU64,
    /// Successful registrations reported by the kubelet.
    pub registered: AtomicU64,
    /// Times the sockets were (re)created.
    pub served: AtomicU64,
}

struct Reg {
    info: PluginInfo,
    log: Arc<RegistrationLog>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.log.infos.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            self.log.registered.fetch_add(1, Ordering::SeqCst);
            tracing::info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
        } else {
            tracing::warn!(driver = %self.info.name, error = %s.error, "the kubelet refused to register the DRA plugin");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct Service<H> {
    handler: Arc<H>,
}

#[tonic::async_trait]
impl<H: ClaimHandler> DraPlugin for Service<H> {
    async fn node_prepare_resources(
        &self,
        req: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let claims = self.handler.prepare(req.into_inner().claims).await;
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = self.handler.unprepare(req.into_inner().claims).await;
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

/// Binds a unix socket readable and writable by its owner only (the kubelet runs as root).
fn bind_private(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves both sockets until `stop`; serves them again whenever one disappears.
pub async fn serve<H: ClaimHandler>(
    sockets: Sockets,
    first: Bound,
    handler: Arc<H>,
    log: Arc<RegistrationLog>,
    serving: impl Fn(bool) + Send + 'static,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = Some(first);
    // Failed attempts in a row: the first is warned of, the rest only counted.
    let mut failed = 0u32;
    let info = PluginInfo {
        r#type: PLUGIN_TYPE.to_string(),
        name: sockets.driver.clone(),
        endpoint: sockets.service().display().to_string(),
        supported_versions: VERSIONS.iter().map(|v| v.to_string()).collect(),
    };
    loop {
        let (reg_path, svc_path) = (sockets.registration(), sockets.service());
        let bound = match first.take() {
            Some(b) => Ok(b),
            // The plugin's own folder is made again if a hand removed it; the kubelet's are not.
            None => std::fs::create_dir_all(sockets.plugins_dir.join(&sockets.driver))
                .and_then(|()| bind_private(&svc_path))
                .and_then(|s| Ok((s, bind_private(&reg_path)?))),
        };
        let (svc, reg) = match bound {
            Ok(l) => l,
            Err(e) => {
                // Not ready while the kubelet cannot reach the plugin.
                serving(false);
                if failed == 0 {
                    tracing::warn!(error = %e, registration = %reg_path.display(), service = %svc_path.display(), "cannot listen for the kubelet; not ready, retrying (logged once until it listens again)");
                } else {
                    tracing::debug!(error = %e, attempts = failed + 1, "still cannot listen for the kubelet");
                }
                failed += 1;
                tokio::select! {
                    _ = tokio::time::sleep(sockets.poll) => continue,
                    _ = stop.changed() => {
                        let _ = std::fs::remove_file(&reg_path);
                        let _ = std::fs::remove_file(&svc_path);
                        return;
                    }
                }
            }
        };
        serving(true);
        if failed > 0 {
            tracing::info!(failed_attempts = failed, "listening for the kubelet again; ready");
            failed = 0;
        }
        log.served.fetch_add(1, Ordering::SeqCst);
        let inodes = (inode(&reg_path), inode(&svc_path));
        let (halt_tx, halt_rx) = watch::channel(false);
        let svc_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DraPluginServer::from_arc(Arc::new(Service { handler: handler.clone() })))
                .serve_with_incoming_shutdown(super::authority::incoming(svc), stopped(halt_rx.clone())),
        );
        let reg_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Reg { info: info.clone(), log: log.clone() }))
                .serve_with_incoming_shutdown(super::authority::incoming(reg), stopped(halt_rx)),
        );
        tracing::info!(registration = %reg_path.display(), service = %svc_path.display(), "serving the kubelet");
        let stopping = loop {
            tokio::select! {
                _ = tokio::time::sleep(sockets.poll) => {}
                _ = stop.changed() => break true,
            }
            if (inode(&reg_path), inode(&svc_path)) != inodes {
                tracing::info!("a plugin socket disappeared (kubelet restart?); serving and registering again");
                break false;
            }
        };
        let _ = halt_tx.send(true);
        for (task, which) in [(svc_task, "DRA service"), (reg_task, "registration")] {
            if let Ok(Err(e)) = task.await {
                tracing::warn!(server = which, error = %e, "the kubelet socket's server failed");
            }
        }
        if stopping {
            let _ = std::fs::remove_file(&reg_path);
            let _ = std::fs::remove_file(&svc_path);
            return;
        }
    }
}
