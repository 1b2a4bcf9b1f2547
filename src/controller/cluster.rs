//! The controller's Kubernetes edge: caches of every Node and every Pod (watched), the layouts
//! ConfigMap, the one Node patch per decision, and Events. Writes name the `gpupart-controller`
//! field manager.

use super::pods;
use crate::cli::ObjectName;
use crate::kube::outage::Outage;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::Client;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Field manager of every controller write.
pub const FIELD_MANAGER: &str = "gpupart-controller";
/// Key of the config inside the layouts ConfigMap.
pub const CONFIG_KEY: &str = "config.yaml";
/// Annotation on the layouts ConfigMap: `off` pauses the controller.
pub const SWITCH: &str = "gpupart.io/controller";
/// `reportingController` of the controller's Events.
pub const REPORTING_CONTROLLER: &str = "gpupart.io/controller";

/// The layouts ConfigMap as read.
#[derive(Debug, Clone, Default)]
pub struct Layouts {
    /// Its `config.yaml` (empty when missing).
    pub text: String,
    /// The off switch is set.
    pub paused: bool,
    /// resourceVersion (`None`: the ConfigMap does not exist).
    pub resource_version: Option<String>,
}

/// A write that failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Someone changed the object since it was read (409): retry from a fresh read.
    #[error("{0} changed since it was read")]
    Conflict(String),
    /// Any other failure.
    #[error("{what}: {source}")]
    Failed {
        /// What was written.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

fn write_error(what: String, e: kube::Error) -> WriteError {
    match e {
        kube::Error::Api(s) if s.code == 409 => WriteError::Conflict(what),
        source => WriteError::Failed { what, source },
    }
}

/// The controller's view of the cluster and its writes.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    nodes: Store<Node>,
    pods: Store<Pod>,
    layouts: ObjectName,
    identity: String,
    dra: Option<DraStores>,
    events: super::events::EventQueue,
}

/// The DRA objects as the caches hold them.
#[derive(Debug, Clone, Default)]
pub struct DraObjects {
    /// Every ResourceSlice.
    pub slices: Vec<ResourceSlice>,
    /// Every ResourceClaim.
    pub claims: Vec<ResourceClaim>,
    /// Every DeviceClass.
    pub classes: Vec<DeviceClass>,
}

/// What the defragmenter watches on DRA nodes.
#[derive(Clone)]
struct DraStores {
    slices: Store<ResourceSlice>,
    claims: Store<ResourceClaim>,
    classes: Store<DeviceClass>,
}

/// Watches `api` (narrowed by `config`) into a store; `changed` hears of every event
/// `relevant` keeps.
fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    changed: mpsc::Sender<()>,
    relevant: impl Fn(&K) -> bool + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        let mut stream = reflector::reflector(writer, watcher::watcher(api, config)).boxed();
        let mut outage = Outage::new(what);
        while let Some(ev) = stream.next().await {
            let fire = match ev {
                Ok(WatchEvent::Apply(o) | WatchEvent::Delete(o)) => {
                    outage.ok();
                    relevant(&o)
                }
                // The first list fires once, when done; each object still passes `relevant`,
                // which may remember it.
                Ok(WatchEvent::InitApply(o)) => {
                    relevant(&o);
                    false
                }
                Ok(WatchEvent::InitDone) => {
                    outage.ok();
                    true
                }
                Ok(_) => false,
                Err(e) => {
                    tokio::time::sleep(outage.failed(&e)).await;
                    false
                }
            };
            if fire && changed.try_send(()).is_err() && changed.is_closed() {
                return;
            }
        }
    });
    reader
}

impl Cluster {
    /// Starts the watches; `changed` hears of every change of a Node or a GPU pod (with `dra`,
    /// also of pods that use ResourceClaims, and of ResourceSlices and ResourceClaims, watched
    /// for the defragmenter).
    pub fn start(
        client: Client,
        layouts: ObjectName,
        identity: String,
        changed: mpsc::Sender<()>,
        mps_resource: String,
        dra: bool,
        events_per_batch: usize,
    ) -> Self {
        let all = watcher::Config::default;
        let nodes =
            spawn_watch(Api::<Node>::all(client.clone()), all(), "watching the nodes", changed.clone(), |_| true);
        let uses_claims =
            |p: &Pod| p.spec.as_ref().is_some_and(|s| s.resource_claims.as_ref().is_some_and(|c| !c.is_empty()));
        let gpu_pod = move |p: &Pod| !matches!(pods::read(p, &mps_resource), Ok(None)) || (dra && uses_claims(p));
        let pods = spawn_watch(Api::<Pod>::all(client.clone()), all(), "watching the pods", changed.clone(), gpu_pod);
        // The off switch on the layouts ConfigMap takes effect at once, on and off (its other
        // changes, the controller's own layout writes among them, start no batch).
        let switch = std::sync::Mutex::new(None::<Option<String>>);
        let switched = move |cm: &ConfigMap| {
            let now = cm.metadata.annotations.as_ref().and_then(|a| a.get(SWITCH)).cloned();
            let mut last = switch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let fire = last.as_ref().is_some_and(|l| *l != now);
            *last = Some(now);
            fire
        };
        let by_name = all().fields(&format!("metadata.name={}", layouts.name));
        let cms = Api::<ConfigMap>::namespaced(client.clone(), &layouts.namespace);
        let _switch: Store<ConfigMap> =
            spawn_watch(cms, by_name, "watching the layouts ConfigMap", changed.clone(), switched);
        let dra = dra.then(|| DraStores {
            slices: spawn_watch(
                Api::all(client.clone()),
                all(),
                "watching the ResourceSlices",
                changed.clone(),
                |_| true,
            ),
            claims: spawn_watch(
                Api::all(client.clone()),
                all(),
                "watching the ResourceClaims",
                changed.clone(),
                |_| true,
            ),
            classes: spawn_watch(Api::all(client.clone()), all(), "watching the DeviceClasses", changed, |_| false),
        });
        Self { client, nodes, pods, layouts, identity, dra, events: super::events::EventQueue::new(events_per_batch) }
    }

    /// Waits until the caches hold a first full list.
    pub async fn ready(&self) -> bool {
        let dra = match &self.dra {
            Some(d) => {
                d.slices.wait_until_ready().await.is_ok()
                    && d.claims.wait_until_ready().await.is_ok()
                    && d.classes.wait_until_ready().await.is_ok()
            }
            None => true,
        };
        self.nodes.wait_until_ready().await.is_ok() && self.pods.wait_until_ready().await.is_ok() && dra
    }

    /// Every ResourceSlice, ResourceClaim and DeviceClass (empty unless started with `dra`).
    pub fn dra(&self) -> DraObjects {
        match &self.dra {
            Some(d) => DraObjects {
                slices: d.slices.state().iter().map(|x| (**x).clone()).collect(),
                claims: d.claims.state().iter().map(|x| (**x).clone()).collect(),
                classes: d.classes.state().iter().map(|x| (**x).clone()).collect(),
            },
            None => DraObjects::default(),
        }
    }

    /// Every Node.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    /// Every Pod.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.layouts.namespace)
    }

    /// Reads the layouts ConfigMap.
    pub async fn layouts(&self) -> Result<Layouts, kube::Error> {
        let Some(cm) = self.config_maps().get_opt(&self.layouts.name).await? else { return Ok(Layouts::default()) };
        let ann = cm.metadata.annotations.unwrap_or_default();
        Ok(Layouts {
            text: cm.data.and_then(|d| d.get(CONFIG_KEY).cloned()).unwrap_or_default(),
            paused: ann.get(SWITCH).is_some_and(|v| v.eq_ignore_ascii_case("off")),
            resource_version: cm.metadata.resource_version,
        })
    }

    /// Writes `text` into the layouts ConfigMap read at `read` (created when it did not exist).
    pub async fn write_layouts(&self, read: &Layouts, text: &str) -> Result<(), WriteError> {
        let what = format!("ConfigMap {}", self.layouts);
        let api = self.config_maps();
        let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match &read.resource_version {
            Some(rv) => {
                let patch = serde_json::json!({"metadata": {"resourceVersion": rv}, "data": {CONFIG_KEY: text}});
                api.patch(&self.layouts.name, &pp, &Patch::Merge(&patch)).await.map(|_| ())
            }
            None => {
                tracing::info!(configmap = %self.layouts, "creating ConfigMap {} with the controller's layouts", self.layouts);
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(self.layouts.name.clone()),
                        namespace: Some(self.layouts.namespace.clone()),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), text.to_string())])),
                    ..Default::default()
                };
                let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
                api.create(&pp, &cm).await.map(|_| ())
            }
        }
        .map_err(|e| write_error(what, e))
    }

    /// Applies a decision's merge patch to a Node (its resourceVersion is the precondition).
    pub async fn patch_node(&self, name: &str, patch: &serde_json::Value) -> Result<(), WriteError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        api.patch(name, &pp, &Patch::Merge(patch)).await.map(|_| ()).map_err(|e| write_error(format!("node {name}"), e))
    }

    /// Reads one Node fresh from the API (not the cache).
    pub async fn get_node(&self, name: &str) -> Result<Node, kube::Error> {
        Api::<Node>::all(self.client.clone()).get(name).await
    }

    /// Queues an Event about `regarding` (never waits; posted off the path, see [`super::events`]).
    pub fn event(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) -> super::events::Pushed {
        let e = super::events::Pending {
            regarding: regarding.clone(),
            warning,
            reason: reason.into(),
            action: action.into(),
            note: note.into(),
            count: 1,
        };
        let pushed = self.events.push(e);
        if pushed == super::events::Pushed::Dropped {
            tracing::debug!(
                object = regarding.name.as_deref().unwrap_or_default(),
                reason,
                "Event dropped: over the batch's cap"
            );
        }
        pushed
    }

    /// The Event queue (a batch starts its cap; the loop starts its poster).
    pub fn events(&self) -> &super::events::EventQueue {
        &self.events
    }

    /// Posts one queued Event; whether it was recorded (failures are logged, never fatal).
    pub async fn post_event(client: Client, identity: String, e: super::events::Pending) -> bool {
        let regarding = &e.regarding;
        let (warning, reason, action) = (e.warning, e.reason.as_str(), e.action.as_str());
        let ns = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(client, &ns);
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = regarding.name.clone().unwrap_or_default();
        let mut note = e.note_with_count();
        if note.len() > 1000 {
            let mut cut = 997;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.gpupart.{:x}", now.as_nanosecond())),
                namespace: Some(ns),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(note),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(identity),
            ..Default::default()
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api.create(&pp, &ev).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, object = %name, reason, "recording an Event failed");
                false
            }
        }
    }

    /// This replica's identity (the Events' reporting instance).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The API client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }
}

/// The reference to a pod for its Events.
pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: (!uid.is_empty()).then(|| uid.to_string()),
        ..Default::default()
    }
}

/// The reference to a node for its Events.
pub fn node_ref(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: uid.map(str::to_string),
        ..Default::default()
    }
}
