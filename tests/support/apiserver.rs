//! An in-process Kubernetes API test server on 127.0.0.1 (real HTTP), enough for the agent:
//! node list/watch (metadata-only and full, resourceVersions, bookmarks, expired watches),
//! merge-patch and server-side apply with per-manager label/annotation ownership, pods list by
//! node, events create/patch, and fault injection (HTTP errors, 410 on watch, dropped watches,
//! a restart: every connection dropped, connections refused while down, and watches from a
//! resourceVersion older than the restart answered `410 Expired` as etcd's compaction does).
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Everything the server knows; tests read and change it through [`ApiServer`].
#[derive(Debug, Default)]
pub struct ApiState {
    /// The node's name.
    pub node: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node annotations.
    pub annotations: BTreeMap<String, String>,
    /// Current resourceVersion.
    pub rv: u64,
    /// Per field manager: the label and annotation keys it owns through apply.
    pub managed: HashMap<String, (BTreeSet<String>, BTreeSet<String>)>,
    /// Events received (create and patch bodies).
    pub events: Vec<Value>,
    /// Every request: (method, path?query).
    pub requests: Vec<(String, String)>,
    /// Status codes to answer the next non-watch requests with.
    pub fail_next: VecDeque<u16>,
    /// Number of coming watch requests that get an expired (410) error event.
    pub expire_watches: u32,
    /// Pods reported by `GET /api/v1/pods`.
    pub pods: Vec<Value>,
    /// Every node PATCH body accepted, in order.
    pub patches: Vec<Value>,
    /// Further nodes (name → annotations), served in node lists and by name (read only).
    pub other_nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// Who sent each request, in order (what audit logs and managedFields show).
    pub identities: Vec<Identity>,
    /// Watches from a resourceVersion below this get `410 Expired` (set by a restart).
    pub oldest_watchable: u64,
    /// `410 Expired` answers sent to watches so far.
    pub expired_sent: u32,
    /// Per node label or annotation key: the field manager of the last write that set or removed
    /// it (`unknown` for a write without one, as managedFields shows it).
    pub last_writer: BTreeMap<String, String>,
}

/// One request's identity.
#[derive(Debug, Clone)]
pub struct Identity {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// `User-Agent` header.
    pub user_agent: Option<String>,
    /// `fieldManager` query parameter.
    pub field_manager: Option<String>,
}

impl Identity {
    /// Whether the request changes something (anything but GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<ApiState>>,
    changes: broadcast::Sender<Signal>,
}

#[derive(Clone, Copy, Debug)]
enum Signal {
    Changed,
    DropWatches,
}

/// A running test API server.
pub struct ApiServer {
    /// Listening port on 127.0.0.1.
    pub port: u16,
    shared: Shared,
    /// The serving runtime; `None` while the server is down.
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

fn meta(s: &ApiState) -> Value {
    json!({
        "name": s.node,
        "uid": "0a0b0c0d-0000-4000-8000-000000000001",
        "resourceVersion": s.rv.to_string(),
        "labels": s.labels,
        "annotations": s.annotations,
    })
}

fn node_object(s: &ApiState, metadata_only: bool) -> Value {
    if metadata_only {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta(s)})
    } else {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": meta(s), "spec": {}, "status": {}})
    }
}

fn other_node(name: &str, annotations: &BTreeMap<String, String>, rv: u64, metadata_only: bool) -> Value {
    let meta = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv.to_string(), "annotations": annotations});
    if metadata_only {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta})
    } else {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {}, "status": {}})
    }
}

pub fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

pub fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), urlencoding_decode(v)))
        .collect()
}

fn urlencoding_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn merge_map(target: &mut BTreeMap<String, String>, patch: &Value) {
    if let Value::Object(m) = patch {
        for (k, v) in m {
            match v {
                Value::Null => {
                    target.remove(k);
                }
                Value::String(s) => {
                    target.insert(k.clone(), s.clone());
                }
                other => {
                    target.insert(k.clone(), other.to_string());
                }
            }
        }
    }
}

pub fn apply_map(
    target: &mut BTreeMap<String, String>,
    owned: &mut BTreeSet<String>,
    patch: Option<&Map<String, Value>>,
) {
    let new: BTreeMap<String, String> = patch
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect())
        .unwrap_or_default();
    for k in owned.iter() {
        if !new.contains_key(k) {
            target.remove(k);
        }
    }
    *owned = new.keys().cloned().collect();
    target.extend(new);
}

async fn handle(
    axum::extract::State(sh): axum::extract::State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let q = query(&uri);
    let path = uri.path().to_string();
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let metadata_only = accept.contains("as=PartialObjectMetadata");
    let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    {
        let mut s = sh.state.lock().unwrap();
        s.requests.push((method.to_string(), uri.to_string()));
        s.identities.push(Identity {
            method: method.to_string(),
            path: path.clone(),
            user_agent: headers.get("user-agent").and_then(|v| v.to_str().ok()).map(str::to_string),
            field_manager: q.get("fieldManager").cloned(),
        });
        if !watch {
            if let Some(code) = s.fail_next.pop_front() {
                return status(code, "InternalError", "injected failure");
            }
        }
    }
    let node_path = path.strip_prefix("/api/v1/nodes").map(|r| r.trim_start_matches('/').to_string());
    match (method.as_str(), node_path.as_deref(), path.as_str()) {
        ("GET", Some(""), _) if watch => watch_nodes(sh, &q, metadata_only),
        ("GET", Some(""), _) => {
            let s = sh.state.lock().unwrap();
            let wanted = q.get("fieldSelector").map(|f| f == &format!("metadata.name={}", s.node)).unwrap_or(true);
            let mut items: Vec<Value> = if wanted { vec![node_object(&s, metadata_only)] } else { vec![] };
            let selected = |name: &str| q.get("fieldSelector").is_none_or(|f| f == &format!("metadata.name={name}"));
            items.extend(
                s.other_nodes.iter().filter(|(n, _)| selected(n)).map(|(n, a)| other_node(n, a, s.rv, metadata_only)),
            );
            let (api, kind) =
                if metadata_only { ("meta.k8s.io/v1", "PartialObjectMetadataList") } else { ("v1", "NodeList") };
            axum::Json(json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": s.rv.to_string()}, "items": items})).into_response()
        }
        ("GET", Some(name), _) => {
            let s = sh.state.lock().unwrap();
            if let Some(a) = s.other_nodes.get(name) {
                return axum::Json(other_node(name, a, s.rv, metadata_only)).into_response();
            }
            if name != s.node {
                return status(404, "NotFound", "node not found");
            }
            axum::Json(node_object(&s, metadata_only)).into_response()
        }
        ("PATCH", Some(name), _) => {
            let patch: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            let out = {
                let mut s = sh.state.lock().unwrap();
                if name != s.node {
                    return status(404, "NotFound", "node not found");
                }
                s.patches.push(patch.clone());
                let md = &patch["metadata"];
                let writer = q.get("fieldManager").cloned().unwrap_or_else(|| "unknown".into());
                for part in ["labels", "annotations"] {
                    for k in md[part].as_object().into_iter().flat_map(|m| m.keys()) {
                        s.last_writer.insert(k.clone(), writer.clone());
                    }
                }
                if content_type.starts_with("application/apply-patch") {
                    let manager = q.get("fieldManager").cloned().unwrap_or_default();
                    if manager.is_empty() {
                        return status(400, "BadRequest", "fieldManager is required for apply patch");
                    }
                    let ApiState { labels, annotations, managed, .. } = &mut *s;
                    let owned = managed.entry(manager).or_default();
                    apply_map(labels, &mut owned.0, md["labels"].as_object());
                    apply_map(annotations, &mut owned.1, md["annotations"].as_object());
                } else {
                    merge_map(&mut s.labels, &md["labels"]);
                    merge_map(&mut s.annotations, &md["annotations"]);
                }
                s.rv += 1;
                node_object(&s, metadata_only)
            };
            let _ = sh.changes.send(Signal::Changed);
            axum::Json(out).into_response()
        }
        ("GET", None, "/api/v1/pods") => {
            let s = sh.state.lock().unwrap();
            axum::Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": s.rv.to_string()}, "items": s.pods})).into_response()
        }
        ("POST", None, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            let mut ev: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if ev["metadata"]["name"].is_null() {
                ev["metadata"]["name"] = json!(format!("gpupart.{}", sh.state.lock().unwrap().events.len()));
            }
            sh.state.lock().unwrap().events.push(ev.clone());
            (StatusCode::CREATED, axum::Json(ev)).into_response()
        }
        ("PATCH", None, p) if p.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            let ev: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            sh.state.lock().unwrap().events.push(ev.clone());
            axum::Json(ev).into_response()
        }
        _ => status(404, "NotFound", &format!("{method} {path} is not served by the test API server")),
    }
}

fn watch_nodes(sh: Shared, q: &HashMap<String, String>, metadata_only: bool) -> Response {
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let mut rx = sh.changes.subscribe();
    let expired = {
        let mut s = sh.state.lock().unwrap();
        let e = s.expire_watches > 0 || (from > 0 && from < s.oldest_watchable);
        s.expire_watches = s.expire_watches.saturating_sub(1);
        s.expired_sent += u32::from(e);
        e.then(|| format!("too old resource version: {from} ({})", s.oldest_watchable.max(s.rv)))
    };
    let stream = async_stream(move |tx| async move {
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        if let Some(message) = expired {
            let err = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": "Expired", "code": 410}});
            let _ = tx.send(line(err)).await;
            return;
        }
        let mut sent = from;
        loop {
            let ev = {
                let s = sh.state.lock().unwrap();
                (s.rv > sent).then(|| {
                    sent = s.rv;
                    json!({"type": "MODIFIED", "object": node_object(&s, metadata_only)})
                })
            };
            if let Some(ev) = ev {
                if tx.send(line(ev)).await.is_err() {
                    return;
                }
            } else if bookmarks {
                let rv = sh.state.lock().unwrap().rv;
                let kind = if metadata_only { "PartialObjectMetadata" } else { "Node" };
                let api = if metadata_only { "meta.k8s.io/v1" } else { "v1" };
                let bm = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api, "metadata": {"resourceVersion": rv.to_string()}}});
                if tx.send(line(bm)).await.is_err() {
                    return;
                }
            }
            match tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await {
                Ok(Ok(Signal::DropWatches)) | Ok(Err(broadcast::error::RecvError::Closed)) => return,
                _ => {}
            }
        }
    });
    Response::builder().header("content-type", "application/json").body(Body::from_stream(stream)).unwrap()
}

/// A stream fed by an async producer through a channel.
pub fn async_stream<F, Fut>(producer: F) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(producer(tx));
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) })
}

/// Serves `shared` on 127.0.0.1:`port` (0: any free port) on `runtime`; returns the port.
fn serve(runtime: &tokio::runtime::Runtime, shared: &Shared, port: u16) -> u16 {
    let app = Router::new().fallback(handle).with_state(shared.clone());
    let listener = runtime.block_on(async {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        // The port of a server that went down is taken again at once (SO_REUSEADDR).
        for _ in 0..100 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.set_reuseaddr(true).unwrap();
            if socket.bind(addr).is_ok() {
                return socket.listen(128).unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("cannot listen on 127.0.0.1:{port} again");
    });
    let port = listener.local_addr().unwrap().port();
    runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

impl ApiServer {
    /// Starts a server for a node called `node`.
    pub fn start(node: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let state = Arc::new(Mutex::new(ApiState { node: node.to_string(), rv: 1, ..Default::default() }));
        let (changes, _) = broadcast::channel(64);
        let shared = Shared { state, changes };
        let port = serve(&runtime, &shared, 0);
        Self { port, shared, runtime: Mutex::new(Some(runtime)) }
    }

    /// Stops answering, as a stopped API server: every open connection is dropped and new ones
    /// are refused (nothing listens on the port) until [`ApiServer::come_back`].
    pub fn go_down(&self) {
        if let Some(rt) = self.runtime.lock().unwrap().take() {
            rt.shutdown_background();
        }
    }

    /// Listens again on the same port, as a restarted API server: the resourceVersion moves on
    /// and watches from before the restart get `410 Expired` (etcd compacted them away).
    pub fn come_back(&self) {
        {
            let mut s = self.state();
            s.rv += 5;
            s.oldest_watchable = s.rv;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        serve(&runtime, &self.shared, self.port);
        *self.runtime.lock().unwrap() = Some(runtime);
    }

    /// Locks the state for reading or changing it directly.
    pub fn state(&self) -> std::sync::MutexGuard<'_, ApiState> {
        self.shared.state.lock().unwrap()
    }

    fn changed(&self) {
        self.state().rv += 1;
        let _ = self.shared.changes.send(Signal::Changed);
    }

    /// `kubectl label node N key=value --overwrite` (or removal with `None`).
    pub fn label(&self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.state().labels.insert(key.into(), v.into()),
            None => self.state().labels.remove(key),
        };
        self.changed();
    }

    /// `kubectl annotate node N key=value --overwrite` (or removal with `None`).
    pub fn annotate(&self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.state().annotations.insert(key.into(), v.into()),
            None => self.state().annotations.remove(key),
        };
        self.changed();
    }

    /// A node label's current value.
    pub fn get_label(&self, key: &str) -> Option<String> {
        self.state().labels.get(key).cloned()
    }

    /// Closes every open watch stream (as a proxy or API server restart would).
    pub fn drop_watches(&self) {
        let _ = self.shared.changes.send(Signal::DropWatches);
    }

    /// Number of write requests (PATCH, POST, PUT, DELETE) seen so far.
    pub fn writes(&self) -> usize {
        self.state().requests.iter().filter(|(m, _)| m != "GET").count()
    }

    /// Adds a further (read-only) node with these annotations.
    #[allow(dead_code)]
    pub fn add_node(&self, name: &str, annotations: &[(&str, &str)]) {
        let a = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.state().other_nodes.insert(name.to_string(), a);
    }

    /// Writes a kubeconfig for this server into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig_for(self.port, dir)
    }
}

/// Writes a kubeconfig for an API server on 127.0.0.1:`port` into `dir` and returns its path.
pub fn kubeconfig_for(port: u16, dir: &Path) -> PathBuf {
    kubeconfig_with(port, &dir.join("kubeconfig"), "{}")
}

/// Writes a kubeconfig at `path` for a server on `port` with this `user` entry (YAML flow).
pub fn kubeconfig_with(port: u16, path: &Path, user: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\nusers:\n- name: test\n  user: {user}\n"
    );
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}
