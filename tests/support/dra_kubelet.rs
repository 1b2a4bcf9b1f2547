//! A fake kubelet for DRA plugins, speaking the real protocols over real unix sockets: it watches
//! the plugin registry directory as the kubelet does, dials every new `*.sock` there by its path
//! as kubelet 1.36's plugin watcher does (the path as `:authority`: [`super::grpc_dial`]), asks
//! `GetInfo`, checks the answer (type `DRAPlugin`, a `v1.DRAPlugin` version, an endpoint that
//! exists), reports the registration, and then calls `NodePrepareResources` and
//! `NodeUnprepareResources` on the plugin's endpoint for the tests.
#![allow(dead_code)]

use gpupart::kubelet::dra::dra_plugin_client::DraPluginClient;
use gpupart::kubelet::dra::{
    Claim, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest,
};
use gpupart::kubelet::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the fake kubelet saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every registration accepted: the plugin's info.
    pub registrations: Vec<PluginInfo>,
    /// Registrations refused, with why.
    pub refused: Vec<String>,
    /// Registration calls that failed (the plugin's socket answered with an error), each once.
    pub failed: Vec<String>,
}

impl Seen {
    fn failed(&mut self, what: String) {
        if !self.failed.contains(&what) {
            self.failed.push(what);
        }
    }
}

/// A running fake kubelet.
pub struct DraKubelet {
    /// The registry directory it watches.
    pub registry: PathBuf,
    seen: Arc<Mutex<Seen>>,
    runtime: tokio::runtime::Runtime,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl DraKubelet {
    /// Starts watching `registry` (created if missing). As the kubelet does at start, it makes
    /// its `plugins_registry` and `plugins` directories under its root (`registry`'s parent).
    pub fn start(registry: &Path) -> Self {
        std::fs::create_dir_all(registry).unwrap();
        if let Some(root) = registry.parent() {
            std::fs::create_dir_all(root.join("plugins")).unwrap();
        }
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (dir, s, st) = (registry.to_path_buf(), seen.clone(), stop.clone());
        runtime.spawn(async move {
            // Socket path → (inode, change time) registered: a socket created again is new, as
            // the kubelet's plugin watcher sees a create event.
            let mut known: BTreeMap<PathBuf, (u64, i64, i64)> = BTreeMap::new();
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                known.retain(|p, _| p.exists());
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let p = e.path();
                    let Ok(m) = std::fs::metadata(&p) else { continue };
                    let id = (m.ino(), m.ctime(), m.ctime_nsec());
                    if p.extension().is_none_or(|x| x != "sock") || known.get(&p) == Some(&id) {
                        continue;
                    }
                    // A failed call is tried again, as the kubelet's reconciler does.
                    if register(&p, &s).await {
                        known.insert(p.clone(), id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Self { registry: registry.to_path_buf(), seen, runtime, stop }
    }

    /// What it saw so far.
    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }

    /// Waits for the `n`th accepted registration and returns its info.
    pub fn wait_registered(&self, n: usize) -> PluginInfo {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(info) = self.seen().registrations.get(n - 1) {
                return info.clone();
            }
            assert!(Instant::now() < deadline, "no registration #{n}: {:?}", self.seen());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn endpoint(&self) -> PathBuf {
        let seen = self.seen();
        PathBuf::from(&seen.registrations.last().expect("a registered plugin").endpoint)
    }

    /// `NodePrepareResources` for these claims (namespace, name, uid), as the kubelet calls it.
    pub fn prepare(&self, claims: &[(&str, &str, &str)]) -> BTreeMap<String, NodePrepareResourceResponse> {
        self.try_prepare(claims).expect("NodePrepareResources answers")
    }

    /// As [`DraKubelet::prepare`]; `Err` when the call itself fails (no plugin, a dropped
    /// connection).
    pub fn try_prepare(
        &self,
        claims: &[(&str, &str, &str)],
    ) -> Result<BTreeMap<String, NodePrepareResourceResponse>, String> {
        let endpoint = self.endpoint();
        let claims = to_claims(claims);
        self.runtime.block_on(async move {
            let channel = gpupart::kubelet::unix_channel(endpoint).await.map_err(|e| e.to_string())?;
            let resp = DraPluginClient::new(channel)
                .node_prepare_resources(NodePrepareResourcesRequest { claims })
                .await
                .map_err(|s| s.to_string())?;
            Ok(resp.into_inner().claims.into_iter().collect())
        })
    }

    /// `NodeUnprepareResources`; returns each claim's error ("" when done).
    pub fn unprepare(&self, claims: &[(&str, &str, &str)]) -> BTreeMap<String, String> {
        let endpoint = self.endpoint();
        let claims = to_claims(claims);
        self.runtime.block_on(async move {
            let channel = gpupart::kubelet::unix_channel(endpoint).await.expect("the plugin's endpoint");
            let resp = DraPluginClient::new(channel)
                .node_unprepare_resources(NodeUnprepareResourcesRequest { claims })
                .await
                .expect("NodeUnprepareResources answers");
            resp.into_inner().claims.into_iter().map(|(k, v)| (k, v.error)).collect()
        })
    }
}

impl Drop for DraKubelet {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn to_claims(claims: &[(&str, &str, &str)]) -> Vec<Claim> {
    claims
        .iter()
        .map(|(ns, name, uid)| Claim { namespace: ns.to_string(), name: name.to_string(), uid: uid.to_string() })
        .collect()
}

/// Registers the plugin behind `socket`; `false` when a call failed.
async fn register(socket: &Path, seen: &Arc<Mutex<Seen>>) -> bool {
    let authority = socket.display().to_string();
    let info: PluginInfo =
        match super::grpc_dial::unary(socket, &authority, "/pluginregistration.Registration/GetInfo", &InfoRequest {})
            .await
        {
            Ok(info) => info,
            Err(e) => {
                seen.lock().unwrap().failed(format!("GetInfo on {authority}: {e}"));
                return false;
            }
        };
    let problem = if info.r#type != "DRAPlugin" {
        Some(format!("type {:?} is not DRAPlugin", info.r#type))
    } else if !info.supported_versions.iter().any(|v| v == "v1.DRAPlugin") {
        Some(format!("no supported version in {:?}", info.supported_versions))
    } else if !Path::new(&info.endpoint).exists() {
        Some(format!("endpoint {} does not exist", info.endpoint))
    } else {
        None
    };
    let status =
        RegistrationStatus { plugin_registered: problem.is_none(), error: problem.clone().unwrap_or_default() };
    let notified: Result<RegistrationStatusResponse, String> = super::grpc_dial::unary(
        socket,
        &authority,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        &status,
    )
    .await;
    if let Err(e) = notified {
        seen.lock().unwrap().failed(format!("NotifyRegistrationStatus on {authority}: {e}"));
        return false;
    }
    let mut s = seen.lock().unwrap();
    match problem {
        None => s.registrations.push(info),
        Some(p) => s.refused.push(p),
    }
    true
}
