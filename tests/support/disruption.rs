//! The API test server's `pods/eviction` subresource and the controllers behind it, written from
//! Kubernetes' own rules (pkg/registry/core/pod/storage/eviction.go, the disruption controller,
//! the ReplicaSet controller):
//! - **Eviction** (`POST .../pods/{name}/eviction`, a `policy/v1` Eviction): a pod that is
//!   Pending, finished or already being deleted is deleted at once; otherwise the
//!   PodDisruptionBudgets of its namespace whose selector matches it decide: none, it is deleted
//!   (201); more than one, `500` ("more than one PodDisruptionBudget"); one, a pod that is not
//!   Ready goes when the budget's `unhealthyPodEvictionPolicy` lets it (`AlwaysAllow`, or
//!   `IfHealthyBudget` with the budget met); else `disruptionsAllowed` 0 answers `429` with the
//!   cause `DisruptionBudget`, and above 0 the budget is decremented, the pod recorded in
//!   `status.disruptedPods` and the pod deleted.
//! - **The disruption controller**, as of the eviction: a budget's status from the pods it
//!   selects: `currentHealthy` = Ready pods not being deleted and not in `disruptedPods`;
//!   `expectedPods` = the owners' `spec.replicas` (pods counted when an owner is unknown);
//!   `desiredHealthy` from `minAvailable` (an integer, or a percentage of `expectedPods`
//!   rounded up) or `expectedPods - maxUnavailable` (a percentage rounded up);
//!   `disruptionsAllowed` = max(0, currentHealthy - desiredHealthy). `disruptedPods` entries
//!   drop when their pod is gone.
//! - **The ReplicaSet controller**: when a pod owned by a ReplicaSet that still exists is
//!   deleted, a new pod from the ReplicaSet's `spec.template` (named `<replicaset>-<n>`, owned by
//!   it, unscheduled) is created a moment later, as the controller does after it sees the
//!   deletion.

use super::apiserver::{now_rfc3339, Store};
use serde_json::{json, Value};

/// What an eviction request gets: the status code and its body.
pub type Answer = (u16, Value);

fn failure(code: u16, reason: &str, message: &str, causes: Value) -> Answer {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
               "details": {"causes": causes}, "code": code}),
    )
}

/// Whether a pod has the condition `Ready=True`.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Whether `labels` satisfy a label selector (`matchLabels` and `matchExpressions`).
pub fn matches(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels[k].as_str();
    let by_labels = selector["matchLabels"].as_object().is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let by_expressions = selector["matchExpressions"].as_array().is_none_or(|es| {
        es.iter().all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            match e["operator"].as_str() {
                Some("In") => label(key).is_some_and(|v| values.contains(&v)),
                Some("NotIn") => label(key).is_none_or(|v| !values.contains(&v)),
                Some("Exists") => label(key).is_some(),
                Some("DoesNotExist") => label(key).is_none(),
                _ => false,
            }
        })
    });
    // An empty selector selects every pod in policy/v1.
    by_labels && by_expressions
}

/// An int-or-percent value against `total`, percentages rounded up.
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total + 99) / 100)
        }
        _ => None,
    }
}

/// The pods a budget selects, in its namespace.
fn selected<'a>(s: &'a Store, pdb: &Value) -> Vec<&'a Value> {
    let ns = pdb["metadata"]["namespace"].as_str().unwrap_or("");
    s.all("pods")
        .into_iter()
        .filter(|p| {
            p["metadata"]["namespace"].as_str() == Some(ns)
                && matches(&pdb["spec"]["selector"], &p["metadata"]["labels"])
        })
        .collect()
}

/// The budget's status as the disruption controller computes it now.
pub fn budget_status(s: &Store, pdb: &Value) -> Value {
    let pods = selected(s, pdb);
    let names: Vec<&str> = pods.iter().filter_map(|p| p["metadata"]["name"].as_str()).collect();
    let mut disrupted = pdb["status"]["disruptedPods"].as_object().cloned().unwrap_or_default();
    disrupted.retain(|name, _| names.contains(&name.as_str()));
    let healthy = pods
        .iter()
        .filter(|p| ready(p) && p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| !disrupted.contains_key(p["metadata"]["name"].as_str().unwrap_or("")))
        .count() as i64;
    // The owners' scale: each owning ReplicaSet's replicas once; pods without a known owner count
    // one each.
    let mut owners = std::collections::BTreeSet::new();
    let mut expected = 0i64;
    for p in &pods {
        let owner =
            p["metadata"]["ownerReferences"].as_array().and_then(|o| o.iter().find(|r| r["controller"] == true));
        let rs = owner.filter(|o| o["kind"] == "ReplicaSet").and_then(|o| {
            let ns = p["metadata"]["namespace"].as_str().unwrap_or("");
            s.get("replicasets", ns, o["name"].as_str().unwrap_or(""))
        });
        match rs {
            Some(rs) => {
                if owners.insert(rs["metadata"]["name"].clone().to_string()) {
                    expected += rs["spec"]["replicas"].as_i64().unwrap_or(1);
                }
            }
            None => expected += 1,
        }
    }
    let spec = &pdb["spec"];
    let desired = if !spec["minAvailable"].is_null() {
        if spec["minAvailable"].is_number() {
            expected = pods.len() as i64;
        }
        scaled(&spec["minAvailable"], expected).unwrap_or(0)
    } else {
        (expected - scaled(&spec["maxUnavailable"], expected).unwrap_or(0)).max(0)
    };
    json!({
        "observedGeneration": pdb["metadata"]["generation"].as_i64().unwrap_or(1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": (healthy - desired).max(0),
        "disruptedPods": disrupted,
    })
}

/// Answers an eviction of pod `ns/name`; deletes it (through `delete`, which also starts the
/// ReplicaSet's replacement) when the budgets allow.
pub fn evict(s: &mut Store, ns: &str, name: &str, body: &Value, delete: impl FnOnce(&mut Store)) -> Answer {
    if body["kind"].as_str().is_some_and(|k| k != "Eviction")
        || body["metadata"]["name"].as_str().is_some_and(|n| n != name)
    {
        return failure(
            400,
            "BadRequest",
            &format!("name in URL does not match name in Eviction object: {name}"),
            json!([]),
        );
    }
    let Some(pod) = s.get("pods", ns, name).cloned() else {
        return failure(404, "NotFound", &format!("pods \"{name}\" not found"), json!([]));
    };
    let done = || (201, json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}));
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    if matches!(phase, "Pending" | "Succeeded" | "Failed") || !pod["metadata"]["deletionTimestamp"].is_null() {
        delete(s);
        return done();
    }
    let budgets: Vec<Value> = s
        .all("poddisruptionbudgets")
        .into_iter()
        .filter(|b| {
            b["metadata"]["namespace"].as_str() == Some(ns)
                && matches(&b["spec"]["selector"], &pod["metadata"]["labels"])
        })
        .cloned()
        .collect();
    let pdb = match budgets.as_slice() {
        [] => {
            delete(s);
            return done();
        }
        [one] => one.clone(),
        _ => {
            return failure(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                json!([]),
            )
        }
    };
    let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut status = budget_status(s, &pdb);
    let healthy_met = status["currentHealthy"].as_i64() >= status["desiredHealthy"].as_i64();
    let unhealthy_may_go = match pdb["spec"]["unhealthyPodEvictionPolicy"].as_str() {
        Some("AlwaysAllow") => true,
        _ => healthy_met,
    };
    if !ready(&pod) && unhealthy_may_go {
        delete(s);
        return done();
    }
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed == 0 {
        let mut with_status = pdb.clone();
        with_status["status"] = status.clone();
        s.put(("poddisruptionbudgets".into(), ns.into(), pdb_name.clone()), with_status);
        let cause = format!(
            "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
            status["desiredHealthy"], status["currentHealthy"]
        );
        return failure(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            json!([{"reason": "DisruptionBudget", "message": cause}]),
        );
    }
    status["disruptionsAllowed"] = json!(allowed - 1);
    status["disruptedPods"][name] = json!(now_rfc3339());
    let mut with_status = pdb;
    with_status["status"] = status;
    s.put(("poddisruptionbudgets".into(), ns.into(), pdb_name), with_status);
    delete(s);
    done()
}

/// The pod the ReplicaSet controller creates for a deleted pod `old`, if a ReplicaSet owns it and
/// still exists: `(namespace, pod)`.
pub fn replacement(s: &Store, old: &Value) -> Option<(String, Value)> {
    let ns = old["metadata"]["namespace"].as_str()?.to_string();
    let owner = old["metadata"]["ownerReferences"].as_array()?.iter().find(|r| r["controller"] == true)?;
    if owner["kind"] != "ReplicaSet" {
        return None;
    }
    let rs = s.get("replicasets", &ns, owner["name"].as_str()?)?;
    let template = &rs["spec"]["template"];
    let rs_name = rs["metadata"]["name"].as_str()?;
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"].clone(),
        "spec": template["spec"].clone(),
        "status": {"phase": "Pending"},
    });
    pod["metadata"]["namespace"] = json!(ns);
    pod["metadata"]["name"] = json!(format!("{rs_name}-{}", s.rv + 1));
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name,
        "uid": rs["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]);
    Some((ns, pod))
}
