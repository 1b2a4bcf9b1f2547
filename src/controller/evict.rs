//! Moving a pod: only through the Eviction API (`pods/{name}/eviction`, `policy/v1`), never a
//! delete, so the API server checks the pod's PodDisruptionBudget. What the answer means for a
//! plan: evicted (or already gone) goes on; a budget at its limit (429) waits and retries while
//! the plan still holds, never forcing; several budgets over one pod (500) drop the pod from the
//! plan; anything else is an error to retry later.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use kube::Client;

/// What an eviction came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// The API server accepted it: the pod is being deleted (its grace period applies).
    Evicted,
    /// The pod no longer exists.
    Gone,
    /// A PodDisruptionBudget allows no disruption now (429): the budget's words.
    Blocked(String),
    /// The pod cannot be evicted as it is (500: e.g. more than one budget selects it).
    Refused(String),
}

/// The message a 429 or 500 carries: its causes' messages when it has any, else its message.
fn words(s: &kube::core::Status) -> String {
    let causes: Vec<&str> =
        s.details.iter().flat_map(|d| &d.causes).map(|c| c.message.as_str()).filter(|m| !m.is_empty()).collect();
    if causes.is_empty() {
        s.message.clone()
    } else {
        causes.join("; ")
    }
}

/// Asks the API server to evict `namespace/name`. `client` must not retry 429s itself
/// ([`crate::kube::client_without_retries`]): the budget's answer is the caller's to act on.
pub async fn evict(client: &Client, namespace: &str, name: &str) -> anyhow::Result<Eviction> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match api.evict(name, &EvictParams::default()).await {
        Ok(_) => Ok(Eviction::Evicted),
        Err(kube::Error::Api(s)) => match s.code {
            404 => Ok(Eviction::Gone),
            429 => Ok(Eviction::Blocked(words(&s))),
            500 => Ok(Eviction::Refused(words(&s))),
            code => Err(anyhow::anyhow!("evicting pod {namespace}/{name}: {code} {}", s.message)),
        },
        Err(e) => Err(anyhow::Error::new(e).context(format!("evicting pod {namespace}/{name}"))),
    }
}
