//! A fake kubelet speaking the real device plugin protocol over real unix sockets: it serves
//! `Registration` on `<dir>/kubelet.sock`, and on each registration dials the plugin's endpoint,
//! asks for its options and keeps a `ListAndWatch` stream, recording every device list. Tests
//! call `Allocate` and `GetPreferredAllocation` through it as the kubelet would, and restart it
//! the way the kubelet restarts (its socket recreated, plugin sockets removed).

use gpupart::kubelet::api::device_plugin_client::DevicePluginClient;
use gpupart::kubelet::api::registration_server::{Registration, RegistrationServer};
use gpupart::kubelet::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Device,
    DevicePluginOptions, Empty, PreferredAllocationRequest, RegisterRequest,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// What the fake kubelet saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every registration, in order.
    pub registrations: Vec<RegisterRequest>,
    /// The plugin's options, as answered after the last registration.
    pub options: Option<DevicePluginOptions>,
    /// Every device list the plugin sent, in order.
    pub lists: Vec<Vec<Device>>,
}

struct Reg {
    dir: PathBuf,
    seen: Arc<Mutex<Seen>>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = req.into_inner();
        if req.version != "v1beta1" {
            return Err(Status::invalid_argument(format!("unsupported version {}", req.version)));
        }
        let endpoint = self.dir.join(&req.endpoint);
        self.seen.lock().unwrap().registrations.push(req);
        let seen = self.seen.clone();
        // As the kubelet: dial back, read the options, keep the device stream open.
        tokio::spawn(async move {
            let Ok(channel) = gpupart::kubelet::unix_channel(endpoint).await else { return };
            let mut client = DevicePluginClient::new(channel);
            if let Ok(o) = client.get_device_plugin_options(Empty {}).await {
                seen.lock().unwrap().options = Some(o.into_inner());
            }
            let Ok(stream) = client.list_and_watch(Empty {}).await else { return };
            let mut stream = stream.into_inner();
            while let Ok(Some(list)) = stream.message().await {
                seen.lock().unwrap().lists.push(list.devices);
            }
        });
        Ok(Response::new(Empty {}))
    }
}

/// The running fake kubelet.
pub struct FakeKubelet {
    /// The device-plugin directory.
    pub dir: PathBuf,
    /// What it saw.
    pub seen: Arc<Mutex<Seen>>,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeKubelet {
    /// Starts serving `<dir>/kubelet.sock` (the directory is created).
    pub fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut k = Self { dir: dir.to_path_buf(), seen: Arc::default(), rt, stop: None };
        k.serve();
        k
    }

    fn serve(&mut self) {
        let sock = self.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&sock);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let reg = Reg { dir: self.dir.clone(), seen: self.seen.clone() };
        let listener = self.rt.block_on(async { tokio::net::UnixListener::bind(&sock) }).unwrap();
        self.rt.spawn(
            // As the kubelet's Go gRPC server: any `:authority` a client sends on a unix socket is
            // accepted (grpc-go sends the socket's path, which h2 alone would refuse).
            tonic::transport::Server::builder().add_service(RegistrationServer::new(reg)).serve_with_incoming_shutdown(
                gpupart::kubelet::authority::incoming(listener),
                async {
                    let _ = rx.await;
                },
            ),
        );
        self.stop = Some(tx);
    }

    /// Restarts as the kubelet does: stops, removes every socket in the directory, serves again.
    pub fn restart(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        std::thread::sleep(Duration::from_millis(50));
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "sock") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        self.serve();
    }

    /// The last device list, as (id, health).
    pub fn devices(&self) -> Vec<(String, String)> {
        self.seen
            .lock()
            .unwrap()
            .lists
            .last()
            .map_or_else(Vec::new, |l| l.iter().map(|d| (d.id.clone(), d.health.clone())).collect())
    }

    /// Waits until `f` holds for the last device list.
    pub fn wait_devices(&self, what: &str, f: impl Fn(&[(String, String)]) -> bool) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let d = self.devices();
            if f(&d) {
                return d;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last list {d:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Registrations so far.
    pub fn registrations(&self) -> usize {
        self.seen.lock().unwrap().registrations.len()
    }

    fn client(&self) -> DevicePluginClient<tonic::transport::Channel> {
        let ep = self.dir.join(&self.seen.lock().unwrap().registrations.last().expect("registered").endpoint);
        DevicePluginClient::new(self.rt.block_on(gpupart::kubelet::unix_channel(ep)).unwrap())
    }

    /// `Allocate` for one container asking for `ids`.
    pub fn allocate(&self, ids: &[&str]) -> Result<AllocateResponse, Status> {
        let mut c = self.client();
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.iter().map(|s| s.to_string()).collect(),
            }],
        };
        self.rt.block_on(c.allocate(req)).map(Response::into_inner)
    }

    /// `GetPreferredAllocation` for one container.
    pub fn preferred(&self, available: &[String], size: i32) -> Vec<String> {
        let mut c = self.client();
        let req = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: Vec::new(),
                allocation_size: size,
            }],
        };
        let r = self.rt.block_on(c.get_preferred_allocation(req)).unwrap().into_inner();
        r.container_responses[0].device_i_ds.clone()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
