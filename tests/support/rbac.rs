//! Kubernetes RBAC as the API server evaluates it, for the manifests' ServiceAccounts: the
//! rules of the (Cluster)Roles bound to an account, and whether a request (method and path, as
//! the test API servers record them) is allowed by them — verbs from the method (`get`, `list`,
//! `watch` with `?watch=true`, `create`, `update`, `patch`, `delete`), `resourceNames` matched
//! on the object's name (or a `metadata.name` field selector on list and watch).

use serde_json::Value;

/// A rule that applies in `namespace` (`None`: every namespace, from a ClusterRole).
#[derive(Debug, Clone)]
struct Rule {
    namespace: Option<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    verbs: Vec<String>,
}

/// A request as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// The verb.
    pub verb: String,
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// The namespace (`None` for cluster objects and all-namespace lists).
    pub namespace: Option<String>,
    /// The object's name, when the request names one.
    pub name: Option<String>,
    /// The path of a request for no resource (`/version`, `/apis`: discovery).
    pub non_resource: Option<String>,
}

/// The rules bound to ServiceAccount `namespace/account` in the manifest documents.
pub struct Permissions {
    rules: Vec<Rule>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

impl Permissions {
    /// Reads the bindings and roles of `account` from manifest files.
    pub fn of(files: &[&str], namespace: &str, account: &str) -> Self {
        let mut docs: Vec<Value> = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
            docs.extend(serde_saphyr::from_multiple::<Value>(&text).unwrap_or_else(|e| panic!("{f}: {e}")));
        }
        let mut rules = Vec::new();
        for b in docs.iter().filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding") {
            let bound = b["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == namespace);
            if !bound {
                continue;
            }
            let scope =
                (b["kind"] == "RoleBinding").then(|| b["metadata"]["namespace"].as_str().unwrap_or("").to_string());
            let role_kind = b["roleRef"]["kind"].as_str().unwrap_or("");
            let role = docs
                .iter()
                .find(|d| {
                    d["kind"] == role_kind
                        && d["metadata"]["name"] == b["roleRef"]["name"]
                        && (role_kind == "ClusterRole" || d["metadata"]["namespace"] == b["metadata"]["namespace"])
                })
                .unwrap_or_else(|| panic!("binding {} names a role the manifests lack", b["metadata"]["name"]));
            for r in role["rules"].as_array().into_iter().flatten() {
                rules.push(Rule {
                    namespace: scope.clone(),
                    groups: strings(&r["apiGroups"]),
                    resources: strings(&r["resources"]),
                    names: strings(&r["resourceNames"]),
                    verbs: strings(&r["verbs"]),
                });
            }
        }
        Self { rules }
    }

    /// Whether the request is allowed.
    pub fn allows(&self, a: &Attributes) -> bool {
        // The default ClusterRoles system:discovery and system:public-info-viewer, bound to every
        // authenticated user, allow GET of the version and discovery paths.
        if let Some(path) = &a.non_resource {
            let discovery =
                ["/version", "/api", "/apis"].iter().any(|p| path == p || path.starts_with(&format!("{p}/")));
            return a.verb == "get" && discovery;
        }
        self.rules.iter().any(|r| {
            let any = |v: &[String], x: &str| v.iter().any(|s| s == "*" || s == x);
            r.namespace.as_ref().is_none_or(|ns| a.namespace.as_deref() == Some(ns.as_str()))
                && any(&r.groups, &a.group)
                && any(&r.resources, &a.resource)
                && any(&r.verbs, &a.verb)
                && (r.names.is_empty() || a.name.as_ref().is_some_and(|n| r.names.contains(n)))
        })
    }
}

/// What RBAC sees of a request (`path` with its query).
pub fn attributes(method: &str, path: &str) -> Attributes {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => (String::new(), rest.to_vec()),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (group.to_string(), rest.to_vec()),
        // A request for no resource: verbs are the lowercased method (RequestInfoFactory).
        _ => {
            let verb = method.to_lowercase();
            let non_resource = Some(path.to_string());
            return Attributes {
                verb,
                group: String::new(),
                resource: String::new(),
                namespace: None,
                name: None,
                non_resource,
            };
        }
    };
    let (namespace, rest) = match rest.as_slice() {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest.to_vec()),
        _ => (None, rest),
    };
    // As the API server's RequestInfoFactory: `<resource>/<name>/<subresource>`, which RBAC
    // rules name `<resource>/<subresource>` (`pods/eviction`).
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest.first().unwrap_or(&"").to_string(),
    };
    let mut name = rest.get(1).map(|s| s.to_string());
    let param = |k: &str| {
        query.split('&').find_map(|kv| kv.split_once('=').filter(|(key, _)| *key == k).map(|(_, v)| v.to_string()))
    };
    let verb = match method {
        "GET" if name.is_some() => "get",
        "GET" if param("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => panic!("method {other}"),
    };
    if name.is_none() {
        let selector = param("fieldSelector").map(|s| s.replace("%3D", "=").replace("%3d", "="));
        name = selector.and_then(|s| s.strip_prefix("metadata.name=").map(str::to_string));
    }
    Attributes { verb: verb.into(), group, resource, namespace, name, non_resource: None }
}

/// The controller's permissions as deploy/controller.yaml grants them.
pub fn controller_role() -> Permissions {
    Permissions::of(
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/controller.yaml")],
        "gpupart-system",
        "gpupart-controller",
    )
}

/// Panics naming every request that `permissions` refuses.
pub fn assert_allowed(permissions: &Permissions, requests: &[(String, String)], who: &str) {
    assert!(!requests.is_empty(), "{who} made no requests");
    let refused: Vec<String> = requests
        .iter()
        .map(|(m, p)| (m, p, attributes(m, p)))
        .filter(|(_, _, a)| !permissions.allows(a))
        .map(|(m, p, a)| format!("{m} {p} ({a:?})"))
        .collect();
    assert!(refused.is_empty(), "the manifests' RBAC refuses requests {who} made:\n{}", refused.join("\n"));
}
