//! The kubelet's PodResources answer as a list of allocations (pure); what they mean for the
//! GPUs is [`gpupart_node::allocations`].

use super::podresources::ListPodResourcesResponse;
use crate::observed::PodUse;
pub use gpupart_node::allocations::{attach, in_the_way};

/// One entry per allocated device id, in the kubelet's order.
pub fn flatten(resp: &ListPodResourcesResponse) -> Vec<PodUse> {
    let mut out = Vec::new();
    for pod in &resp.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                for id in &d.device_ids {
                    out.push(PodUse {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                        resource: d.resource_name.clone(),
                        device_id: id.clone(),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::podresources::{ContainerDevices, ContainerResources, PodResources};

    #[test]
    fn flatten_keeps_pod_container_resource_and_id() {
        let resp = ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "llm".into(),
                namespace: "serving".into(),
                containers: vec![ContainerResources {
                    name: "vllm".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/mig-3g.40gb".into(),
                        device_ids: vec!["MIG-a".into(), "MIG-b".into()],
                        topology: None,
                    }],
                    ..Default::default()
                }],
            }],
        };
        let f = flatten(&resp);
        assert_eq!(f.len(), 2);
        assert_eq!(f[1].to_string(), "serving/llm/vllm (nvidia.com/mig-3g.40gb)");
        assert_eq!(f[1].device_id, "MIG-b");
    }
}
