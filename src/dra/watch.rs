//! The ResourceClaim watch: which devices of this node's pool are allocated to claims the
//! kubelet has not prepared yet, so the next publication already treats them as taken. Only the
//! claim uids and device names of this pool are kept, never the claims themselves.

use super::claims::held;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Claim uid → device names it holds in this node's pool.
pub type Held = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// Watches every ResourceClaim; keeps `held` current and wakes `changed` when it changes.
pub fn spawn(client: kube::Client, driver: String, pool: String, held_map: Held, changed: Arc<Notify>) {
    let api: kube::Api<ResourceClaim> = kube::Api::all(client);
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        let mut outage = crate::kube::outage::Outage::new("watching ResourceClaims");
        let mut fresh: Option<BTreeMap<String, Vec<String>>> = None;
        while let Some(ev) = stream.next().await {
            let touched = match ev {
                Ok(Event::Init) => {
                    outage.ok();
                    fresh = Some(BTreeMap::new());
                    false
                }
                Ok(Event::InitApply(c)) => {
                    let devices = held(&c, &driver, &pool);
                    if let (Some(f), Some(uid), false) = (fresh.as_mut(), c.metadata.uid, devices.is_empty()) {
                        f.insert(uid, devices);
                    }
                    false
                }
                Ok(Event::InitDone) => {
                    let next = fresh.take().unwrap_or_default();
                    let mut cur = held_map.lock().unwrap_or_else(|e| e.into_inner());
                    let changed = *cur != next;
                    *cur = next;
                    changed
                }
                Ok(Event::Apply(c)) => {
                    outage.ok();
                    let devices = held(&c, &driver, &pool);
                    let Some(uid) = c.metadata.uid else { continue };
                    let mut cur = held_map.lock().unwrap_or_else(|e| e.into_inner());
                    if devices.is_empty() {
                        cur.remove(&uid).is_some()
                    } else {
                        cur.insert(uid, devices.clone()) != Some(devices)
                    }
                }
                Ok(Event::Delete(c)) => {
                    outage.ok();
                    let Some(uid) = c.metadata.uid else { continue };
                    held_map.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid).is_some()
                }
                Err(watcher::Error::WatchError(status)) if status.code == 410 => continue,
                Err(e) => {
                    tokio::time::sleep(outage.failed(&e)).await;
                    continue;
                }
            };
            if touched {
                changed.notify_one();
            }
        }
    });
}
