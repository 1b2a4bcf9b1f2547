//! What a pod asks of the GPUs (pure): its GPU resource, how many, whether it waits for one
//! (Pending with the scheduler's `PodScheduled=False, reason Unschedulable`) or holds them on a
//! node, and whether it tolerates the dedicated pool's taint.

use crate::mig::ProfileName;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// Prefix of NVIDIA's MIG resources (`nvidia.com/mig-1g.10gb`, the device plugin's mixed strategy).
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// NVIDIA's whole-GPU resource.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Key of the dedicated pool's default taint (`gpu-dedicated=true:NoSchedule`).
pub const DEDICATED_TAINT_KEY: &str = "gpu-dedicated";

/// A GPU resource the controller can provide.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// One MIG instance of a GPU-instance profile (full compute).
    Mig(ProfileName),
    /// A whole GPU.
    Gpu,
    /// An MPS client slot.
    Mps,
}

impl Resource {
    /// The compute slices one unit takes: a MIG profile's GPU-instance slices, a whole GPU 8,
    /// an MPS slot 1 (how the defragmenter weighs a move's GPU share).
    pub fn compute_slices(&self) -> u32 {
        match self {
            Resource::Mig(p) => p.gi_slices,
            Resource::Gpu => 8,
            Resource::Mps => 1,
        }
    }

    /// The Kubernetes resource name (`mps` is the configured slot resource).
    pub fn name(&self, mps_resource: &str) -> String {
        match self {
            Resource::Mig(p) => format!("{MIG_RESOURCE_PREFIX}{p}"),
            Resource::Gpu => GPU_RESOURCE.to_string(),
            Resource::Mps => mps_resource.to_string(),
        }
    }
}

/// Where a pod stands with its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The scheduler found no node: `PodScheduled=False`, reason `Unschedulable`.
    Unschedulable {
        /// When the condition last changed (RFC 3339 seconds since the epoch), if known.
        since: Option<i64>,
    },
    /// Pending and not (yet) marked unschedulable: the scheduler has not decided.
    Waiting,
    /// Bound to a node and not finished: holds its GPUs there.
    Bound {
        /// The node.
        node: String,
    },
}

/// A pod with one kind of GPU resource.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPod {
    /// `namespace/name`.
    pub key: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (for Events).
    pub uid: String,
    /// The resource.
    pub resource: Resource,
    /// How many of it.
    pub count: u32,
    /// Where it stands.
    pub standing: Standing,
    /// Tolerates the dedicated pool's taint.
    pub dedicated: bool,
    /// Further GPU resources it asks for on the same node (then the controller does not serve it).
    pub also: Vec<(Resource, u32)>,
    /// Why the controller does not serve it, when it does not; it still takes the units the
    /// scheduler gives it (and holds them once bound).
    pub unserved: Option<String>,
    /// Where it may land apart from its GPUs (selector, affinity, tolerations, CPU, memory).
    pub constraints: super::fit::Constraints,
    /// The scheduler's last word on it (the PodScheduled condition's message), while unschedulable.
    pub scheduler_message: Option<String>,
    /// `spec.priority` (the scheduler serves higher first, then older).
    pub priority: i32,
    /// Creation time (seconds since the epoch), if known.
    pub created: Option<i64>,
    /// Its controlling owner, if any (whether something recreates it when it is evicted).
    pub owner: Option<crate::defrag::movable::Owner>,
    /// Its `gpupart.io/movable` annotation, if set.
    pub movable: Option<String>,
}

impl GpuPod {
    /// The pod as the defragmenter judges whether it may move.
    pub fn running(&self) -> crate::defrag::movable::RunningPod {
        crate::defrag::movable::RunningPod {
            key: self.key.clone(),
            namespace: self.namespace.clone(),
            owner: self.owner.clone(),
            movable: self.movable.clone(),
            priority: self.priority,
            created: self.created,
        }
    }

    /// Whether the pod waits for GPUs the cluster does not offer.
    pub fn is_unschedulable(&self) -> bool {
        matches!(self.standing, Standing::Unschedulable { .. })
    }

    /// Every (resource, units) it asks for on its node.
    pub fn asks(&self) -> impl Iterator<Item = (&Resource, u32)> {
        std::iter::once((&self.resource, self.count)).chain(self.also.iter().map(|(r, n)| (r, *n)))
    }

    /// The scheduler's order: higher priority first, then older, then by name.
    pub fn queue_order(&self) -> (std::cmp::Reverse<i32>, Option<i64>, &str) {
        (std::cmp::Reverse(self.priority), self.created, &self.key)
    }

    /// [`Self::queue_order`] as a comparison, for sorting without copying keys.
    pub fn queue_cmp(&self, other: &GpuPod) -> std::cmp::Ordering {
        self.queue_order().cmp(&other.queue_order())
    }

    /// A tensor-parallel pod for the dedicated pool: several whole GPUs and the toleration.
    pub fn is_tensor_parallel(&self) -> bool {
        self.dedicated && self.resource == Resource::Gpu && self.count > 1
    }

    /// As the inter-pod affinity filter sees it.
    pub fn view(&self) -> super::affinity::PodView<'_> {
        super::affinity::PodView {
            namespace: &self.namespace,
            labels: &self.constraints.labels,
            terms: &self.constraints.terms,
        }
    }

    /// The node it is bound to.
    pub fn node(&self) -> Option<&str> {
        match &self.standing {
            Standing::Bound { node } => Some(node),
            _ => None,
        }
    }
}

/// A GPU pod the controller cannot serve, and why (said in an Event on the pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotServed {
    /// `namespace/name`.
    pub key: String,
    /// Why.
    pub reason: String,
    /// The kind of reason (stable while the reason's details drift): one Event per new kind.
    pub kind: &'static str,
}

/// Whole-number value of a Kubernetes quantity as device plugins count (`"2"`); fractions,
/// suffixes and negatives are refused.
fn count_of(q: &str) -> Option<u32> {
    q.trim().parse::<u32>().ok()
}

/// The GPU resources of a pod: per resource name, the larger of the containers' sum and the
/// largest init container (Kubernetes' effective request); requests default to limits.
fn gpu_requests(pod: &Pod, mps_resource: &str) -> Result<BTreeMap<String, u32>, String> {
    let spec = pod.spec.as_ref();
    let wanted = |name: &str| name.starts_with(MIG_RESOURCE_PREFIX) || name == GPU_RESOURCE || name == mps_resource;
    let of_container = |c: &k8s_openapi::api::core::v1::Container| -> Result<BTreeMap<String, u32>, String> {
        let mut out = BTreeMap::new();
        let res = c.resources.as_ref();
        for map in [res.and_then(|r| r.limits.as_ref()), res.and_then(|r| r.requests.as_ref())].into_iter().flatten() {
            for (k, v) in map.iter().filter(|(k, _)| wanted(k)) {
                let n = count_of(&v.0).ok_or_else(|| {
                    format!("container '{}' asks for {k}: '{}', not a whole number of devices", c.name, v.0)
                })?;
                out.insert(k.clone(), n);
            }
        }
        Ok(out)
    };
    let mut sum: BTreeMap<String, u32> = BTreeMap::new();
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or(&[]) {
        for (k, n) in of_container(c)? {
            *sum.entry(k).or_default() += n;
        }
    }
    for c in spec.and_then(|s| s.init_containers.as_deref()).unwrap_or(&[]) {
        for (k, n) in of_container(c)? {
            let e = sum.entry(k).or_default();
            *e = (*e).max(n);
        }
    }
    sum.retain(|_, n| *n > 0);
    Ok(sum)
}

fn seconds(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_second()
}

/// Reads a pod with the default pools: `Ok(None)` when it asks for no GPU resource or has
/// finished; `Err` when it asks for GPUs in a way the controller does not serve (several GPU
/// resources, a compute-instance profile, a bad quantity).
pub fn read(pod: &Pod, mps_resource: &str) -> Result<Option<GpuPod>, NotServed> {
    read_with(pod, mps_resource, &crate::pools::Pools::default())
}

/// [`read`], the dedicated pool's taint as `pools` names it.
pub fn read_with(pod: &Pod, mps_resource: &str, pools: &crate::pools::Pools) -> Result<Option<GpuPod>, NotServed> {
    // Only a pod waiting for a node is ever judged: a bound or running pod the controller cannot
    // read is none of its business (and gets no NotServed Event, nor counts as unserved).
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    match read_any(pod, mps_resource, pools) {
        Err(_) if bound || phase != "Pending" => Ok(None),
        r => r,
    }
}

/// The resource a GPU resource name asks for; the error says why the controller cannot serve it.
fn resource_of(res_name: &str, mps_resource: &str) -> Result<Resource, String> {
    if res_name == GPU_RESOURCE {
        return Ok(Resource::Gpu);
    }
    if res_name == mps_resource {
        return Ok(Resource::Mps);
    }
    let profile = &res_name[MIG_RESOURCE_PREFIX.len()..];
    let p: ProfileName =
        profile.parse().map_err(|e| format!("asks for {res_name}: '{profile}' is not a MIG profile ({e})"))?;
    if p.gi_name() != p {
        return Err(format!(
            "asks for {res_name}, a compute instance inside a GPU instance; the controller creates whole GPU instances ({})",
            p.gi_name()
        ));
    }
    Ok(Resource::Mig(p))
}

/// The scheduler's `PodScheduled=False, reason Unschedulable` condition on a pod, if it has it.
pub fn unschedulable_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| {
        cs.iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    })
}

/// [`read`] for a pod in any phase.
fn read_any(pod: &Pod, mps_resource: &str, pools: &crate::pools::Pools) -> Result<Option<GpuPod>, NotServed> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let not_served = |reason: String| NotServed { key: key.clone(), reason, kind: "unservable" };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if matches!(phase, "Succeeded" | "Failed") || pod.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let requests = gpu_requests(pod, mps_resource).map_err(&not_served)?;
    let mut asked = Vec::new();
    for (res_name, &count) in &requests {
        asked.push((resource_of(res_name, mps_resource).map_err(&not_served)?, count));
    }
    if asked.is_empty() {
        return Ok(None);
    }
    let (resource, count) = asked.remove(0);
    // Several GPU resources: not served, but it competes for the units the scheduler would give it.
    let unserved = (!asked.is_empty()).then(|| {
        let names: Vec<&str> = requests.keys().map(String::as_str).collect();
        format!("asks for several GPU resources ({}); the controller serves pods with one", names.join(", "))
    });
    let spec = pod.spec.as_ref();
    let node = spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
    let unschedulable = unschedulable_condition(pod);
    let standing = match (node, unschedulable) {
        (Some(node), _) => Standing::Bound { node },
        (None, Some(c)) => Standing::Unschedulable { since: c.last_transition_time.as_ref().map(seconds) },
        (None, None) => Standing::Waiting,
    };
    let dedicated = spec.and_then(|s| s.tolerations.as_ref()).is_some_and(|ts| pools.taint.tolerated_by(ts));
    Ok(Some(GpuPod {
        key,
        namespace,
        name,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        resource,
        count,
        standing,
        dedicated,
        also: asked,
        unserved,
        constraints: super::fit::constraints(pod),
        scheduler_message: unschedulable.and_then(|c| c.message.clone()),
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        created: pod.metadata.creation_timestamp.as_ref().map(seconds),
        owner: crate::defrag::movable::RunningPod::read(pod).owner,
        movable: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::defrag::movable::MOVABLE_ANNOTATION))
            .cloned(),
    }))
}

/// A pod for tests: `namespace/name` asking `count` of `resource`, unschedulable since `age`
/// (also its creation time), tolerating nothing, opted in to nothing.
#[cfg(test)]
pub(crate) fn fixture(namespace: &str, name: &str, resource: Resource, count: u32, age: i64) -> GpuPod {
    GpuPod {
        key: format!("{namespace}/{name}"),
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource,
        count,
        standing: Standing::Unschedulable { since: Some(age) },
        dedicated: false,
        also: Vec::new(),
        unserved: None,
        constraints: Default::default(),
        scheduler_message: None,
        priority: 0,
        created: Some(age),
        owner: None,
        movable: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn pending(resources: serde_json::Value) -> Pod {
        pod(serde_json::json!({
            "metadata": {"namespace": "serving", "name": "llm-1", "uid": "u1", "creationTimestamp": "2026-12-04T10:00:00Z"},
            "spec": {"containers": [{"name": "main", "resources": resources}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": "2026-12-04T10:00:05Z"}]}
        }))
    }

    #[test]
    fn a_pending_mig_pod_is_read_with_its_profile_and_since() {
        let p = read(
            &pending(serde_json::json!({"limits": {"nvidia.com/mig-1g.10gb": "2", "cpu": "1"}})),
            "gpupart.io/mps",
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.key, "serving/llm-1");
        assert_eq!(p.resource, Resource::Mig("1g.10gb".parse().unwrap()));
        assert_eq!(p.count, 2);
        assert!(matches!(p.standing, Standing::Unschedulable { since: Some(s) } if s == p.created.unwrap() + 5));
        assert!(!p.dedicated);
    }

    #[test]
    fn init_containers_count_as_the_scheduler_counts_them() {
        let mut p = pending(serde_json::json!({"requests": {"nvidia.com/gpu": "1"}}));
        let init: k8s_openapi::api::core::v1::Container = serde_json::from_value(
            serde_json::json!({"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "4"}}}),
        )
        .unwrap();
        p.spec.as_mut().unwrap().init_containers = Some(vec![init]);
        let r = read(&p, "gpupart.io/mps").unwrap().unwrap();
        assert_eq!((r.resource, r.count), (Resource::Gpu, 4));
    }

    #[test]
    fn pods_the_controller_cannot_serve_say_why() {
        // Several GPU resources: not served, but read as a rival for the units it would take.
        let two = pending(serde_json::json!({"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}}));
        let p = read(&two, "gpupart.io/mps").unwrap().unwrap();
        let why = p.unserved.as_deref().unwrap();
        assert!(why.contains("several GPU resources (nvidia.com/gpu, nvidia.com/mig-1g.10gb)"), "{why}");
        assert_eq!(p.asks().count(), 2);
        let ci = pending(serde_json::json!({"limits": {"nvidia.com/mig-1c.3g.40gb": "1"}}));
        assert!(read(&ci, "gpupart.io/mps").unwrap_err().reason.contains("compute instance"));
        let frac = pending(serde_json::json!({"limits": {"nvidia.com/gpu": "500m"}}));
        assert!(read(&frac, "gpupart.io/mps").unwrap_err().reason.contains("'500m', not a whole number"));
        let cpu = pending(serde_json::json!({"limits": {"cpu": "2"}}));
        assert_eq!(read(&cpu, "gpupart.io/mps").unwrap(), None);
    }

    #[test]
    fn a_running_pod_the_controller_cannot_serve_is_never_judged() {
        let mut ci = pending(serde_json::json!({"limits": {"nvidia.com/mig-1c.3g.40gb": "1"}}));
        assert!(read(&ci, "gpupart.io/mps").is_err(), "pending: told why");
        ci.spec.as_mut().unwrap().node_name = Some("gpu-a".into());
        ci.status.as_mut().unwrap().phase = Some("Running".into());
        assert_eq!(read(&ci, "gpupart.io/mps").unwrap().map(|p| p.key), None, "running: not judged");
        // A bound pod with several GPU resources holds all of them on its node.
        let mut two = pending(serde_json::json!({"limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}}));
        two.spec.as_mut().unwrap().node_name = Some("gpu-a".into());
        let p = read(&two, "gpupart.io/mps").unwrap().unwrap();
        assert_eq!((p.node(), p.asks().count()), (Some("gpu-a"), 2));
    }

    #[test]
    fn bound_pods_hold_their_node_and_tolerations_mark_dedicated_pods() {
        let p = pod(serde_json::json!({
            "metadata": {"namespace": "a", "name": "tp8"},
            "spec": {"nodeName": "gpu-3", "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                     "tolerations": [{"key": "gpu-dedicated", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]},
            "status": {"phase": "Running"}
        }));
        let r = read(&p, "gpupart.io/mps").unwrap().unwrap();
        assert_eq!(r.node(), Some("gpu-3"));
        assert!(r.dedicated);
        let mut done = p.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(read(&done, "gpupart.io/mps").unwrap(), None);
        assert_eq!(crate::pools::Pools::default().taint.key, DEDICATED_TAINT_KEY, "the key is the default taint's");
        let mps = pending(serde_json::json!({"limits": {"gpupart.io/mps": "1"}}));
        assert_eq!(read(&mps, "gpupart.io/mps").unwrap().unwrap().resource, Resource::Mps);
    }
}
