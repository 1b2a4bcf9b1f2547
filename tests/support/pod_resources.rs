//! A fake kubelet PodResources server (API v1) over a real unix socket: `List` answers with the
//! allocations a test sets, or with a scripted sequence (one answer per call, then the last set),
//! so a test can make an allocation appear between two reads. Counts the calls.

use gpupart::kubelet::podresources::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use gpupart::kubelet::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// One allocated device: namespace, pod, container, resource, device id.
pub type Alloc = (&'static str, &'static str, &'static str, String, String);

/// [`Alloc`] with owned names (pods made as a test runs).
pub type OwnedAlloc = (String, String, String, String, String);

fn owned(allocs: Vec<Alloc>) -> Vec<OwnedAlloc> {
    allocs.into_iter().map(|(ns, pod, c, r, id)| (ns.into(), pod.into(), c.into(), r, id)).collect()
}

#[derive(Default)]
struct State {
    current: Vec<OwnedAlloc>,
    script: VecDeque<Vec<OwnedAlloc>>,
    calls: usize,
    allocatable: Vec<(String, String)>,
}

fn response(allocs: &[OwnedAlloc]) -> ListPodResourcesResponse {
    let mut pods: Vec<PodResources> = Vec::new();
    for (ns, pod, container, resource, id) in allocs {
        let idx = match pods.iter().position(|p| p.name == *pod && p.namespace == *ns) {
            Some(i) => i,
            None => {
                pods.push(PodResources { name: pod.to_string(), namespace: ns.to_string(), containers: Vec::new() });
                pods.len() - 1
            }
        };
        let p = &mut pods[idx];
        let c = match p.containers.iter().position(|c| c.name == *container) {
            Some(i) => i,
            None => {
                p.containers.push(ContainerResources { name: container.to_string(), ..Default::default() });
                p.containers.len() - 1
            }
        };
        p.containers[c].devices.push(ContainerDevices {
            resource_name: resource.clone(),
            device_ids: vec![id.clone()],
            topology: None,
        });
    }
    ListPodResourcesResponse { pod_resources: pods }
}

struct Lister(Arc<Mutex<State>>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(&self, _: Request<ListPodResourcesRequest>) -> Result<Response<ListPodResourcesResponse>, Status> {
        let mut st = self.0.lock().unwrap();
        st.calls += 1;
        if let Some(next) = st.script.pop_front() {
            st.current = next;
        }
        Ok(Response::new(response(&st.current)))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let st = self.0.lock().unwrap();
        let devices = st
            .allocatable
            .iter()
            .map(|(resource, id)| ContainerDevices {
                resource_name: resource.clone(),
                device_ids: vec![id.clone()],
                topology: None,
            })
            .collect();
        Ok(Response::new(AllocatableResourcesResponse { devices, ..Default::default() }))
    }

    async fn get(&self, _: Request<GetPodResourcesRequest>) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("this fake kubelet serves List only"))
    }
}

/// The running fake; stops on drop.
pub struct FakePodResources {
    /// Its socket.
    pub socket: PathBuf,
    state: Arc<Mutex<State>>,
    _rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakePodResources {
    /// Serves on `socket` (its directory is created).
    pub fn start(socket: &Path) -> Self {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(socket);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let listener = rt.block_on(async { tokio::net::UnixListener::bind(socket) }).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(Lister(state.clone())))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                }),
        );
        Self { socket: socket.to_path_buf(), state, _rt: rt, stop: Some(tx) }
    }

    /// Answers every `List` with these allocations from now on.
    pub fn set(&self, allocs: Vec<Alloc>) {
        self.set_owned(owned(allocs));
    }

    /// [`FakePodResources::set`] with owned names.
    pub fn set_owned(&self, allocs: Vec<OwnedAlloc>) {
        let mut st = self.state.lock().unwrap();
        st.script.clear();
        st.current = allocs;
    }

    /// Answers the next calls with these lists, one per call (the last then stays).
    pub fn script(&self, lists: Vec<Vec<Alloc>>) {
        self.state.lock().unwrap().script = lists.into_iter().map(owned).collect();
    }

    /// What `GetAllocatableResources` answers: (resource, device id).
    pub fn set_allocatable(&self, devices: Vec<(String, String)>) {
        self.state.lock().unwrap().allocatable = devices;
    }

    /// `List` calls so far.
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}
