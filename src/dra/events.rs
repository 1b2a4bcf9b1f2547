//! Events on ResourceClaims whose devices could not be prepared (`kubectl describe` on the claim
//! and on its pod shows why): a Warning `PrepareFailed` in the claim's namespace, once per
//! distinct message (the kubelet retries with the same error).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use std::collections::HashMap;
use std::sync::Mutex;

/// Posts claim Events, skipping a repeat of a claim's last message.
pub struct ClaimEvents {
    client: kube::Client,
    node: String,
    last: Mutex<HashMap<String, String>>,
}

impl ClaimEvents {
    /// Events reported as this node's plugin.
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self { client, node: node.to_string(), last: Mutex::default() }
    }

    /// Records that claim (`namespace`, `name`, `uid`) failed with `message`; returns at once
    /// (the Event is posted in the background).
    pub fn prepare_failed(&self, namespace: &str, name: &str, uid: &str, message: &str) {
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.get(uid).is_some_and(|m| m == message) {
                return;
            }
            if last.len() > 10_000 {
                last.clear();
            }
            last.insert(uid.to_string(), message.to_string());
        }
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some("Prepare".into()),
            reason: Some("PrepareFailed".into()),
            note: Some(message.chars().take(1000).collect()),
            type_: Some("Warning".into()),
            regarding: Some(ObjectReference {
                api_version: Some("resource.k8s.io/v1".into()),
                kind: Some("ResourceClaim".into()),
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                uid: Some(uid.to_string()),
                ..Default::default()
            }),
            reporting_controller: Some("gpupart.io/dra".into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        tokio::spawn(async move {
            let pp = PostParams { field_manager: Some(crate::kube::keys::FIELD_MANAGER.into()), ..Default::default() };
            if let Err(e) = api.create(&pp, &ev).await {
                tracing::warn!(error = %e, "recording the claim's event failed");
            }
        });
    }

    /// Forgets a claim (prepared or unprepared).
    pub fn forget(&self, uid: &str) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}
