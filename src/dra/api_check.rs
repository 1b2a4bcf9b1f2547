//! What the API server serves of DRA, found at start (docs/dra.md, "Kubernetes versions"): its
//! version, whether it serves `resource.k8s.io/v1`, which optional ResourceSlice fields it keeps
//! (a dry-run write of a probe pool: nothing is stored), and whether the DeviceClasses that map
//! classic extended resources kept `extendedResourceName`. What it lacks is said once at start;
//! what the plugin cannot do without stops it.

use super::publisher::{object, to_spec};
use anyhow::Context;
use gpupart_node::dra::api_features::{kept, probe, Feature, Kept};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{ListParams, PostParams};

/// What the API server serves of what the plugin uses.
#[derive(Debug, Clone)]
pub struct Served {
    /// Its `gitVersion` (`v1.36.2`), or `version unknown`.
    pub version: String,
    /// The optional ResourceSlice fields it keeps.
    pub kept: Kept,
}

/// The API group the plugin publishes and reads, in version `v1`.
const GROUP: &str = "resource.k8s.io";

/// Finds out what `server` serves; an error when the plugin cannot run there (no
/// `resource.k8s.io/v1`, counters dropped or the probe refused), warnings for what it does
/// without, and one line saying what was found.
pub async fn check(client: &kube::Client, server: &str, driver: &str, node: &str) -> anyhow::Result<Served> {
    let version = match client.apiserver_version().await {
        Ok(info) => info.git_version,
        Err(e) => {
            tracing::debug!(error = %e, "reading the API server's version");
            "version unknown".to_string()
        }
    };
    let at = format!("the API server {server} (Kubernetes {version})");
    let versions =
        crate::kube::group_versions(client, GROUP).await.with_context(|| format!("{at}: listing its API groups"))?;
    if !versions.iter().any(|v| v == "v1") {
        let serves = if versions.is_empty() {
            format!("does not serve {GROUP}")
        } else {
            format!("serves {GROUP} {} only", versions.join(", "))
        };
        anyhow::bail!(
            "{at} {serves}: `gpupart agent --dra` publishes {GROUP}/v1 ResourceSlices, served since Kubernetes 1.34 (docs/dra.md, Kubernetes versions)"
        );
    }
    let kept = probe_slices(client, &at, driver, node).await?;
    if !kept.counters {
        let f = Feature::Counters;
        anyhow::bail!(
            "{at} drops {} (feature gate {}, {}): without them {}. Turn the gate on (kube-apiserver, kube-scheduler and kube-controller-manager) or run Kubernetes 1.36 or newer",
            f.field(),
            f.gate(),
            f.releases(),
            f.without()
        );
    }
    for f in kept.dropped() {
        tracing::warn!(
            feature_gate = %f.gate(),
            "{at} drops {} ({}): {}",
            f.field(),
            f.releases(),
            f.without()
        );
    }
    let classes = extended_resources(client, &at, driver).await;
    tracing::info!(
        version = %version,
        api = "resource.k8s.io/v1",
        counters = kept.counters,
        taints = kept.taints,
        shared_devices = kept.shared_devices,
        extended_resources = classes,
        "the API server serves what the plugin publishes"
    );
    Ok(Served { version, kept })
}

/// Writes the probe pool in a dry run and reads which of its fields came back.
async fn probe_slices(client: &kube::Client, at: &str, driver: &str, node: &str) -> anyhow::Result<Kept> {
    let api: kube::Api<ResourceSlice> = kube::Api::all(client.clone());
    let pp = PostParams { dry_run: true, field_manager: Some(crate::kube::keys::FIELD_MANAGER.into()) };
    let mut answered = Vec::new();
    for s in probe(driver, node) {
        match api.create(&pp, &object(&s, None)?).await {
            Ok(back) => answered.extend(to_spec(&back)),
            Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => anyhow::bail!(
                "{at} refuses to let the plugin write ResourceSlices ({}): grant it the ClusterRole in deploy/dra/daemonset.yaml",
                e.message
            ),
            Err(kube::Error::Api(e)) if e.code == 400 || e.code == 422 => {
                // 1.34's validation of counters, or anything else that refuses (an admission policy).
                let hint = if e.message.contains("counterSet") || e.message.contains("sharedCounters") {
                    format!(
                        ": counter sets in slices of their own need Kubernetes 1.36, or 1.35 with the feature gate {} on",
                        Feature::Counters.gate()
                    )
                } else {
                    String::new()
                };
                anyhow::bail!("{at} refuses the plugin's ResourceSlices ({}){hint}", e.message)
            }
            Err(e) => return Err(e).with_context(|| format!("{at}: writing a probe ResourceSlice in a dry run")),
        }
    }
    Ok(kept(&answered))
}

/// Whether the DeviceClasses selecting this driver's MIG profiles map classic extended resources:
/// `served` (some carry `extendedResourceName`), `dropped` (none does: the server drops the field,
/// or they were written without it), `no classes` or `unknown` (not allowed to read them).
async fn extended_resources(client: &kube::Client, at: &str, driver: &str) -> &'static str {
    let api: kube::Api<DeviceClass> = kube::Api::all(client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "reading the DeviceClasses");
            return "unknown";
        }
    };
    let selects = |c: &DeviceClass, what: &str| {
        c.spec.iter().flat_map(|s| s.selectors.iter().flatten()).filter_map(|s| s.cel.as_ref()).any(|cel| {
            let e = &cel.expression;
            (e.contains(&format!("device.driver == '{driver}'"))
                || e.contains(&format!("device.driver == \"{driver}\"")))
                && e.contains(what)
        })
    };
    let ours: Vec<&DeviceClass> = list.items.iter().filter(|c| selects(c, "")).collect();
    if ours.is_empty() {
        tracing::warn!(
            "no DeviceClass selects driver {driver}'s devices: no claim can ask for them (kubectl apply -f deploy/dra/deviceclasses.yaml)"
        );
        return "no classes";
    }
    let per_profile: Vec<&DeviceClass> = ours.iter().copied().filter(|c| selects(c, ".profile ==")).collect();
    if per_profile.is_empty()
        || per_profile.iter().any(|c| c.spec.as_ref().is_some_and(|s| s.extended_resource_name.is_some()))
    {
        return "served";
    }
    let f = Feature::ExtendedResources;
    let names: Vec<&str> = per_profile.iter().filter_map(|c| c.metadata.name.as_deref()).take(3).collect();
    tracing::warn!(
        feature_gate = %f.gate(),
        classes = per_profile.len(),
        "DeviceClasses {}{} select {driver}'s MIG profiles but none has {}: {}. {at} drops the field unless {} is on ({}); apply deploy/dra/deviceclasses.yaml again once it is",
        names.join(", "),
        if per_profile.len() > names.len() { ", …" } else { "" },
        f.field(),
        f.without(),
        f.gate(),
        f.releases()
    );
    "dropped"
}
