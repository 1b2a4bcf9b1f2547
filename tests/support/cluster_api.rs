//! A multi-object Kubernetes API test server on 127.0.0.1 (real HTTP) for the controller and
//! several agents at once: Nodes, Pods, ConfigMaps, Leases and Events in one store with one
//! resourceVersion counter; list (field selectors `metadata.name`, `spec.nodeName`), watch from a
//! resourceVersion (ADDED/MODIFIED/DELETED, bookmarks), get, create (409 AlreadyExists), replace
//! and merge patch with a `metadata.resourceVersion` precondition (409 Conflict), server-side
//! apply of labels and annotations per field manager, delete, and metadata-only answers.
//! Anything else is answered 404 naming the request.

use super::apiserver::{apply_map, async_stream, query, status};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// A collection: (plural, apiVersion, kind, namespaced).
const KINDS: &[(&str, &str, &str, bool)] = &[
    ("nodes", "v1", "Node", false),
    ("pods", "v1", "Pod", true),
    ("configmaps", "v1", "ConfigMap", true),
    ("leases", "coordination.k8s.io/v1", "Lease", true),
    ("events", "events.k8s.io/v1", "Event", true),
];

/// An object's key: (plural, namespace, name); the namespace is empty for cluster objects.
pub type Key = (String, String, String);

/// One change, for watches.
#[derive(Debug, Clone)]
pub struct Change {
    /// resourceVersion after the change.
    pub rv: u64,
    /// ADDED, MODIFIED or DELETED.
    pub kind: &'static str,
    /// The object's key.
    pub key: Key,
    /// The object after (before, for DELETED).
    pub object: Value,
}

/// Everything the server holds.
#[derive(Debug, Default)]
pub struct Store {
    /// Every object.
    pub objects: BTreeMap<Key, Value>,
    /// The resourceVersion counter.
    pub rv: u64,
    /// Every change, in order.
    pub changes: Vec<Change>,
    /// Every request: (method, path?query, fieldManager, the bearer token's user).
    pub requests: Vec<(String, String, Option<String>, Option<String>)>,
    /// Per (object, field manager): the label and annotation keys it owns through apply.
    pub managed: HashMap<(Key, String), (BTreeSet<String>, BTreeSet<String>)>,
    /// Answer the next requests that match (method, path prefix) with this status code.
    pub fail: Vec<(String, String, u16)>,
    /// Answer the next PATCHes by (field manager, path prefix) with 409 Conflict, as the API server
    /// does when the object changed since the writer read it.
    pub conflicts: Vec<(String, String)>,
}

impl Store {
    /// An object.
    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(plural.into(), ns.into(), name.into()))
    }

    /// Every object of a collection.
    pub fn all(&self, plural: &str) -> Vec<&Value> {
        self.objects.iter().filter(|((p, _, _), _)| p == plural).map(|(_, v)| v).collect()
    }

    /// Stores `object` under `key`, bumping the resourceVersion and logging the change.
    pub fn put(&mut self, key: Key, mut object: Value) -> Value {
        self.rv += 1;
        let kind = if self.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}-{}-{}", key.0, key.1, key.2));
        }
        if object["metadata"]["creationTimestamp"].is_null() {
            object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
        }
        self.objects.insert(key.clone(), object.clone());
        self.changes.push(Change { rv: self.rv, kind, key, object: object.clone() });
        object
    }

    /// Deletes an object (a DELETED watch event); returns it.
    pub fn delete(&mut self, key: &Key) -> Option<Value> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        self.changes.push(Change { rv: self.rv, kind: "DELETED", key: key.clone(), object: old.clone() });
        Some(old)
    }
}

/// Now in RFC 3339 (seconds), as the API server writes times.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    changed: broadcast::Sender<()>,
}

/// A running multi-object API server.
pub struct ClusterApi {
    /// Port on 127.0.0.1.
    pub port: u16,
    shared: Shared,
    _runtime: tokio::runtime::Runtime,
}

/// Where a request points.
struct Target {
    plural: String,
    apiversion: &'static str,
    kind: &'static str,
    ns: Option<String>,
    name: Option<String>,
}

fn route(path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/api/v1/").or_else(|| {
        ["/apis/coordination.k8s.io/v1/", "/apis/events.k8s.io/v1/"].iter().find_map(|p| path.strip_prefix(p))
    })?;
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let (ns, plural, name) = match parts.as_slice() {
        ["namespaces", ns, plural] => (Some(ns.to_string()), *plural, None),
        ["namespaces", ns, plural, name] => (Some(ns.to_string()), *plural, Some(name.to_string())),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(name.to_string())),
        _ => return None,
    };
    let &(p, apiversion, kind, namespaced) = KINDS.iter().find(|(p, ..)| *p == plural)?;
    if !namespaced && ns.is_some() {
        return None;
    }
    Some(Target { plural: p.into(), apiversion, kind, ns, name })
}

fn field(v: &Value, path: &str) -> String {
    let mut cur = v;
    for part in path.split('.') {
        cur = &cur[part];
    }
    cur.as_str().unwrap_or("").to_string()
}

/// Whether `v` passes a `fieldSelector` of `a=b` terms (`metadata.name`, `spec.nodeName`, …).
fn selected(v: &Value, selector: Option<&String>) -> bool {
    selector.is_none_or(|sel| {
        sel.split(',').filter(|t| !t.is_empty()).all(|term| match term.split_once("!=") {
            Some((k, want)) => field(v, k) != want,
            None => term.split_once('=').is_some_and(|(k, want)| field(v, k.trim_end_matches('=')) == want),
        })
    })
}

fn metadata_only(v: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": v["metadata"]})
}

fn in_scope(t: &Target, key: &Key) -> bool {
    key.0 == t.plural && t.ns.as_ref().is_none_or(|ns| &key.1 == ns)
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
    let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("");
    let partial = accept.contains("as=PartialObjectMetadata");
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let watch = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    let manager = q.get("fieldManager").cloned();
    {
        let mut s = sh.store.lock().unwrap();
        let user = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        s.requests.push((method.to_string(), uri.to_string(), manager.clone(), user));
        if let Some(i) = s.fail.iter().position(|(m, p, _)| *m == method.as_str() && path.starts_with(p.as_str())) {
            let (_, _, code) = s.fail.remove(i);
            return status(code, "InternalError", "injected failure");
        }
        if method == Method::PATCH {
            let hit = s
                .conflicts
                .iter()
                .position(|(m, p)| manager.as_deref() == Some(m.as_str()) && path.starts_with(p.as_str()));
            if let Some(i) = hit {
                s.conflicts.remove(i);
                return status(409, "Conflict", "Operation cannot be fulfilled: the object has been modified");
            }
        }
    }
    let Some(t) = route(&path) else {
        return status(404, "NotFound", &format!("{method} {path} is not served by the test cluster API"));
    };
    let ns = t.ns.clone().unwrap_or_default();
    match (method.as_str(), &t.name) {
        ("GET", None) if watch => watch_collection(sh, t, &q, partial),
        ("GET", None) => {
            let s = sh.store.lock().unwrap();
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|(k, v)| in_scope(&t, k) && selected(v, q.get("fieldSelector")))
                .map(|(_, v)| if partial { metadata_only(v) } else { v.clone() })
                .collect();
            let (api, kind) = if partial {
                ("meta.k8s.io/v1".to_string(), "PartialObjectMetadataList".to_string())
            } else {
                (t.apiversion.to_string(), format!("{}List", t.kind))
            };
            axum::Json(json!({"apiVersion": api, "kind": kind, "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}))
                .into_response()
        }
        ("GET", Some(name)) => {
            let s = sh.store.lock().unwrap();
            match s.get(&t.plural, &ns, name) {
                Some(v) => axum::Json(if partial { metadata_only(v) } else { v.clone() }).into_response(),
                None => status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
            }
        }
        ("POST", None) => {
            let mut obj: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            let out = {
                let mut s = sh.store.lock().unwrap();
                if obj["metadata"]["name"].is_null() {
                    let base = obj["metadata"]["generateName"].as_str().unwrap_or("obj-").to_string();
                    obj["metadata"]["name"] = json!(format!("{base}{}", s.rv + 1));
                }
                let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let key = (t.plural.clone(), ns.clone(), name.clone());
                if s.objects.contains_key(&key) {
                    return status(409, "AlreadyExists", &format!("{} \"{name}\" already exists", t.plural));
                }
                obj["apiVersion"] = json!(t.apiversion);
                obj["kind"] = json!(t.kind);
                if t.ns.is_some() {
                    obj["metadata"]["namespace"] = json!(ns);
                }
                s.put(key, obj)
            };
            let _ = sh.changed.send(());
            (StatusCode::CREATED, axum::Json(out)).into_response()
        }
        ("PUT" | "PATCH", Some(name)) => {
            let body: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            let out = {
                let mut s = sh.store.lock().unwrap();
                let key = (t.plural.clone(), ns.clone(), name.clone());
                let Some(cur) = s.objects.get(&key).cloned() else {
                    return status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural));
                };
                let want_rv = body["metadata"]["resourceVersion"].as_str();
                if want_rv.is_some_and(|rv| Some(rv) != cur["metadata"]["resourceVersion"].as_str()) {
                    return status(
                        409,
                        "Conflict",
                        &format!(
                            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified",
                            t.plural
                        ),
                    );
                }
                let next = if method == Method::PUT {
                    let mut next = body.clone();
                    next["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                    next["metadata"]["creationTimestamp"] = cur["metadata"]["creationTimestamp"].clone();
                    next
                } else if content_type.starts_with("application/apply-patch") {
                    let Some(m) = manager.clone().filter(|m| !m.is_empty()) else {
                        return status(400, "BadRequest", "fieldManager is required for apply patch");
                    };
                    let mut next = cur.clone();
                    let owned = s.managed.entry((key.clone(), m)).or_default();
                    for (part, set) in [("labels", &mut owned.0), ("annotations", &mut owned.1)] {
                        let mut map: BTreeMap<String, String> =
                            serde_json::from_value(next["metadata"][part].clone()).unwrap_or_default();
                        apply_map(&mut map, set, body["metadata"][part].as_object());
                        next["metadata"][part] = json!(map);
                    }
                    next
                } else {
                    let mut next = cur.clone();
                    let mut patch = body.clone();
                    if let Some(m) = patch["metadata"].as_object_mut() {
                        m.remove("resourceVersion");
                    }
                    merge(&mut next, &patch);
                    next
                };
                s.put(key, next)
            };
            let _ = sh.changed.send(());
            axum::Json(out).into_response()
        }
        ("DELETE", Some(name)) => {
            let old = sh.store.lock().unwrap().delete(&(t.plural.clone(), ns.clone(), name.clone()));
            let _ = sh.changed.send(());
            match old {
                Some(v) => axum::Json(v).into_response(),
                None => status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
            }
        }
        _ => status(405, "MethodNotAllowed", &format!("{method} {path} is not served by the test cluster API")),
    }
}

fn watch_collection(sh: Shared, t: Target, q: &HashMap<String, String>, partial: bool) -> Response {
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let selector = q.get("fieldSelector").cloned();
    let mut rx = sh.changed.subscribe();
    let stream = async_stream(move |tx| async move {
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        let mut sent = from;
        loop {
            let batch: Vec<Value> = {
                let s = sh.store.lock().unwrap();
                let out = s
                    .changes
                    .iter()
                    .filter(|c| c.rv > sent && in_scope(&t, &c.key) && selected(&c.object, selector.as_ref()))
                    .map(|c| json!({"type": c.kind, "object": if partial { metadata_only(&c.object) } else { c.object.clone() }}))
                    .collect();
                sent = s.rv;
                out
            };
            for ev in batch {
                if tx.send(line(ev)).await.is_err() {
                    return;
                }
            }
            if bookmarks {
                let rv = sh.store.lock().unwrap().rv;
                let kind = if partial { "PartialObjectMetadata" } else { t.kind };
                let api = if partial { "meta.k8s.io/v1" } else { t.apiversion };
                let bm = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api, "metadata": {"resourceVersion": rv.to_string()}}});
                if tx.send(line(bm)).await.is_err() {
                    return;
                }
            }
            if let Ok(Err(broadcast::error::RecvError::Closed)) =
                tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await
            {
                return;
            }
        }
    });
    Response::builder().header("content-type", "application/json").body(Body::from_stream(stream)).unwrap()
}

impl ClusterApi {
    /// Starts an empty server.
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (changed, _) = broadcast::channel(256);
        let shared = Shared { store: Arc::new(Mutex::new(Store::default())), changed };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { port, shared, _runtime: runtime }
    }

    /// Locks the store.
    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().unwrap()
    }

    /// Changes the store and wakes the watches.
    pub fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let r = f(&mut self.store());
        let _ = self.shared.changed.send(());
        r
    }

    /// Creates (or replaces) an object from its JSON; `plural` names the collection.
    pub fn put(&self, plural: &str, object: Value) {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or("").to_string();
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.change(|s| s.put((plural.into(), ns, name), object));
    }

    /// Deletes an object, as `kubectl delete` does (watchers see DELETED).
    pub fn delete(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        self.change(|s| s.delete(&(plural.into(), ns.into(), name.into())))
    }

    /// An object's current JSON.
    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        self.store().get(plural, ns, name).cloned()
    }

    /// A node label.
    pub fn node_label(&self, node: &str, key: &str) -> Option<String> {
        self.get("nodes", "", node).and_then(|n| n["metadata"]["labels"][key].as_str().map(str::to_string))
    }

    /// Every Event's (regarding name, reason, note).
    pub fn events(&self) -> Vec<(String, String, String)> {
        self.store()
            .all("events")
            .iter()
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_string();
                (s(&e["regarding"]["name"]), s(&e["reason"]), s(&e["note"]))
            })
            .collect()
    }

    /// Writes requests with a field manager (what audit logs attribute), by manager.
    pub fn writes_by(&self, manager: &str) -> Vec<(String, String)> {
        self.store()
            .requests
            .iter()
            .filter(|(m, _, fm, _)| m != "GET" && fm.as_deref() == Some(manager))
            .map(|(m, p, _, _)| (m.clone(), p.clone()))
            .collect()
    }

    /// Writes a kubeconfig into `dir` that authenticates as `user` (a bearer token the server
    /// records with each request) and returns its path.
    pub fn kubeconfig_as(&self, dir: &Path, user: &str) -> PathBuf {
        super::apiserver::kubeconfig_with(
            self.port,
            &dir.join(format!("kubeconfig-{user}")),
            &format!("{{token: {user}}}"),
        )
    }

    /// Every request made as `user`: (method, path?query).
    pub fn requests_by(&self, user: &str) -> Vec<(String, String)> {
        let s = self.store();
        s.requests.iter().filter(|r| r.3.as_deref() == Some(user)).map(|r| (r.0.clone(), r.1.clone())).collect()
    }

    /// Writes a kubeconfig for this server into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        super::apiserver::kubeconfig_for(self.port, dir)
    }
}
