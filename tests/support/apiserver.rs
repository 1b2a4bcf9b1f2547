//! The Kubernetes API test server: in-process, on 127.0.0.1, real HTTP. One store of objects
//! with one resourceVersion counter serves every kind the product uses (Nodes, Pods, ConfigMaps,
//! Leases, Events, and `resource.k8s.io/v1` ResourceSlices, ResourceClaims and DeviceClasses): list (field selectors such as `metadata.name`, `spec.nodeName`), watch from
//! a resourceVersion (ADDED/MODIFIED/DELETED, bookmarks, metadata-only), get, create (409
//! AlreadyExists), replace and merge patch with a `metadata.resourceVersion` precondition (409
//! Conflict), server-side apply of labels and annotations per field manager, and delete; the
//! `pods/eviction` subresource with PodDisruptionBudgets (`policy/v1`) and a ReplicaSet
//! (`apps/v1`) stand-in that recreates a deleted pod it owns ([`super::disruption`]). Fault
//! injection: HTTP errors, 409s for a field manager, 410 on watch, dropped watches, and a restart
//! (every connection dropped, connections refused while down, and watches from a resourceVersion
//! older than the restart answered `410 Expired` as etcd's compaction does). What a release
//! serves ([`super::served`]): `/version`, discovery of the API groups, dry runs, and the fields a
//! feature gate that is off drops from written objects (Kubernetes 1.36's defaults unless a test
//! sets another). Anything else is answered 404 naming the request.
//!
//! An agent's test starts it with its node ([`ApiServer::start`]); a cluster test starts it
//! empty ([`ApiServer::empty`]) and puts what it needs.
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

/// A collection: (plural, apiVersion, kind, namespaced).
const KINDS: &[(&str, &str, &str, bool)] = &[
    ("nodes", "v1", "Node", false),
    ("pods", "v1", "Pod", true),
    ("configmaps", "v1", "ConfigMap", true),
    ("leases", "coordination.k8s.io/v1", "Lease", true),
    ("events", "events.k8s.io/v1", "Event", true),
    ("resourceslices", "resource.k8s.io/v1", "ResourceSlice", false),
    ("resourceclaims", "resource.k8s.io/v1", "ResourceClaim", true),
    ("deviceclasses", "resource.k8s.io/v1", "DeviceClass", false),
    ("resourceclaimtemplates", "resource.k8s.io/v1", "ResourceClaimTemplate", true),
    ("poddisruptionbudgets", "policy/v1", "PodDisruptionBudget", true),
    ("replicasets", "apps/v1", "ReplicaSet", true),
];

/// The API groups served besides the core group, as path prefixes.
const GROUPS: &[&str] = &[
    "/apis/coordination.k8s.io/v1/",
    "/apis/events.k8s.io/v1/",
    "/apis/resource.k8s.io/v1/",
    "/apis/policy/v1/",
    "/apis/apps/v1/",
];

/// The uid of the node an agent's test starts the server with.
pub const NODE_UID: &str = "0a0b0c0d-0000-4000-8000-000000000001";

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
    /// The bearer token's user.
    pub user: Option<String>,
}

impl Identity {
    /// Whether the request changes something (anything but GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
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
    /// Every request: (method, path?query).
    pub requests: Vec<(String, String)>,
    /// Who sent each request, in order (what audit logs and managedFields show).
    pub identities: Vec<Identity>,
    /// Every PATCH body accepted, with its object, in order.
    pub patches: Vec<(Key, Value)>,
    /// Per (object, label or annotation key): the field manager of the last write that set or
    /// removed it (`unknown` for a write without one, as managedFields shows it).
    pub last_writer: BTreeMap<(Key, String), String>,
    /// Per (object, field manager): the label and annotation keys it owns through apply.
    pub managed: HashMap<(Key, String), (BTreeSet<String>, BTreeSet<String>)>,
    /// Status codes to answer the next non-watch requests with, whatever they ask.
    pub fail_next: VecDeque<u16>,
    /// Answer the next requests that match (method, path prefix) with this status code.
    pub fail: Vec<(String, String, u16)>,
    /// Writes by (user, path prefix) answered `429 TooManyRequests` with `Retry-After: 1`, as
    /// API Priority and Fairness rejects a flow whose queue is full, until lifted.
    pub throttled: Vec<(String, String)>,
    /// Answer the next PATCHes by (field manager, path prefix) with 409 Conflict, as the API server
    /// does when the object changed since the writer read it.
    pub conflicts: Vec<(String, String)>,
    /// Number of coming watch requests that get an expired (410) error event.
    pub expire_watches: u32,
    /// Watches from a resourceVersion below this get `410 Expired` (set by a restart).
    pub oldest_watchable: u64,
    /// `410 Expired` answers sent to watches so far.
    pub expired_sent: u32,
    /// How long every write takes to be answered (a busy control plane answers writes in tens
    /// of milliseconds); concurrent writes wait concurrently, as they do on a real API server.
    pub write_delay: std::time::Duration,
    /// The release and feature gates served.
    pub served: super::served::Served,
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
        self.served.drop_disabled(&key.0, &mut object, self.objects.get(&key));
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

    /// Deletes an object (a DELETED watch event); returns it. Then, as kube-controller-manager's
    /// garbage collector does with background propagation, deletes every object that names it
    /// (by uid) among its `ownerReferences`.
    pub fn delete(&mut self, key: &Key) -> Option<Value> {
        let old = self.objects.remove(key)?;
        self.rv += 1;
        self.changes.push(Change { rv: self.rv, kind: "DELETED", key: key.clone(), object: old.clone() });
        if let Some(uid) = old["metadata"]["uid"].as_str() {
            let owned: Vec<Key> = self
                .objects
                .iter()
                .filter(|(_, o)| {
                    o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["uid"].as_str() == Some(uid)))
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in owned {
                self.delete(&k);
            }
        }
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
    signals: broadcast::Sender<Signal>,
}

/// The store of a running server, shared with a thread of the test (see [`ApiServer::handle`]).
#[derive(Clone)]
pub struct StoreHandle(Shared);

impl StoreHandle {
    /// Locks the store.
    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.store.lock().unwrap()
    }

    /// Changes the store and wakes the watches.
    pub fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let r = f(&mut self.store());
        let _ = self.0.signals.send(Signal::Changed);
        r
    }
}

/// What wakes the watches.
#[derive(Clone, Copy, Debug)]
enum Signal {
    Changed,
    DropWatches,
}

/// A running test API server.
pub struct ApiServer {
    /// Listening port on 127.0.0.1.
    pub port: u16,
    /// The node an agent's test started it with (empty for a cluster test).
    node: String,
    shared: Shared,
    /// The serving runtime; `None` while the server is down.
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

/// What an agent's test reads of its node and of the server, at one moment.
#[derive(Debug, Clone)]
pub struct NodeState {
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node annotations.
    pub annotations: BTreeMap<String, String>,
    /// Every Event as written (each create and each patch), in order.
    pub events: Vec<Value>,
    /// Every node PATCH body accepted, in order.
    pub patches: Vec<Value>,
    /// Every request: (method, path?query).
    pub requests: Vec<(String, String)>,
    /// Who sent each request, in order.
    pub identities: Vec<Identity>,
    /// Per node label or annotation key: the field manager of the last write to it.
    pub last_writer: BTreeMap<String, String>,
    /// `410 Expired` answers sent to watches so far.
    pub expired_sent: u32,
    /// Current resourceVersion.
    pub rv: u64,
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

/// Where a request points.
struct Target {
    plural: String,
    apiversion: &'static str,
    kind: &'static str,
    ns: Option<String>,
    name: Option<String>,
}

fn route(path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/api/v1/").or_else(|| GROUPS.iter().find_map(|p| path.strip_prefix(p)))?;
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

/// `(namespace, pod)` of a `pods/{name}/eviction` path.
fn eviction_target(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        [ns, "pods", name, "eviction"] => Some((ns.to_string(), name.to_string())),
        _ => None,
    }
}

/// The ReplicaSet controller's answer to a deleted pod: its replacement, created a moment later
/// (the controller sees the deletion through its watch, then creates).
fn replace_later(sh: &Shared, s: &Store, old: &Value) {
    let Some((ns, pod)) = super::disruption::replacement(s, old) else { return };
    let sh = sh.clone();
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        {
            let mut s = sh.store.lock().unwrap();
            let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
            s.put(("pods".into(), ns, name), pod);
        }
        let _ = sh.signals.send(Signal::Changed);
    });
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
    let delay = if method == Method::GET { std::time::Duration::ZERO } else { sh.store.lock().unwrap().write_delay };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    {
        let mut s = sh.store.lock().unwrap();
        let user = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        s.requests.push((method.to_string(), uri.to_string()));
        s.identities.push(Identity {
            method: method.to_string(),
            path: path.clone(),
            user_agent: headers.get("user-agent").and_then(|v| v.to_str().ok()).map(str::to_string),
            field_manager: manager.clone(),
            user: user.clone(),
        });
        if !watch {
            if let Some(code) = s.fail_next.pop_front() {
                return status(code, "InternalError", "injected failure");
            }
        }
        let throttled = s
            .throttled
            .iter()
            .any(|(u, p)| method != Method::GET && user.as_ref() == Some(u) && path.starts_with(p.as_str()));
        if throttled {
            let mut r = status(429, "TooManyRequests", "Too many requests, please try again later.");
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
            return r;
        }
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
    if let Some(r) = discovery(&sh, &method, &path) {
        return r;
    }
    if let Some((ns, name)) = eviction_target(&path) {
        if method != Method::POST {
            return status(405, "MethodNotAllowed", &format!("{method} {path} is not served by the test API server"));
        }
        let body: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return status(400, "BadRequest", &e.to_string()),
        };
        let (code, out) = {
            let mut s = sh.store.lock().unwrap();
            let key = ("pods".to_string(), ns.clone(), name.clone());
            super::disruption::evict(&mut s, &ns, &name, &body, |s| {
                if let Some(old) = s.delete(&key) {
                    replace_later(&sh, s, &old);
                }
            })
        };
        let _ = sh.signals.send(Signal::Changed);
        return (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(out))
            .into_response();
    }
    let Some(t) = route(&path) else {
        return status(404, "NotFound", &format!("{method} {path} is not served by the test API server"));
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
            let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
            let out = {
                let mut s = sh.store.lock().unwrap();
                if let Some(message) = s.served.invalid(&t.plural, &obj) {
                    return status(422, "Invalid", &message);
                }
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
                if dry_run {
                    // What would be stored, not stored: no resourceVersion, no watch event.
                    s.served.drop_disabled(&t.plural, &mut obj, None);
                    obj["metadata"]["uid"] = json!(format!("dry-run-{}-{name}", t.plural));
                    obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
                    return (StatusCode::CREATED, axum::Json(obj)).into_response();
                }
                s.put(key, obj)
            };
            let _ = sh.signals.send(Signal::Changed);
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
                if method == Method::PATCH {
                    s.patches.push((key.clone(), body.clone()));
                    let writer = manager.clone().unwrap_or_else(|| "unknown".into());
                    for part in ["labels", "annotations"] {
                        for k in body["metadata"][part].as_object().into_iter().flat_map(|m| m.keys()) {
                            s.last_writer.insert((key.clone(), k.clone()), writer.clone());
                        }
                    }
                }
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
            let _ = sh.signals.send(Signal::Changed);
            axum::Json(out).into_response()
        }
        ("DELETE", Some(name)) => {
            let old = {
                let mut s = sh.store.lock().unwrap();
                let old = s.delete(&(t.plural.clone(), ns.clone(), name.clone()));
                if let Some(o) = old.as_ref().filter(|_| t.plural == "pods") {
                    replace_later(&sh, &s, o);
                }
                old
            };
            let _ = sh.signals.send(Signal::Changed);
            match old {
                Some(v) => axum::Json(v).into_response(),
                None => status(404, "NotFound", &format!("{} \"{name}\" not found", t.plural)),
            }
        }
        _ => status(405, "MethodNotAllowed", &format!("{method} {path} is not served by the test API server")),
    }
}

/// The discovery and version endpoints, and 404 for an API version the release does not serve.
fn discovery(sh: &Shared, method: &Method, path: &str) -> Option<Response> {
    let s = sh.store.lock().unwrap();
    let body = match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "/version") => s.served.version(),
        ("GET", "/apis") => s.served.groups(GROUPS),
        ("GET", "/apis/resource.k8s.io") => match s.served.resource_group() {
            Some(g) => g,
            None => return Some(status(404, "NotFound", "the server could not find the requested resource")),
        },
        _ if !s.served.serves(path) => {
            return Some(status(404, "NotFound", "the server could not find the requested resource"))
        }
        _ => return None,
    };
    Some(axum::Json(body).into_response())
}

fn watch_collection(sh: Shared, t: Target, q: &HashMap<String, String>, partial: bool) -> Response {
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let selector = q.get("fieldSelector").cloned();
    let mut rx = sh.signals.subscribe();
    let expired = {
        let mut s = sh.store.lock().unwrap();
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
    /// Starts an empty server.
    pub fn empty() -> Self {
        Self::serving(String::new())
    }

    /// Starts a server holding one node called `node`, as an agent's test needs.
    pub fn start(node: &str) -> Self {
        let api = Self::serving(node.to_string());
        let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": NODE_UID}, "spec": {}, "status": {}});
        api.put("nodes", object);
        api
    }

    fn serving(node: String) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (signals, _) = broadcast::channel(256);
        let shared = Shared { store: Arc::new(Mutex::new(Store { rv: 1, ..Store::default() })), signals };
        let port = serve(&runtime, &shared, 0);
        Self { port, node, shared, runtime: Mutex::new(Some(runtime)) }
    }

    /// Stops answering, as a stopped API server: every open connection is dropped and new ones
    /// are refused (nothing listens on the port) until [`ApiServer::come_back`].
    pub fn go_down(&self) {
        if let Some(rt) = self.runtime.lock().unwrap().take() {
            // Wait for the serving tasks to stop: a watch stream still running after this returns
            // would deliver changes made "while down" (shutdown_background does not wait).
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
    }

    /// Listens again on the same port, as a restarted API server: the resourceVersion moves on
    /// and watches from before the restart get `410 Expired` (etcd compacted them away).
    pub fn come_back(&self) {
        {
            let mut s = self.store();
            s.rv += 5;
            s.oldest_watchable = s.rv;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        serve(&runtime, &self.shared, self.port);
        *self.runtime.lock().unwrap() = Some(runtime);
    }

    /// Closes every open watch stream (as a proxy or API server restart would).
    pub fn drop_watches(&self) {
        let _ = self.shared.signals.send(Signal::DropWatches);
    }

    /// Answers the next non-watch requests with these status codes.
    pub fn fail_next(&self, codes: impl IntoIterator<Item = u16>) {
        self.store().fail_next.extend(codes);
    }

    /// Answers `user`'s writes under `path` with `429 TooManyRequests` until [`Self::unthrottle`].
    pub fn throttle(&self, user: &str, path: &str) {
        self.store().throttled.push((user.into(), path.into()));
    }

    /// Serves as the release `served` does from now on (its version, discovery and gates).
    pub fn serve_release(&self, served: super::served::Served) {
        self.store().served = served;
    }

    /// Answers every write again.
    pub fn unthrottle(&self) {
        self.store().throttled.clear();
    }

    /// Answers the next `n` watch requests with `410 Expired`.
    pub fn expire_watches(&self, n: u32) {
        self.store().expire_watches += n;
    }

    /// Locks the store.
    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().unwrap()
    }

    /// A handle on the store for another thread: it reads and changes what this server serves.
    pub fn handle(&self) -> StoreHandle {
        StoreHandle(self.shared.clone())
    }

    /// Changes the store and wakes the watches.
    pub fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let r = f(&mut self.store());
        let _ = self.shared.signals.send(Signal::Changed);
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

    /// Writes requests with a field manager (what audit logs attribute), by manager:
    /// (method, path).
    pub fn writes_by(&self, manager: &str) -> Vec<(String, String)> {
        let s = self.store();
        s.identities
            .iter()
            .filter(|i| i.is_write() && i.field_manager.as_deref() == Some(manager))
            .map(|i| (i.method.clone(), i.path.clone()))
            .collect()
    }

    /// Writes a kubeconfig into `dir` that authenticates as `user` (a bearer token the server
    /// records with each request) and returns its path.
    pub fn kubeconfig_as(&self, dir: &Path, user: &str) -> PathBuf {
        kubeconfig_with(self.port, &dir.join(format!("kubeconfig-{user}")), &format!("{{token: {user}}}"))
    }

    /// How many requests were made so far (a mark for [`Self::writes_since`]).
    pub fn request_count(&self) -> usize {
        self.store().requests.len()
    }

    /// Every request but GETs made since request `from` (0: all): (method, path?query).
    pub fn writes_since(&self, from: usize) -> Vec<(String, String)> {
        self.store().requests[from..].iter().filter(|(m, _)| m != "GET").cloned().collect()
    }

    /// Every request made as `user`: (method, path?query).
    pub fn requests_by(&self, user: &str) -> Vec<(String, String)> {
        let s = self.store();
        s.requests
            .iter()
            .zip(&s.identities)
            .filter(|(_, i)| i.user.as_deref() == Some(user))
            .map(|(r, _)| r.clone())
            .collect()
    }

    /// Writes a kubeconfig for this server into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig_for(self.port, dir)
    }

    /// Number of write requests (PATCH, POST, PUT, DELETE) seen so far.
    pub fn writes(&self) -> usize {
        self.store().identities.iter().filter(|i| i.is_write()).count()
    }

    fn node_key(&self) -> Key {
        ("nodes".into(), String::new(), self.node.clone())
    }

    /// Labels or annotations (`part`) of an object.
    fn string_map(object: Option<&Value>, part: &str) -> BTreeMap<String, String> {
        object.and_then(|o| serde_json::from_value(o["metadata"][part].clone()).ok()).unwrap_or_default()
    }

    /// Sets or removes one label or annotation of the node, as `kubectl` does.
    fn set_node_key(&self, part: &str, key: &str, value: Option<&str>) {
        let k = self.node_key();
        self.change(|s| {
            let mut node = s.objects.get(&k).cloned().expect("the test's node");
            match value {
                Some(v) => node["metadata"][part][key] = json!(v),
                None => {
                    if let Some(m) = node["metadata"][part].as_object_mut() {
                        m.remove(key);
                    }
                }
            }
            s.put(k, node);
        });
    }

    /// What an agent's test reads: its node's labels and annotations, Events, patches and the
    /// request log, at this moment.
    pub fn state(&self) -> NodeState {
        let key = self.node_key();
        // One lock for the whole snapshot: labels and annotations are read as one write left them.
        let s = self.store();
        let node = s.objects.get(&key);
        NodeState {
            labels: Self::string_map(node, "labels"),
            annotations: Self::string_map(node, "annotations"),
            events: s
                .changes
                .iter()
                .filter(|c| c.key.0 == "events" && c.kind != "DELETED")
                .map(|c| c.object.clone())
                .collect(),
            patches: s.patches.iter().filter(|(k, _)| *k == key).map(|(_, p)| p.clone()).collect(),
            requests: s.requests.clone(),
            identities: s.identities.clone(),
            last_writer: s
                .last_writer
                .iter()
                .filter(|((k, _), _)| *k == key)
                .map(|((_, l), w)| (l.clone(), w.clone()))
                .collect(),
            expired_sent: s.expired_sent,
            rv: s.rv,
        }
    }

    /// `kubectl label node N key=value --overwrite` (or removal with `None`).
    pub fn label(&self, key: &str, value: Option<&str>) {
        self.set_node_key("labels", key, value);
    }

    /// `kubectl annotate node N key=value --overwrite` (or removal with `None`).
    pub fn annotate(&self, key: &str, value: Option<&str>) {
        self.set_node_key("annotations", key, value);
    }

    /// A node label's current value.
    pub fn get_label(&self, key: &str) -> Option<String> {
        self.node_label(&self.node, key)
    }

    /// Adds a further node with these annotations.
    pub fn add_node(&self, name: &str, annotations: &[(&str, &str)]) {
        let a: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        self.put("nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": a}, "spec": {}, "status": {}}));
    }

    /// Answers every write after `delay`.
    pub fn delay_writes(&self, delay: std::time::Duration) {
        self.store().write_delay = delay;
    }

    /// Every pod.
    pub fn pods(&self) -> Vec<Value> {
        self.store().all("pods").into_iter().cloned().collect()
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
