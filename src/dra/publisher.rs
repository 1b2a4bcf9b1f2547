//! Publishes the node's pool as ResourceSlices: every device the GPUs could have, each in its
//! group's slice for good, the ones that can be created now first in gpupart's order (so no
//! device the scheduler may be allocating ever leaves the pool or moves, and the scheduler keeps
//! counting every allocated device's counters); only slices whose content changed are written,
//! each in one write; the generation is bumped only when the set of slices changes (the GPUs
//! changed, or an earlier layout is replaced), then every slice is written back to back and the
//! stale ones deleted.

use anyhow::Context;
use gpupart_node::backend::GpuBackend;
use gpupart_node::dra::api_features::{withhold, Kept};
use gpupart_node::dra::devices::DeviceRef;
use gpupart_node::dra::publish::{content, names, Catalog, PublishedGpu};
use gpupart_node::dra::slices::{keep_unchanged, write_plan, Slice, SliceSpec};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, PostParams};
use std::collections::BTreeMap;

/// What one publication did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    /// Slices written (created or replaced).
    pub written: usize,
    /// Stale slices deleted.
    pub deleted: usize,
    /// Devices published.
    pub devices: usize,
    /// The pool's generation.
    pub generation: i64,
}

/// The node's pool in the API.
pub struct Publisher {
    api: kube::Api<ResourceSlice>,
    driver: String,
    node: String,
    generation: i64,
    /// The ownerReference every slice carries: the Node, so that deleting it removes them.
    owner: OwnerReference,
    /// What the API holds of ours: name → spec.
    current: BTreeMap<String, SliceSpec>,
    /// Slices in `current` that do not name the Node as their owner (written by an older version
    /// or by hand): rewritten at the next publication even when their content stays.
    unowned: std::collections::BTreeSet<String>,
    /// The resourceVersion of each slice in `current`.
    versions: BTreeMap<String, Option<String>>,
    /// The backend's driver version, read once.
    pub driver_version: String,
    /// Counter sets per model.
    pub catalog: Catalog,
    /// The optional fields the API server keeps: devices that need another are left out.
    pub kept: Kept,
}

/// A ResourceSlice's spec as the pure model reads it.
pub fn to_spec(s: &ResourceSlice) -> Option<SliceSpec> {
    serde_json::to_value(&s.spec).ok().and_then(|v| serde_json::from_value(v).ok())
}

/// The ResourceSlice object of `s`, owned by `owner` if given.
pub fn object(s: &Slice, owner: Option<OwnerReference>) -> anyhow::Result<ResourceSlice> {
    let spec = serde_json::from_value(serde_json::to_value(&s.spec)?).context("building a ResourceSlice")?;
    let mut obj = ResourceSlice { metadata: Default::default(), spec };
    obj.metadata.name = Some(s.name.clone());
    obj.metadata.owner_references = owner.map(|o| vec![o]);
    Ok(obj)
}

impl Publisher {
    /// Reads what the API holds of this node's pool; `uid` is the Node's (it owns the slices).
    pub async fn start(
        client: kube::Client,
        driver: &str,
        node: &str,
        uid: String,
        backend: &dyn GpuBackend,
    ) -> anyhow::Result<Self> {
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid,
            controller: Some(true),
            block_owner_deletion: None,
        };
        let api: kube::Api<ResourceSlice> = kube::Api::all(client);
        let mut p = Self {
            owner,
            api,
            driver: driver.to_string(),
            node: node.to_string(),
            generation: 0,
            current: BTreeMap::new(),
            unowned: Default::default(),
            versions: BTreeMap::new(),
            driver_version: backend.driver_version().unwrap_or_default(),
            catalog: Catalog::default(),
            kept: Kept::ALL,
        };
        p.refresh().await?;
        Ok(p)
    }

    /// Lists this node's slices of this driver.
    async fn refresh(&mut self) -> anyhow::Result<()> {
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = self.api.list(&lp).await.context("listing this node's ResourceSlices")?;
        self.current.clear();
        self.versions.clear();
        self.unowned.clear();
        for s in list.items.iter().filter(|s| s.spec.driver == self.driver) {
            let Some(name) = s.metadata.name.clone() else { continue };
            self.generation = self.generation.max(s.spec.pool.generation);
            if let Some(spec) = to_spec(s) {
                if s.metadata.owner_references.as_deref() != Some(std::slice::from_ref(&self.owner)) {
                    self.unowned.insert(name.clone());
                }
                self.versions.insert(name.clone(), s.metadata.resource_version.clone());
                self.current.insert(name, spec);
            }
        }
        Ok(())
    }

    /// Publishes every device, `offered` first (in order) within each group, `unavailable` ones
    /// and those of `fenced` (unhealthy) GPUs tainted: rewrites changed slices in place, bumps the generation when the set of
    /// slices changes, deletes stale ones.
    pub async fn publish(
        &mut self,
        gpus: &[PublishedGpu],
        offered: &[DeviceRef],
        unavailable: &BTreeMap<DeviceRef, String>,
        fenced: &BTreeMap<DeviceRef, gpupart_node::dra::slices::DeviceTaint>,
    ) -> anyhow::Result<Published> {
        let mut slices = content(&self.driver, &self.node, self.generation.max(1), gpus, offered, unavailable, fenced);
        withhold(&mut slices, self.kept);
        let same_set = slices.len() == self.current.len() && slices.iter().all(|s| self.current.contains_key(&s.name));
        if !same_set || self.generation == 0 {
            self.generation += 1;
            for s in &mut slices {
                s.spec.pool.generation = self.generation;
            }
        }
        // A slice the scheduler would use as it is now is not written.
        let slices = keep_unchanged(&self.current, slices, &names(gpus, offered));
        let mut out = Published {
            generation: self.generation,
            devices: slices.iter().map(|s| s.spec.devices.len()).sum(),
            ..Published::default()
        };
        for s in write_plan(&self.current, &slices) {
            self.write(&s).await?;
            out.written += 1;
        }
        let unowned: Vec<&Slice> = slices.iter().filter(|s| self.unowned.contains(&s.name)).collect();
        for s in unowned {
            self.write(s).await?;
            out.written += 1;
        }
        let stale: Vec<String> =
            self.current.keys().filter(|n| !slices.iter().any(|s| &s.name == *n)).cloned().collect();
        for name in stale {
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(anyhow::Error::new(e).context(format!("deleting the stale ResourceSlice {name}"))),
            }
            self.current.remove(&name);
            self.versions.remove(&name);
            out.deleted += 1;
        }
        Ok(out)
    }

    async fn write(&mut self, s: &Slice) -> anyhow::Result<()> {
        let mut obj = object(s, Some(self.owner.clone()))?;
        let pp = PostParams { field_manager: Some(crate::kube::keys::FIELD_MANAGER.into()), ..Default::default() };
        let written = match self.versions.get(&s.name) {
            Some(rv) => {
                obj.metadata.resource_version = rv.clone();
                match self.api.replace(&s.name, &pp, &obj).await {
                    Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                        // Changed or gone behind our back: read it again and write over it.
                        obj.metadata.resource_version = None;
                        match self.api.get_opt(&s.name).await? {
                            Some(cur) => {
                                obj.metadata.resource_version = cur.metadata.resource_version;
                                self.api.replace(&s.name, &pp, &obj).await
                            }
                            None => self.api.create(&pp, &obj).await,
                        }
                    }
                    other => other,
                }
            }
            None => match self.api.create(&pp, &obj).await {
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let cur = self.api.get(&s.name).await?;
                    obj.metadata.resource_version = cur.metadata.resource_version;
                    self.api.replace(&s.name, &pp, &obj).await
                }
                other => other,
            },
        }
        .with_context(|| format!("writing the ResourceSlice {}", s.name))?;
        self.versions.insert(s.name.clone(), written.metadata.resource_version.clone());
        self.current.insert(s.name.clone(), s.spec.clone());
        self.unowned.remove(&s.name);
        Ok(())
    }
}
