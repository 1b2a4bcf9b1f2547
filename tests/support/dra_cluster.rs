//! The rest of a cluster around one DRA node, for tests where pods come and go: the
//! ResourceClaim controller, kube-scheduler and the kubelet, each acting as the real one does on
//! the pods and claims of namespace `ml`, one [`DraCluster::tick`] at a time.
//!
//! - ResourceClaim controller (pkg/controller/resourceclaim/controller.go): for each pod claim
//!   naming a `resourceClaimTemplateName`, creates a claim from the template's spec (named
//!   `<pod>-<claim>`, annotated `resource.kubernetes.io/pod-claim-name`) and records it in the
//!   pod's `status.resourceClaimStatuses`; once the pod is gone and the kubelet unprepared it,
//!   the claim (kept until then by its finalizer) is deallocated and deleted.
//! - kube-scheduler: a Pending pod whose claims all exist and whose node selector the node
//!   matches gets its unallocated claims allocated from the published slices
//!   ([`DraRig::schedule`]), then `status.reservedFor`, then the binding; a pod it cannot place
//!   gets `PodScheduled=False, reason Unschedulable`.
//! - kubelet: prepares the claims of a pod bound to the node (the pod turns Running and Ready),
//!   unprepares them once the pod is deleted.
//!
//! What the real ones do and this does not: the random suffix of generated claim names, the
//! scheduler's backoff and its retry on cluster events (here: every tick), several nodes.
#![allow(dead_code)]

use super::dra_rig::{DraRig, NODE};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The stand-ins' memory: the claims the kubelet prepared, per pod.
#[derive(Default)]
pub struct DraCluster {
    prepared: BTreeMap<String, Vec<String>>,
    /// Allocations made, in order: (claim, device).
    pub allocations: Vec<(String, String)>,
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

impl DraCluster {
    /// Pods already running when the test starts: prepared by the kubelet.
    pub fn running(&mut self, pod: &str, claims: &[&str]) {
        self.prepared.insert(pod.to_string(), claims.iter().map(|c| c.to_string()).collect());
    }

    /// One round of the three stand-ins.
    pub fn tick(&mut self, rig: &DraRig) {
        self.claim_controller(rig);
        self.kubelet_cleanup(rig);
        self.scheduler(rig);
    }

    fn claim_controller(&mut self, rig: &DraRig) {
        for p in rig.api.pods() {
            let name = s(&p["metadata"]["name"]);
            let mut statuses = p["status"]["resourceClaimStatuses"].as_array().cloned().unwrap_or_default();
            let mut added = false;
            for rc in p["spec"]["resourceClaims"].as_array().cloned().unwrap_or_default() {
                let Some(template) = rc["resourceClaimTemplateName"].as_str() else { continue };
                let pod_claim = s(&rc["name"]);
                if statuses.iter().any(|x| x["name"] == pod_claim.as_str()) {
                    continue;
                }
                let Some(t) = rig.api.get("resourceclaimtemplates", "ml", template) else { continue };
                let claim = format!("{name}-{pod_claim}");
                rig.api.put(
                    "resourceclaims",
                    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": claim, "namespace": "ml", "uid": format!("uid-{claim}"),
                                        "annotations": {"resource.kubernetes.io/pod-claim-name": pod_claim},
                                        "finalizers": ["resource.kubernetes.io/delete-protection"]},
                           "spec": t["spec"]["spec"].clone()}),
                );
                statuses.push(json!({"name": pod_claim, "resourceClaimName": claim}));
                added = true;
            }
            if added {
                self.patch_pod(rig, &name, |p| p["status"]["resourceClaimStatuses"] = json!(statuses));
            }
        }
    }

    fn kubelet_cleanup(&mut self, rig: &DraRig) {
        let gone: Vec<String> =
            self.prepared.keys().filter(|pod| rig.api.get("pods", "ml", pod).is_none()).cloned().collect();
        for pod in gone {
            for claim in self.prepared.remove(&pod).unwrap_or_default() {
                let e = rig.unprepare(&claim);
                assert_eq!(e, "", "unpreparing {claim}");
                // Unused now: deallocated, the finalizer lifted, deleted.
                rig.delete_claim(&claim);
            }
        }
    }

    fn claims_of(p: &Value) -> Option<Vec<String>> {
        let statuses = p["status"]["resourceClaimStatuses"].as_array().cloned().unwrap_or_default();
        p["spec"]["resourceClaims"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|rc| {
                rc["resourceClaimName"].as_str().map(str::to_string).or_else(|| {
                    statuses
                        .iter()
                        .find(|x| x["name"] == rc["name"])
                        .and_then(|x| x["resourceClaimName"].as_str())
                        .map(str::to_string)
                })
            })
            .collect()
    }

    fn scheduler(&mut self, rig: &DraRig) {
        for p in rig.api.pods() {
            let name = s(&p["metadata"]["name"]);
            if p["spec"]["nodeName"].is_string() || p["metadata"]["deletionTimestamp"].is_string() {
                continue;
            }
            let Some(claims) = Self::claims_of(&p) else { continue };
            let mut refused = None;
            // The node filters run before the claims are allocated: a pod whose node selector the
            // node does not match gets no allocation at all.
            let labels = rig.api.get("nodes", "", NODE).map(|n| n["metadata"]["labels"].clone()).unwrap_or_default();
            let selected =
                p["spec"]["nodeSelector"].as_object().is_none_or(|sel| sel.iter().all(|(k, v)| labels[k] == *v));
            if !selected {
                refused =
                    Some("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.".to_string());
            }
            for c in claims.iter().filter(|_| refused.is_none()) {
                let Some(claim) = rig.api.get("resourceclaims", "ml", c) else {
                    refused = Some(format!("waiting for claim {c}"));
                    break;
                };
                if claim["status"]["allocation"].is_object() {
                    continue;
                }
                match rig.schedule(c) {
                    Ok(got) => self.allocations.extend(got.into_iter().map(|a| (c.clone(), a.device))),
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            if let Some(why) = refused {
                let said = p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "PodScheduled" && c["reason"] == "Unschedulable"));
                if !said {
                    self.patch_pod(rig, &name, |p| {
                        p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": why, "lastTransitionTime": super::apiserver::now_rfc3339()}]);
                    });
                }
                continue;
            }
            let uid = s(&p["metadata"]["uid"]);
            for c in &claims {
                let key = ("resourceclaims".to_string(), "ml".to_string(), c.clone());
                let (pod, uid) = (name.clone(), uid.clone());
                rig.api.change(|st| {
                    if let Some(mut claim) = st.objects.get(&key).cloned() {
                        claim["status"]["reservedFor"] = json!([{"resource": "pods", "name": pod, "uid": uid}]);
                        st.put(key.clone(), claim);
                    }
                });
            }
            self.patch_pod(rig, &name, |p| {
                p["spec"]["nodeName"] = json!(NODE);
                p["status"]["phase"] = json!("Running");
                p["status"]["conditions"] =
                    json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]);
            });
            for c in &claims {
                rig.prepare(c).unwrap_or_else(|e| panic!("preparing {c}: {e}"));
            }
            self.prepared.insert(name, claims);
        }
    }

    fn patch_pod(&self, rig: &DraRig, name: &str, f: impl FnOnce(&mut Value)) {
        let key = ("pods".to_string(), "ml".to_string(), name.to_string());
        rig.api.change(|st| {
            if let Some(mut p) = st.objects.get(&key).cloned() {
                f(&mut p);
                st.put(key.clone(), p);
            }
        });
    }
}
