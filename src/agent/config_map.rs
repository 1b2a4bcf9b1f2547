//! The config from a ConfigMap through the API (`agent --config-map NS/NAME`): its `config.yaml`
//! is watched, so a layout `gpupart controller` writes is usable at once, not after the
//! kubelet's volume sync; a missing ConfigMap or key is a config error naming it.

use crate::cli::ObjectName;
use crate::kube::outage::Outage;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Key of the config in the ConfigMap.
pub const KEY: &str = "config.yaml";

/// The latest config text of a watched ConfigMap (`None` until first read).
#[derive(Clone)]
pub struct ConfigMapConfig {
    name: ObjectName,
    api: Api<ConfigMap>,
    text: Arc<Mutex<Option<Result<String, String>>>>,
}

fn text_of(name: &ObjectName, cm: Option<&ConfigMap>) -> Result<String, String> {
    let cm = cm.ok_or_else(|| format!("ConfigMap {name} does not exist"))?;
    cm.data.as_ref().and_then(|d| d.get(KEY)).cloned().ok_or_else(|| format!("ConfigMap {name} has no key {KEY}"))
}

impl ConfigMapConfig {
    /// Starts watching `name`; `changed` hears of every change of its text.
    pub fn spawn(client: Client, name: ObjectName, changed: mpsc::Sender<()>) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, &name.namespace);
        let this = Self { name: name.clone(), api: api.clone(), text: Arc::new(Mutex::new(None)) };
        let text = this.text.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={}", name.name));
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).boxed();
            let mut outage = Outage::new("watching the config ConfigMap");
            let mut seen_in_init = false;
            while let Some(ev) = stream.next().await {
                let next = match ev {
                    Ok(Event::Apply(cm) | Event::InitApply(cm)) => {
                        seen_in_init = true;
                        text_of(&name, Some(&cm))
                    }
                    Ok(Event::Delete(_)) => text_of(&name, None),
                    Ok(Event::Init) => {
                        seen_in_init = false;
                        continue;
                    }
                    Ok(Event::InitDone) if seen_in_init => continue,
                    Ok(Event::InitDone) => text_of(&name, None),
                    Err(e) => {
                        tokio::time::sleep(outage.failed(&e)).await;
                        continue;
                    }
                };
                outage.ok();
                let fire = {
                    let mut cur = text.lock().unwrap_or_else(|e| e.into_inner());
                    let fire = cur.as_ref() != Some(&next);
                    *cur = Some(next);
                    fire
                };
                if fire && changed.send(()).await.is_err() {
                    return;
                }
            }
        });
        this
    }

    /// The latest text (`None` before the first read).
    pub fn text(&self) -> Option<Result<String, String>> {
        self.text.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the ConfigMap now (when the requested layout is not in the cached text yet: the
    /// layout label and the ConfigMap are two writes, and their watch events may cross).
    pub async fn refresh(&self) {
        let next = match self.api.get_opt(&self.name.name).await {
            Ok(cm) => text_of(&self.name, cm.as_ref()),
            Err(e) => {
                tracing::debug!(error = %e, "re-reading the config ConfigMap failed");
                return;
            }
        };
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = Some(next);
    }

    /// Its name.
    pub fn name(&self) -> &ObjectName {
        &self.name
    }
}
