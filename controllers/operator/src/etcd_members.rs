//! Growing and shrinking virt-apiserver's etcd (`spec.kubevirtRs.etcd.members`) without losing
//! an object: members join and leave through etcd's membership API, one at a time.
//!
//! - **Grow:** a member is added as a *learner* (it receives the data but does not vote, so
//!   adding it never costs quorum), then its pod starts and joins with
//!   `--initial-cluster-state existing`; once it has caught up it is promoted to a voting
//!   member, and only then is the next one added.
//! - **Shrink:** the member with the highest ordinal is removed from etcd first, then its pod
//!   (and volume) goes; only while every member that stays answers, so the smaller cluster
//!   keeps quorum.
//! - **The single member from before clusters** advertises a loopback peer URL: once its pod
//!   runs with peer TLS, its peer URL is changed to its name before any member joins.
//! - **Evacuation:** a member whose pod is on a node being drained (cordoned, or its pod asked
//!   to be evicted) is moved before its pod may go, the way virt-controller moves a VM: its
//!   volume is pinned to that node, so it cannot simply start elsewhere. It is *replaced*:
//!   removed from etcd and added again at once as an empty learner under its own name, its pod
//!   and volume deleted so that the StatefulSet starts it anew on a node that can take it, where
//!   it catches up from the others and is promoted. The others must all answer while it is
//!   gone: a single member first gets a spare (a learner, then a voter) on another node, and
//!   the spare leaves once the moved member is a voter again; of three, the two that stay keep
//!   quorum. A learner that does not start (its pod killed mid-join, its volume lost) is
//!   replaced the same way after [`LEARNER_DEADLINE`].
//!
//! [`plan`] is the pure decision (one step per reconcile, table-tested); [`observe`] and
//! [`execute`] talk to etcd with a client certificate virt-operator issues itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, MemberAddOptions};

/// Why talking to etcd failed (the reconcile reports it and tries again).
#[derive(Debug, thiserror::Error)]
pub enum MembersError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("no etcd member answered: {0}")]
    NoMember(String),
    #[error("timed out after {0:?} talking to etcd")]
    Timeout(Duration),
}

/// How one request to etcd may take at most: a member that does not answer must not hold the
/// reconcile (which has 60 s in all).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// Where the members are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    /// The peer URL each ordinal advertises (`https://kubevirt-etcd-N:2380`).
    pub peer_urls: Vec<String>,
    /// The client URL virt-operator dials each ordinal at (its Service's cluster IP).
    pub client_urls: Vec<String>,
    /// The peer URL of the single member from before clusters (`http://127.0.0.1:2380`).
    pub legacy_peer_url: String,
}

impl Addresses {
    /// The ordinal a member's peer URLs name, if it is one of ours.
    pub fn ordinal(&self, m: &Member) -> Option<usize> {
        if m.peer_urls.contains(&self.legacy_peer_url) {
            return Some(0);
        }
        self.peer_urls
            .iter()
            .position(|u| m.peer_urls.iter().any(|p| p == u))
    }
}

/// A member as etcd's membership lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// Empty until the member has started.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub learner: bool,
}

/// What [`observe`] found, and what the caller adds from the Kubernetes API
/// ([`Observed::leaving`], [`Observed::stuck`], [`Observed::room`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub members: Vec<Member>,
    /// Ordinals whose member answered a status request and knows a leader.
    pub healthy: BTreeSet<usize>,
    /// Every pod of the StatefulSet runs its current template and is ready.
    pub rolled_out: bool,
    /// Ordinals whose pod is on a node being drained (cordoned) or was asked to be evicted.
    pub leaving: BTreeSet<usize>,
    /// Ordinals whose learner has not started within [`LEARNER_DEADLINE`] of its pod's start.
    pub stuck: BTreeSet<usize>,
    /// Whether some schedulable node can take a member (a replacement's pod needs one).
    pub room: bool,
    /// Ordinals whose pod still is the one of a replaced member (marked, not yet gone).
    pub replaced: BTreeSet<usize>,
}

/// How long a learner's pod may run without the learner answering before it is replaced.
pub const LEARNER_DEADLINE: Duration = Duration::from_secs(180);

/// One change of the membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The member from before clusters advertises its peer URL by name from now on.
    AdvertisePeerUrl { id: u64 },
    /// A new member joins as a learner.
    AddLearner { ordinal: usize },
    /// A learner that has caught up becomes a voting member.
    Promote { id: u64, ordinal: usize },
    /// The member leaves; its pod goes afterwards.
    Remove { id: u64, ordinal: usize },
    /// The member leaves and joins again at once as an empty learner under the same name;
    /// its pod and volume are deleted afterwards, so that it starts anew elsewhere.
    Replace { id: u64, ordinal: usize },
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The StatefulSet's replicas once the step is done: the members in etcd's membership.
    pub replicas: i32,
    pub step: Option<Step>,
    /// What the cluster is waiting for (the Progressing condition says so); `None` once it
    /// has the members asked for.
    pub pending: Option<String>,
}

fn member_label(ordinal: usize) -> String {
    format!("etcd member {}", crate::render::etcd::member_name(ordinal))
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The next step towards `desired` members, given the membership as observed.
pub fn plan(desired: usize, addresses: &Addresses, o: &Observed) -> Plan {
    let mut by_ordinal: BTreeMap<usize, &Member> = BTreeMap::new();
    let mut foreign = Vec::new();
    for m in &o.members {
        match addresses.ordinal(m) {
            Some(i) if !by_ordinal.contains_key(&i) => {
                by_ordinal.insert(i, m);
            }
            _ => foreign.push(m),
        }
    }
    let top = by_ordinal.keys().next_back().map_or(0, |i| i + 1);
    let hold = |pending: String| Plan {
        replicas: count(top.max(1)),
        step: None,
        pending: Some(pending),
    };
    if let Some(m) = foreign.first() {
        // Not ours to touch: an administrator added it, or two members claim one name.
        return hold(format!(
            "etcd has a member virt-operator did not add ({} at {}); remove it (etcdctl member \
             remove {:x}) to let the operator change the membership",
            if m.name.is_empty() {
                "unstarted"
            } else {
                &m.name
            },
            m.peer_urls.join(","),
            m.id
        ));
    }
    let n = by_ordinal.len();
    if n == 0 {
        return hold("etcd lists no member".into());
    }
    let healthy = |i: usize| o.healthy.contains(&i);
    if let Some(first) = by_ordinal.get(&0)
        && first.peer_urls.contains(&addresses.legacy_peer_url)
    {
        // Nobody can join before the first member's peer URL is one they can dial, and that
        // only after its pod listens for peers over TLS.
        return if n == 1 && o.rolled_out && healthy(0) {
            Plan {
                replicas: 1,
                step: Some(Step::AdvertisePeerUrl { id: first.id }),
                pending: Some(format!(
                    "{}: advertising its peer URL {}",
                    member_label(0),
                    addresses.peer_urls.first().map_or("", String::as_str)
                )),
            }
        } else {
            hold(format!(
                "{}: restarting with peer TLS before other members can join",
                member_label(0)
            ))
        };
    }
    if let Some((&i, m)) = by_ordinal.iter().find(|(_, m)| m.learner) {
        // The learner must start in a new pod on a new volume. The replaced member's old pod
        // may still run and take the learner's place (etcd hands a new member's slot to
        // whoever dials in with its peer URL): promoted there, it would be a voter in a pod
        // marked for deletion, whose eviction the webhook lets through and whose volume is
        // already being deleted — a quorum lost on the next drain (the e2e found it). So
        // nothing happens to it until that pod is gone.
        if o.replaced.contains(&i) {
            return hold(format!(
                "{}: waiting for the replaced member's pod to go before its new one joins",
                member_label(i)
            ));
        }
        // A learner is promoted once it has started and answers; etcd refuses the promotion
        // until it has caught up with the leader, and the next reconcile tries again. One
        // that never starts, or whose pod is on a node being drained, is replaced: removed
        // and added again under a new member id (never its pod's data wiped under the same
        // id: the leader would take it for caught up, and it would stop at the first
        // heartbeat), empty, elsewhere.
        if (o.stuck.contains(&i) || o.leaving.contains(&i)) && !healthy(i) && o.room {
            return Plan {
                replicas: count(top),
                step: Some(Step::Replace {
                    id: m.id,
                    ordinal: i,
                }),
                pending: Some(format!(
                    "{}: did not start as a learner; starting it again, empty",
                    member_label(i)
                )),
            };
        }
        return if healthy(i) && !m.name.is_empty() {
            Plan {
                replicas: count(top),
                step: Some(Step::Promote {
                    id: m.id,
                    ordinal: i,
                }),
                pending: Some(format!(
                    "{}: promoting it to a voting member",
                    member_label(i)
                )),
            }
        } else {
            hold(format!(
                "{}: starting (a learner until it has caught up)",
                member_label(i)
            ))
        };
    }
    let unhealthy: Vec<String> = by_ordinal
        .keys()
        .filter(|i| !healthy(**i))
        .map(|i| crate::render::etcd::member_name(*i))
        .collect();
    let not_answering = |what: &str| {
        format!(
            "{what} (not answering: {})",
            if unhealthy.is_empty() {
                "none; pods still rolling out".to_string()
            } else {
                unhealthy.join(", ")
            }
        )
    };
    if let Some(&k) = by_ordinal.keys().find(|i| o.leaving.contains(*i)) {
        let name = crate::render::etcd::member_name(k);
        if !o.room {
            return hold(format!(
                "{name} must move off its node before the node can be drained, but no other \
                 schedulable node can take it: uncordon a node or add one"
            ));
        }
        let others_unhealthy: Vec<&str> = unhealthy
            .iter()
            .map(String::as_str)
            .filter(|u| *u != name)
            .collect();
        if !others_unhealthy.is_empty() || !o.rolled_out {
            return hold(not_answering(&format!(
                "moving {name} off its node: waiting for the other members to be healthy"
            )));
        }
        if n == 1 {
            // Alone it would take the store with it: a spare joins first.
            let Some(spare) = (0..crate::render::etcd::MAX_MEMBERS).find(|i| *i != k) else {
                return hold(format!("{name}: no ordinal free for a spare member"));
            };
            return Plan {
                replicas: count(top.max(spare + 1)),
                step: Some(Step::AddLearner { ordinal: spare }),
                pending: Some(format!(
                    "moving {name} off its node: {} joins as a spare first",
                    member_label(spare)
                )),
            };
        }
        let Some(m) = by_ordinal.get(&k) else {
            return hold(format!("{}: not found", member_label(k)));
        };
        return Plan {
            replicas: count(top),
            step: Some(Step::Replace {
                id: m.id,
                ordinal: k,
            }),
            pending: Some(format!(
                "moving {name} off its node: it starts again, empty, on another node"
            )),
        };
    }
    // A member removed by hand (it lost its volume: docs/deploy.md) leaves a gap below the
    // highest ordinal. Its pod runs (failing to join), so it is added again at once, empty,
    // and catches up as any new member does.
    let missing = (0..top).find(|i| !by_ordinal.contains_key(i));
    if let Some(gap) = missing
        && gap < desired
    {
        return if unhealthy.is_empty() {
            Plan {
                replicas: count(top),
                step: Some(Step::AddLearner { ordinal: gap }),
                pending: Some(format!("{}: joining again as a learner", member_label(gap))),
            }
        } else {
            hold(not_answering(&format!(
                "waiting for every member to be healthy before adding {} again",
                crate::render::etcd::member_name(gap)
            )))
        };
    }
    if missing.is_none() && n < desired {
        return if unhealthy.is_empty() && o.rolled_out {
            Plan {
                replicas: count(n + 1),
                step: Some(Step::AddLearner { ordinal: n }),
                pending: Some(format!("{}: joining as a learner", member_label(n))),
            }
        } else {
            hold(not_answering(&format!(
                "growing to {desired} members: waiting for every member to be healthy before \
                 adding {}",
                crate::render::etcd::member_name(n)
            )))
        };
    }
    if top > desired {
        // The StatefulSet removes the highest ordinal's pod: so does etcd, first.
        let last = top - 1;
        let Some(m) = by_ordinal.get(&last) else {
            return hold(format!("{}: not found", member_label(last)));
        };
        // The members that stay must all answer: they are the whole quorum afterwards.
        let leaving = crate::render::etcd::member_name(last);
        let staying_unhealthy: Vec<&str> = unhealthy
            .iter()
            .map(String::as_str)
            .filter(|name| *name != leaving)
            .collect();
        return if staying_unhealthy.is_empty() {
            Plan {
                replicas: count(last),
                step: Some(Step::Remove {
                    id: m.id,
                    ordinal: last,
                }),
                pending: Some(format!("{}: leaving the cluster", member_label(last))),
            }
        } else {
            hold(format!(
                "shrinking to {desired} members: waiting for the members that stay to be \
                 healthy before removing {leaving} (not answering: {})",
                staying_unhealthy.join(", ")
            ))
        };
    }
    Plan {
        replicas: count(top),
        step: None,
        pending: None,
    }
}

/// Client TLS towards etcd (PEM).
#[derive(Clone)]
pub struct ClientTls {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

async fn bounded<T>(
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, MembersError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(MembersError::Timeout(REQUEST_TIMEOUT)),
    }
}

/// A client of the one member at `url`.
async fn connect(url: &str, tls: Option<&ClientTls>) -> Result<Client, MembersError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT);
    if let Some(t) = tls {
        opts = opts.with_tls(
            etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&t.ca))
                .identity(etcd_client::Identity::from_pem(&t.cert, &t.key)),
        );
    }
    bounded(Client::connect([url], Some(opts))).await
}

/// Clients of the healthy voting members, by ordinal, for [`execute`].
pub struct Voters(BTreeMap<usize, Client>);

impl std::fmt::Debug for Voters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Voters").field(&self.0.keys()).finish()
    }
}

impl Voters {
    /// A member's client to carry out `step` through: never the member the step removes
    /// (it stops serving as soon as it is out, before the rest of the step).
    fn for_step(&mut self, step: Step) -> Option<&mut Client> {
        let leaving = match step {
            Step::Remove { ordinal, .. } | Step::Replace { ordinal, .. } => Some(ordinal),
            _ => None,
        };
        self.0
            .iter_mut()
            .find(|(i, _)| Some(**i) != leaving)
            .map(|(_, c)| c)
    }
}

/// Asks every member for its status (healthy: it answers and knows a leader) and the
/// membership from a healthy voting member; the healthy voters' clients are returned for
/// [`execute`]. Each member is asked at its own address: a balanced client would not say
/// which one failed.
pub async fn observe(
    addresses: &Addresses,
    tls: Option<&ClientTls>,
    rolled_out: bool,
) -> Result<(Observed, Voters), MembersError> {
    let probes = addresses
        .client_urls
        .iter()
        .enumerate()
        .map(|(i, url)| async move {
            let r = async {
                let mut c = connect(url, tls).await?;
                let st = bounded(c.status()).await?;
                Ok::<_, MembersError>((c, st.leader() != 0, st.is_learner()))
            }
            .await;
            (i, url, r)
        });
    let mut healthy = BTreeSet::new();
    let mut voters = BTreeMap::new();
    let mut errors = Vec::new();
    for (i, url, r) in futures::future::join_all(probes).await {
        match r {
            Ok((c, has_leader, learner)) if has_leader => {
                healthy.insert(i);
                if !learner {
                    voters.insert(i, c);
                }
            }
            Ok(_) => errors.push(format!("{url}: no leader")),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    let Some(client) = voters.values_mut().next() else {
        return Err(MembersError::NoMember(errors.join("; ")));
    };
    let list = bounded(client.member_list()).await?;
    let members = list
        .members()
        .iter()
        .map(|m| Member {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
            learner: m.is_learner(),
        })
        .collect();
    Ok((
        Observed {
            members,
            healthy,
            rolled_out,
            ..Observed::default()
        },
        Voters(voters),
    ))
}

/// How [`execute`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// etcd refused for now, for a reason that passes by itself: the next reconcile tries
    /// again.
    NotYet(&'static str),
}

/// Why etcd refuses a membership change that will succeed later, if it does: a learner that
/// has not caught up cannot be promoted, and with strict reconfiguration checks (etcd's
/// default) no member is added or removed until the leader has been connected to every voting
/// member for five seconds, e.g. right after a promotion.
fn passing_refusal(e: &etcd_client::Error) -> Option<&'static str> {
    let text = e.to_string();
    if text.contains("in sync with leader") {
        Some("the learner has not caught up with the leader yet")
    } else if text.contains("unhealthy cluster") || text.contains("not enough started members") {
        Some(
            "etcd accepts membership changes only once every member has been connected for a while",
        )
    } else {
        None
    }
}

/// Before member `id` (ordinal `ordinal`) leaves: if it leads, it hands leadership to
/// another voter, so that the rest need not wait out an election (a second or more without
/// a leader, every write waiting).
async fn hand_over_leadership(
    voters: &mut Voters,
    ordinal: usize,
    id: u64,
) -> Result<(), MembersError> {
    let Some(c) = voters.0.get_mut(&ordinal) else {
        return Ok(());
    };
    if bounded(c.status()).await?.leader() != id {
        return Ok(());
    }
    let list = bounded(c.member_list()).await?;
    let Some(target) = list
        .members()
        .iter()
        .find(|m| m.id() != id && !m.is_learner())
        .map(|m| m.id())
    else {
        return Ok(());
    };
    bounded(c.move_leader(target)).await.map(drop)
}

/// Adds a learner at `url`, retrying for a few seconds: right after a member left, the rest
/// may still be settling on a leader.
async fn add_learner(client: &mut Client, url: String) -> Result<(), MembersError> {
    let mut last = None;
    for _ in 0..5 {
        match bounded(client.member_add(
            [url.clone()],
            Some(MemberAddOptions::new().with_is_learner()),
        ))
        .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last.unwrap_or(MembersError::Timeout(REQUEST_TIMEOUT)))
}

/// Carries out `step` through one of `voters`.
pub async fn execute(
    voters: &mut Voters,
    addresses: &Addresses,
    step: Step,
) -> Result<Outcome, MembersError> {
    let url = |i: usize| addresses.peer_urls.get(i).cloned().unwrap_or_default();
    if let Step::Remove { id, ordinal } | Step::Replace { id, ordinal } = step
        && let Err(e) = hand_over_leadership(voters, ordinal, id).await
    {
        // The change still goes ahead: an election costs a moment, not the store.
        tracing::debug!(ordinal, error = %e, "handing etcd's leadership over");
    }
    let Some(client) = voters.for_step(step) else {
        return Ok(Outcome::NotYet(
            "no other voting member answers to carry the change through",
        ));
    };
    let r = match step {
        Step::AdvertisePeerUrl { id } => bounded(client.member_update(id, vec![url(0)]))
            .await
            .map(drop),
        Step::AddLearner { ordinal } => bounded(client.member_add(
            [url(ordinal)],
            Some(MemberAddOptions::new().with_is_learner()),
        ))
        .await
        .map(drop),
        Step::Promote { id, .. } => bounded(client.member_promote(id)).await.map(drop),
        Step::Remove { id, .. } => bounded(client.member_remove(id)).await.map(drop),
        Step::Replace { id, ordinal } => {
            // Removed first: etcd refuses a second member with the same peer URL. Added back
            // before its new pod starts, which then joins instead of failing to.
            match bounded(client.member_remove(id)).await {
                Ok(_) => add_learner(client, url(ordinal)).await,
                Err(e) => Err(e),
            }
        }
    };
    match r {
        Ok(()) => Ok(Outcome::Done),
        Err(MembersError::Etcd(e)) => match passing_refusal(&e) {
            Some(why) => Ok(Outcome::NotYet(why)),
            None => Err(MembersError::Etcd(e)),
        },
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn addresses() -> Addresses {
        Addresses {
            peer_urls: (0..3)
                .map(|i| format!("https://kubevirt-etcd-{i}:2380"))
                .collect(),
            client_urls: (0..3).map(|i| format!("https://10.0.0.{i}:2379")).collect(),
            legacy_peer_url: "http://127.0.0.1:2380".into(),
        }
    }

    fn member(i: usize, learner: bool) -> Member {
        Member {
            id: 100 + i as u64,
            name: format!("kubevirt-etcd-{i}"),
            peer_urls: vec![format!("https://kubevirt-etcd-{i}:2380")],
            learner,
        }
    }

    fn observed(members: Vec<Member>, healthy: &[usize]) -> Observed {
        Observed {
            members,
            healthy: healthy.iter().copied().collect(),
            rolled_out: true,
            room: true,
            ..Observed::default()
        }
    }

    fn leaving(mut o: Observed, ordinals: &[usize]) -> Observed {
        o.leaving = ordinals.iter().copied().collect();
        o
    }

    /// A learner is never promoted in the pod of the member it replaced (marked for deletion,
    /// its volume going): it waits for that pod to go, and is not replaced again meanwhile.
    #[test]
    fn a_learner_waits_for_the_replaced_pod_to_go() {
        let a = addresses();
        let mut o = observed(vec![member(0, true), member(1, false)], &[0, 1]);
        o.replaced = [0].into_iter().collect();
        o.stuck = [0].into_iter().collect();
        let p = plan(1, &a, &o);
        assert_eq!(p.step, None);
        assert!(p.pending.unwrap().contains("replaced member's pod"));
        o.replaced.clear();
        assert_eq!(
            plan(1, &a, &o).step,
            Some(Step::Promote {
                id: 100,
                ordinal: 0
            })
        );
    }

    /// Issue 51: a single member on a node being drained moves with the store answering
    /// throughout: a spare joins (learner, then voter), the member is replaced by an empty
    /// learner whose pod starts elsewhere, is promoted, and the spare leaves.
    #[test]
    fn a_single_member_moves_off_a_drained_node_through_a_spare() {
        let a = addresses();
        let p = plan(
            1,
            &a,
            &leaving(observed(vec![member(0, false)], &[0]), &[0]),
        );
        assert_eq!(p.step, Some(Step::AddLearner { ordinal: 1 }));
        assert_eq!(p.replicas, 2);
        assert!(p.pending.unwrap().contains("spare"));
        // The spare catches up and is promoted as any learner.
        let o = leaving(
            observed(vec![member(0, false), member(1, true)], &[0, 1]),
            &[0],
        );
        assert_eq!(
            plan(1, &a, &o).step,
            Some(Step::Promote {
                id: 101,
                ordinal: 1
            })
        );
        // Two voters: the leaving one is replaced, not the spare removed (which shrinking
        // to one member would otherwise do first).
        let o = leaving(
            observed(vec![member(0, false), member(1, false)], &[0, 1]),
            &[0],
        );
        let p = plan(1, &a, &o);
        assert_eq!(
            p.step,
            Some(Step::Replace {
                id: 100,
                ordinal: 0
            })
        );
        assert_eq!(p.replicas, 2);
        // Its new pod, on another node, starts as a learner and is promoted.
        let o = observed(vec![member(0, true), member(1, false)], &[0, 1]);
        assert_eq!(
            plan(1, &a, &o).step,
            Some(Step::Promote {
                id: 100,
                ordinal: 0
            })
        );
        // Then the spare leaves: one member, on a node that stays.
        let p = plan(
            1,
            &a,
            &observed(vec![member(0, false), member(1, false)], &[0, 1]),
        );
        assert_eq!(
            p.step,
            Some(Step::Remove {
                id: 101,
                ordinal: 1
            })
        );
        assert_eq!(p.replicas, 1);
    }

    /// Of three members, the one leaving is replaced in place while the two others keep
    /// quorum; never while one of them is down (that would leave one of three answering).
    #[test]
    fn one_of_three_is_replaced_in_place_while_the_others_answer() {
        let a = addresses();
        let all = vec![member(0, false), member(1, false), member(2, false)];
        let p = plan(3, &a, &leaving(observed(all.clone(), &[0, 1, 2]), &[1]));
        assert_eq!(
            p.step,
            Some(Step::Replace {
                id: 101,
                ordinal: 1
            })
        );
        assert_eq!(p.replicas, 3);
        let p = plan(3, &a, &leaving(observed(all, &[0, 1]), &[1]));
        assert_eq!(p.step, None);
        assert!(
            p.pending
                .unwrap()
                .contains("not answering: kubevirt-etcd-2")
        );
    }

    /// Nowhere to go: the member stays (its pod's eviction keeps being refused) and the
    /// condition says what would let it move.
    #[test]
    fn a_member_with_nowhere_to_go_stays_and_says_why() {
        let a = addresses();
        let mut o = leaving(observed(vec![member(0, false)], &[0]), &[0]);
        o.room = false;
        let p = plan(1, &a, &o);
        assert_eq!((p.step, p.replicas), (None, 1));
        assert!(p.pending.unwrap().contains("no other schedulable node"));
    }

    /// A learner whose pod never gets it started (killed mid-join, its volume broken) is
    /// replaced by an empty one after the deadline, not waited on for ever.
    /// A learner whose pod is on a node being drained (a spare placed just before its node
    /// was cordoned) is replaced under a new member id, never its pod's data wiped in place.
    #[test]
    fn a_leaving_learner_is_replaced() {
        let a = addresses();
        let o = leaving(
            observed(vec![member(0, false), member(1, true)], &[0]),
            &[1],
        );
        assert_eq!(
            plan(1, &a, &o).step,
            Some(Step::Replace {
                id: 101,
                ordinal: 1
            })
        );
    }

    #[test]
    fn a_learner_that_never_starts_is_replaced() {
        let a = addresses();
        let mut o = observed(vec![member(0, false), member(1, true)], &[0]);
        assert_eq!(plan(3, &a, &o).step, None);
        o.stuck.insert(1);
        assert_eq!(
            plan(3, &a, &o).step,
            Some(Step::Replace {
                id: 101,
                ordinal: 1
            })
        );
    }

    #[test]
    fn growing_adds_one_learner_at_a_time_and_promotes_it() {
        let a = addresses();
        // One member: add the second as a learner; its pod comes with the replicas.
        let p = plan(3, &a, &observed(vec![member(0, false)], &[0]));
        assert_eq!(p.step, Some(Step::AddLearner { ordinal: 1 }));
        assert_eq!(p.replicas, 2);
        // Added, not started (no name yet): wait, keep its pod.
        let mut unstarted = member(1, true);
        unstarted.name.clear();
        let p = plan(3, &a, &observed(vec![member(0, false), unstarted], &[0]));
        assert_eq!((p.step, p.replicas), (None, 2));
        assert!(p.pending.unwrap().contains("kubevirt-etcd-1: starting"));
        // Started and answering: promote (etcd refuses until it has caught up).
        let p = plan(
            3,
            &a,
            &observed(vec![member(0, false), member(1, true)], &[0, 1]),
        );
        assert_eq!(
            p.step,
            Some(Step::Promote {
                id: 101,
                ordinal: 1
            })
        );
        // Two voters: the third.
        let p = plan(
            3,
            &a,
            &observed(vec![member(0, false), member(1, false)], &[0, 1]),
        );
        assert_eq!(p.step, Some(Step::AddLearner { ordinal: 2 }));
        assert_eq!(p.replicas, 3);
        // Three voters, all healthy: done.
        let all = vec![member(0, false), member(1, false), member(2, false)];
        let p = plan(3, &a, &observed(all, &[0, 1, 2]));
        assert_eq!(
            p,
            Plan {
                replicas: 3,
                step: None,
                pending: None
            }
        );
    }

    #[test]
    fn nothing_is_added_while_a_member_is_down_or_pods_roll() {
        let a = addresses();
        let two = vec![member(0, false), member(1, false)];
        let p = plan(3, &a, &observed(two.clone(), &[0]));
        assert_eq!((p.step, p.replicas), (None, 2));
        assert!(
            p.pending
                .unwrap()
                .contains("not answering: kubevirt-etcd-1")
        );
        let mut rolling = observed(two, &[0, 1]);
        rolling.rolled_out = false;
        let p = plan(3, &a, &rolling);
        assert_eq!(p.step, None);
    }

    #[test]
    fn shrinking_removes_the_highest_ordinal_while_the_rest_keep_quorum() {
        let a = addresses();
        let all = vec![member(0, false), member(1, false), member(2, false)];
        let p = plan(1, &a, &observed(all.clone(), &[0, 1, 2]));
        assert_eq!(
            p.step,
            Some(Step::Remove {
                id: 102,
                ordinal: 2
            })
        );
        assert_eq!(p.replicas, 2);
        // The member leaving may be the one that is down.
        let p = plan(1, &a, &observed(all.clone(), &[0, 1]));
        assert_eq!(
            p.step,
            Some(Step::Remove {
                id: 102,
                ordinal: 2
            })
        );
        // Not while one that stays is down: two members would be left with one answering.
        let p = plan(1, &a, &observed(all, &[0, 2]));
        assert_eq!((p.step, p.replicas), (None, 3));
        assert!(
            p.pending
                .unwrap()
                .contains("not answering: kubevirt-etcd-1")
        );
        let p = plan(
            1,
            &a,
            &observed(vec![member(0, false), member(1, false)], &[0, 1]),
        );
        assert_eq!(
            p.step,
            Some(Step::Remove {
                id: 101,
                ordinal: 1
            })
        );
        assert_eq!(p.replicas, 1);
    }

    #[test]
    fn the_member_from_before_clusters_advertises_its_name_first() {
        let a = addresses();
        let legacy = Member {
            id: 7,
            name: "kubevirt-etcd".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            learner: false,
        };
        let mut o = observed(vec![legacy.clone()], &[0]);
        o.rolled_out = false;
        let p = plan(3, &a, &o);
        assert_eq!((p.step, p.replicas), (None, 1));
        assert!(p.pending.unwrap().contains("restarting with peer TLS"));
        let p = plan(3, &a, &observed(vec![legacy], &[0]));
        assert_eq!(p.step, Some(Step::AdvertisePeerUrl { id: 7 }));
        assert_eq!(p.replicas, 1);
    }

    #[test]
    fn a_member_the_operator_did_not_add_stops_every_change() {
        let a = addresses();
        let stranger = Member {
            id: 0xabc,
            name: "manual".into(),
            peer_urls: vec!["https://10.9.9.9:2380".into()],
            learner: false,
        };
        let p = plan(3, &a, &observed(vec![member(0, false), stranger], &[0]));
        assert_eq!((p.step, p.replicas), (None, 1));
        assert!(p.pending.unwrap().contains("etcdctl member remove abc"));
    }

    /// A member that lost its volume, removed from etcd by hand, is added again in its place
    /// (its pod runs, failing to join); shrinking past it just removes the ones above.
    #[test]
    fn a_member_removed_by_hand_is_added_again() {
        let a = addresses();
        let gap = vec![member(0, false), member(2, false)];
        let p = plan(3, &a, &observed(gap.clone(), &[0, 2]));
        assert_eq!(p.step, Some(Step::AddLearner { ordinal: 1 }));
        assert_eq!(p.replicas, 3);
        // Its pod is crash-looping: no roll-out needed for this one.
        let mut rolling = observed(gap.clone(), &[0, 2]);
        rolling.rolled_out = false;
        assert_eq!(
            plan(3, &a, &rolling).step,
            Some(Step::AddLearner { ordinal: 1 })
        );
        let p = plan(1, &a, &observed(gap, &[0, 2]));
        assert_eq!(
            p.step,
            Some(Step::Remove {
                id: 102,
                ordinal: 2
            })
        );
        assert_eq!(p.replicas, 2);
    }
}
