//! The least-privilege admission policy of the DRA plugin (deploy/dra/admission-policy.yaml),
//! evaluated as the API server evaluates a ValidatingAdmissionPolicy: its CEL compiled and run by
//! a CEL library (`cel`) against sample admission requests: the match conditions first (a request
//! they do not match is not the policy's business), then the variables in order (each sees the
//! earlier ones as `variables.<name>`), then every validation, whose message (or message
//! expression) is the refusal.

use cel::{Context, Program, Value};
use serde_json::{json, Value as Json};
use std::collections::HashMap;

const PLUGIN: &str = "system:serviceaccount:gpupart-system:gpupart-dra";
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

fn documents() -> Vec<Json> {
    let path = format!("{}/deploy/dra/admission-policy.yaml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

fn compile(expr: &Json) -> Program {
    let src = expr.as_str().expect("an expression");
    Program::compile(src).unwrap_or_else(|e| panic!("{src}: {e}"))
}

/// A compiled policy.
struct Policy {
    conditions: Vec<Program>,
    variables: Vec<(String, Program)>,
    validations: Vec<(Program, Result<String, Program>)>,
}

impl Policy {
    fn load() -> Self {
        let docs = documents();
        let vap = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").expect("a policy");
        let binding = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding").expect("a binding");
        assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        let spec = &vap["spec"];
        assert_eq!(spec["failurePolicy"], "Fail");
        let rules = &spec["matchConstraints"]["resourceRules"][0];
        assert_eq!(rules["resources"], json!(["resourceslices"]));
        assert_eq!(rules["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
        let list = |k: &str| spec[k].as_array().cloned().unwrap_or_default();
        Policy {
            conditions: list("matchConditions").iter().map(|c| compile(&c["expression"])).collect(),
            variables: list("variables")
                .iter()
                .map(|v| (v["name"].as_str().unwrap().to_string(), compile(&v["expression"])))
                .collect(),
            validations: list("validations")
                .iter()
                .map(|v| {
                    let message = match v.get("messageExpression") {
                        Some(e) => Err(compile(e)),
                        None => Ok(v["message"].as_str().unwrap_or("denied").to_string()),
                    };
                    (compile(&v["expression"]), message)
                })
                .collect(),
        }
    }

    /// `Ok(())` when the request is admitted; the refusal's message otherwise.
    fn admit(&self, request: &Json, object: &Json, old: &Json) -> Result<(), String> {
        let mut ctx = Context::default();
        ctx.add_variable("request", cel::to_value(request).unwrap()).unwrap();
        ctx.add_variable("object", cel::to_value(object).unwrap()).unwrap();
        ctx.add_variable("oldObject", cel::to_value(old).unwrap()).unwrap();
        for c in &self.conditions {
            match c.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Ok(()),
                other => panic!("a match condition gave {other:?}"),
            }
        }
        let mut vars: HashMap<String, Value> = HashMap::new();
        for (name, p) in &self.variables {
            ctx.add_variable_from_value("variables", vars.clone());
            let v = p.execute(&ctx).unwrap_or_else(|e| panic!("variable {name}: {e:?}"));
            vars.insert(name.clone(), v);
        }
        ctx.add_variable_from_value("variables", vars);
        for (check, message) in &self.validations {
            match check.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    return Err(match message {
                        Ok(m) => m.clone(),
                        Err(p) => match p.execute(&ctx) {
                            Ok(Value::String(s)) => s.to_string(),
                            other => panic!("a message expression gave {other:?}"),
                        },
                    })
                }
                other => panic!("a validation gave {other:?}"),
            }
        }
        Ok(())
    }
}

fn request(user: &str, node: Option<&str>, operation: &str) -> Json {
    let mut extra = json!({"authentication.kubernetes.io/pod-name": ["gpupart-dra-x7k2p"]});
    if let Some(n) = node {
        extra[NODE_NAME_EXTRA] = json!([n]);
    }
    json!({"operation": operation, "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra}})
}

fn slice(node: Option<&str>, driver: &str) -> Json {
    let mut s = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "gpu-node-1-gpu.gpupart.io-devices-000"},
        "spec": {"driver": driver, "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 2}}});
    match node {
        Some(n) => s["spec"]["nodeName"] = json!(n),
        None => s["spec"]["allNodes"] = json!(true),
    }
    s
}

#[test]
fn the_plugin_writes_only_its_own_nodes_slices_of_its_driver() {
    let p = Policy::load();
    let own = slice(Some("gpu-node-1"), "gpu.gpupart.io");
    let other = slice(Some("gpu-node-2"), "gpu.gpupart.io");
    let on_node = |op| request(PLUGIN, Some("gpu-node-1"), op);
    // Its own node: create, update and delete are allowed.
    assert_eq!(p.admit(&on_node("CREATE"), &own, &Json::Null), Ok(()));
    assert_eq!(p.admit(&on_node("UPDATE"), &own, &own), Ok(()));
    assert_eq!(p.admit(&on_node("DELETE"), &Json::Null, &own), Ok(()));
    // Another node's slices: refused, naming both nodes.
    let e = p.admit(&on_node("CREATE"), &other, &Json::Null).unwrap_err();
    assert!(e.contains("on node 'gpu-node-1'") && e.contains("of node 'gpu-node-2'"), "{e}");
    assert!(p.admit(&on_node("DELETE"), &Json::Null, &other).unwrap_err().contains("gpu-node-2"));
    // Moving one of its slices to another node is an update of another node's slice.
    assert!(p.admit(&on_node("UPDATE"), &other, &own).is_err());
    // A slice for the whole cluster, or of another driver on its own node: refused.
    let cluster = p.admit(&on_node("CREATE"), &slice(None, "gpu.gpupart.io"), &Json::Null).unwrap_err();
    assert!(cluster.contains("not bound to one node"), "{cluster}");
    let driver = p.admit(&on_node("CREATE"), &slice(Some("gpu-node-1"), "gpu.nvidia.com"), &Json::Null).unwrap_err();
    assert!(driver.contains("of driver gpu.gpupart.io, not gpu.nvidia.com"), "{driver}");
    // A token bound to no node (not from a pod on a node): refused.
    let no_node = p.admit(&request(PLUGIN, None, "CREATE"), &own, &Json::Null).unwrap_err();
    assert!(no_node.contains("names no node"), "{no_node}");
    // Anyone else is not the policy's business (RBAC decides for them).
    for user in ["system:admin", "system:serviceaccount:nvidia-dra:nvidia-dra-driver", "system:kube-scheduler"] {
        assert_eq!(p.admit(&request(user, None, "CREATE"), &other, &Json::Null), Ok(()), "{user}");
    }
}
