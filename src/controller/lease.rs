//! Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does: the
//! holder renews it; another replica takes it only once `renewTime + leaseDurationSeconds` has
//! passed. Every write carries the Lease's resourceVersion, so two replicas never both win.
//! [`Leadership`] keeps it on its own clock, apart from the work: a task acquires or renews every
//! retry period, and the controller acts only while the last renewal is younger than the renew
//! deadline, which is shorter than the lease duration, so a successor never overlaps.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to do with the Lease as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No Lease yet: create it.
    Create,
    /// We hold it: renew.
    Renew,
    /// It expired (or names nobody): take it over.
    TakeOver,
    /// Someone else holds it.
    HeldBy(String),
}

/// The verdict on `spec` for `me` at `now` (pure).
pub fn verdict(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Verdict {
    let Some(s) = spec else { return Verdict::Create };
    let holder = s.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Verdict::Renew;
    }
    let duration = i64::from(s.lease_duration_seconds.unwrap_or(15));
    let renewed = s.renew_time.as_ref().or(s.acquire_time.as_ref()).map(|t| t.0.as_second());
    match renewed {
        _ if holder.is_empty() => Verdict::TakeOver,
        Some(t) if now.as_second() > t + duration => Verdict::TakeOver,
        None => Verdict::TakeOver,
        _ => Verdict::HeldBy(holder),
    }
}

/// One replica's membership in the election.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    namespace: String,
    identity: String,
    duration: Duration,
    holder: Option<String>,
}

impl Elector {
    /// An elector for Lease `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration,
            holder: None,
        }
    }

    /// Who holds the Lease, as last seen.
    pub fn holder(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// Gives the Lease up, as client-go's leader election does on cancel (`ReleaseOnCancel`): the
    /// holder emptied, a duration of one second, so the next replica takes it at once instead of
    /// waiting out the duration. Returns whether this replica held it.
    pub async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(false) };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        let pp = PostParams { field_manager: Some(crate::kube::keys::FIELD_MANAGER.into()), ..Default::default() };
        self.api.replace(&self.name, &pp, &lease).await.map(|_| true)
    }

    /// Tries to acquire or renew the Lease once; returns whether this replica holds it.
    pub async fn try_lead(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let found = self.api.get_opt(&self.name).await?;
        let verdict = verdict(found.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        let secs = self.duration.as_secs().max(1) as i32;
        let pp = PostParams { field_manager: Some(crate::kube::keys::FIELD_MANAGER.into()), ..Default::default() };
        let result = match (&verdict, found) {
            (Verdict::HeldBy(h), _) => {
                self.holder = Some(h.clone());
                return Ok(false);
            }
            (Verdict::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api.create(&pp, &lease).await.map(|_| ())
            }
            (v, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if *v == Verdict::TakeOver {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(MicroTime(now));
                // `replace` sends the resourceVersion read above: a concurrent writer makes it 409.
                self.api.replace(&self.name, &pp, &lease).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                self.holder = Some(self.identity.clone());
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Leadership kept on its own clock, as client-go's `leaderelection` keeps it: a task tries to
/// acquire or renew the Lease every retry period (a tenth of the lease duration, at least
/// 200 ms), each try bounded by the retry period; this replica leads while its last successful
/// renewal is younger than the renew deadline (two thirds of the lease duration). Writers ask
/// [`Leadership::leads`] right before each write, which costs no request.
#[derive(Clone)]
pub struct Leadership {
    state: Arc<Mutex<Seen>>,
    deadline: Duration,
    task: Arc<Mutex<Option<tokio::task::AbortHandle>>>,
}

#[derive(Default)]
struct Seen {
    renewed: Option<Instant>,
    holder: Option<String>,
}

impl Leadership {
    /// Starts the renewal task for `elector`; `changed` is told when this replica starts or
    /// stops leading.
    pub fn spawn(mut elector: Elector, changed: tokio::sync::mpsc::Sender<()>) -> Self {
        let duration = elector.duration;
        let retry = (duration / 10).max(Duration::from_millis(200));
        let me = Self { state: Arc::default(), deadline: duration.mul_f64(2.0 / 3.0), task: Arc::default() };
        let shared = me.clone();
        let task = tokio::spawn(async move {
            loop {
                let was = shared.leads();
                let started = Instant::now();
                match tokio::time::timeout(retry, elector.try_lead()).await {
                    Ok(Ok(true)) => shared.renewed(started, &elector),
                    Ok(Ok(false)) => shared.lost(&elector),
                    Ok(Err(e)) => tracing::warn!(error = %e, "reading or renewing the Lease failed"),
                    Err(_) => tracing::warn!(
                        ms = retry.as_millis() as u64,
                        "renewing the Lease took longer than its retry period"
                    ),
                }
                let leads = shared.leads();
                if leads != was {
                    let lease = format!("{}/{}", elector.namespace, elector.name);
                    if leads {
                        tracing::info!(lease = %lease, identity = %elector.identity, "became the leader");
                    } else {
                        tracing::warn!(
                            lease = %lease,
                            deadline_ms = shared.deadline.as_millis() as u64,
                            "stopped leading: the Lease was not renewed within the renew deadline; no more writes"
                        );
                    }
                    let _ = changed.try_send(());
                }
                tokio::time::sleep(retry.saturating_sub(started.elapsed())).await;
            }
        });
        *me.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        me
    }

    /// Stops renewing and leading (the replica is shutting down); returns whether it led.
    pub fn stop(&self) -> bool {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
        let led = self.leads();
        self.lock().renewed = None;
        led
    }

    /// Whether this replica leads now: its last renewal is younger than the renew deadline.
    pub fn leads(&self) -> bool {
        self.lock().renewed.is_some_and(|t| t.elapsed() < self.deadline)
    }

    /// Who holds the Lease, as last seen.
    pub fn holder(&self) -> Option<String> {
        self.lock().holder.clone()
    }

    fn renewed(&self, at: Instant, elector: &Elector) {
        let mut s = self.lock();
        // The renewal counts from when it was asked: the request's time is not leadership.
        s.renewed = Some(at);
        s.holder = elector.holder().map(str::to_string);
    }

    fn lost(&self, elector: &Elector) {
        let mut s = self.lock();
        s.renewed = None;
        s.holder = elector.holder().map(str::to_string);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_only_once_it_has_expired() {
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(verdict(None, "me", now), Verdict::Create);
        assert_eq!(verdict(Some(&spec("me", 990, 15)), "me", now), Verdict::Renew);
        assert_eq!(verdict(Some(&spec("other", 990, 15)), "me", now), Verdict::HeldBy("other".into()));
        assert_eq!(verdict(Some(&spec("other", 980, 15)), "me", now), Verdict::TakeOver);
        assert_eq!(verdict(Some(&spec("", 999, 15)), "me", now), Verdict::TakeOver);
    }
}
