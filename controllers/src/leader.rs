//! Leader election with a coordination.k8s.io/v1 Lease, as client-go does it: the
//! holder renews `renewTime` every retry period; a candidate takes the lease over once
//! it has seen the same record unchanged for a whole lease duration (measured on the
//! candidate's own clock, so clock skew between replicas does not matter); a leader
//! that cannot renew within the renew deadline stops acting.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// Leader-election settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long gives up.
    pub renew_deadline: Duration,
    /// Interval between acquire or renew attempts.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults, which KubeVirt's components use: a killed leader is replaced
    /// within about 17 s. Shorter (10 s / 7 s, until 2026-12-07) made a leader on a loaded
    /// node miss its renewal and restart: `cargo xtask fuzz --cluster` saw virt-operator
    /// lose its lease under the fuzzer's load, and every lost lease restarts a replica and
    /// re-lists its caches.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Why leading ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The lease could not be renewed in time; another replica may be acting now.
    #[error("lost the leader lease {0}")]
    Lost(String),
}

/// What a candidate last saw of the lease, and when (on its own clock).
#[derive(Debug)]
struct Observed {
    record: Option<(Option<String>, Option<MicroTime>)>,
    at: Instant,
}

/// One election participant.
#[derive(Debug)]
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: Observed,
}

impl Elector {
    /// A participant in the election for `cfg.namespace/cfg.name`.
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: Observed {
                record: None,
                at: Instant::now(),
            },
        }
    }

    fn spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            // Whole seconds on the wire; rounding down could publish 0 (always expired).
            lease_duration_seconds: Some(
                i32::try_from(self.cfg.lease_duration.as_secs_f64().ceil() as u64)
                    .unwrap_or(i32::MAX)
                    .max(1),
            ),
            acquire_time: Some(acquire.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to acquire or renew. `Ok(true)`: we hold the lease now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = Some((holder.clone(), spec.renew_time.clone()));
        if record != self.observed.record {
            self.observed = Observed {
                record,
                at: Instant::now(),
            };
        }
        let ours = holder.as_deref() == Some(self.cfg.identity.as_str());
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.cfg.lease_duration, Duration::from_secs);
        let expired = self.observed.at.elapsed() > duration;
        if holder.is_some() && !ours && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        let acquire = if ours {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut updated = lease.clone();
        updated.spec = Some(self.spec(acquire, transitions));
        // replace carries metadata.resourceVersion: of two candidates only one wins.
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up so that another replica takes over without waiting it out.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let patch =
            serde_json::json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": 1}});
        self.api
            .patch(
                &self.cfg.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    }

    /// Waits for leadership, runs `work` while leading, and stops it when the lease is
    /// lost or `shutdown` is cancelled. Losing the lease is an error: the process should
    /// exit so that it starts over as a candidate with fresh caches.
    pub async fn run<F, Fut>(
        mut self,
        shutdown: CancellationToken,
        work: F,
    ) -> Result<(), LeaderError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {
                    tracing::debug!(lease = %self.cfg.name, "lease held by another replica")
                }
                Err(e) => tracing::warn!(error = %e, "acquiring the lease failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.cfg.retry_period) => {}
            }
        }
        tracing::info!(lease = %self.cfg.name, identity = %self.cfg.identity, "became leader");
        let leading = shutdown.child_token();
        let task = tokio::spawn(work(leading.clone()));
        let mut last_renew = Instant::now();
        let result = loop {
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                () = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renew = Instant::now(),
                Ok(false) => break Err(LeaderError::Lost(self.cfg.name.clone())),
                Err(e) => tracing::warn!(error = %e, "renewing the lease failed"),
            }
            if last_renew.elapsed() > self.cfg.renew_deadline {
                break Err(LeaderError::Lost(self.cfg.name.clone()));
            }
        };
        leading.cancel();
        if let Err(e) = task.await {
            tracing::error!(error = %e, "controller task failed");
        }
        if result.is_ok()
            && let Err(e) = self.release().await
        {
            tracing::warn!(error = %e, "releasing the lease failed");
        }
        result
    }
}
