//! The standby loop: feeds [`decide`] with the two signals and flips the [`Authority`] (see the
//! module doc of [`super`] for the rule and its race analysis, and [`super::lease`] for how the
//! Lease is followed at almost no cost to the control plane).
//!
//! Invariants: one decision per look; a look probes the endpoint (local) and reads the Lease
//! only when the decision needs it and the watch cannot tell (forbidden, or its news older
//! than [`lease::fresh_for`] the threshold); a takeover only after its proof (one consistent
//! Lease read, the Node), at most once per backoff step when it fails; one line and one Node
//! event per change of role; a Lease change seen by the watch is decided on at once.

use super::healthz::probe_endpoint;
use super::lease::{self, LeaseApi, Look, Renewals, Watched};
use super::*;
use crate::authority::Authority;
use crate::events::{EventSink, NodeEventReason};
use k8s_openapi::api::coordination::v1::Lease;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Whether a Lease counts as held at start: renewed within `threshold` of this wall clock.
pub(super) fn lease_at_start(lease: Option<&Lease>, threshold: Duration) -> LeaseAtStart {
    let Some(lease) = lease else {
        return LeaseAtStart::Missing;
    };
    let Some(t) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) else {
        return LeaseAtStart::Stale;
    };
    let age = jiff::Timestamp::now().duration_since(t.0);
    match Duration::try_from(age) {
        // a renewTime ahead of this clock is a live kubelet with a skewed clock
        Err(_) => LeaseAtStart::Fresh,
        Ok(a) if a <= threshold => LeaseAtStart::Fresh,
        Ok(_) => LeaseAtStart::Stale,
    }
}

/// How long the start decision waits for the Lease (the agent's start waits for it).
pub const START_TIMEOUT: Duration = Duration::from_secs(5);

/// The start's decision, and what the loop carries over from before a restart.
#[derive(Debug, Clone)]
pub struct Started {
    pub decision: Decision,
    /// Resuming after a restart of an active reaplet: the Lease's `renewTime` it saw and its
    /// age at the start ([`marker::carried_age`]).
    pub resume: Option<(String, Duration)>,
}

/// Decides the mode at start and returns the first decision; sets `authority`. See
/// [`begin`].
pub async fn start(
    cfg: &StandbyConfig,
    client: Option<&kube::Client>,
    authority: &Authority,
) -> Decision {
    begin(cfg, client, authority).await.decision
}

/// Decides the mode at start: one Lease GET at the newest version (a missing Lease may make
/// reaplet active at once, so this one read is not served from a cache that may lag); when it
/// is missing, one read of the Node object (consistent too) and a probe of the kubelet's
/// endpoint; the marker of a restart ([`marker`]). Sets `authority`.
pub async fn begin(
    cfg: &StandbyConfig,
    client: Option<&kube::Client>,
    authority: &Authority,
) -> Started {
    let read = match client {
        Some(c) if cfg.setting != AuthoritySetting::Primary => {
            let leases = LeaseApi::new(c.clone(), &cfg.node_name);
            match tokio::time::timeout(START_TIMEOUT, leases.read_latest()).await {
                Ok(Ok(l)) => Some((lease_at_start(l.as_ref(), cfg.takeover_after), l)),
                Ok(Err(e)) => {
                    tracing::warn!(err = %e, "node Lease unreadable at start; standby");
                    None
                }
                Err(_) => {
                    tracing::warn!(timeout = ?START_TIMEOUT, "node Lease unanswered at start; standby");
                    None
                }
            }
        }
        _ => None,
    };
    let lease = read.as_ref().map_or(LeaseAtStart::Unknown, |(l, _)| *l);
    // no Lease: is there a Node under this name, and does something answer the endpoint?
    let (node, health) = match (client, lease, cfg.setting) {
        (Some(c), LeaseAtStart::Missing, AuthoritySetting::Auto) => {
            let nodes = NodeApi::new(c.clone(), &cfg.node_name);
            let node = match tokio::time::timeout(START_TIMEOUT, nodes.exists_latest()).await {
                Ok(Ok(true)) => NodeAtStart::Exists,
                Ok(Ok(false)) => NodeAtStart::Missing,
                Ok(Err(e)) => {
                    tracing::warn!(err = %e, "Node unreadable at start; standby");
                    NodeAtStart::Unknown
                }
                Err(_) => NodeAtStart::Unknown,
            };
            let health = probe_endpoint(cfg.healthz_url.as_deref(), cfg.probe_timeout).await;
            (node, health)
        }
        _ => (NodeAtStart::NotRead, Health::Disabled),
    };
    // an active reaplet restarted in this boot, the Lease unrenewed since it last saw it
    let resume = match (&cfg.marker, &read) {
        (Some(path), Some((LeaseAtStart::Stale, l))) => {
            marker::read_this_boot(path).await.and_then(|m| {
                let now_renew = l.as_ref().and_then(lease::renew_time);
                let age =
                    marker::carried_age(&m, now_renew.as_deref(), &crate::deadline::Stamp::now())?;
                Some((now_renew?, age))
            })
        }
        _ => None,
    };
    let d = start_mode(
        cfg.setting,
        client.is_some(),
        lease,
        node,
        health,
        resume.is_some(),
    );
    let line = |d: &Decision| {
        if d.reason.is_warning() {
            tracing::warn!(
                setting = cfg.setting.as_str(),
                mode = d.mode.as_str(),
                role = d.role.as_str(),
                node = %cfg.node_name,
                health = health.as_str(),
                why = d.reason.as_str(),
                "authority"
            );
        } else {
            tracing::info!(
                setting = cfg.setting.as_str(),
                mode = d.mode.as_str(),
                role = d.role.as_str(),
                why = d.reason.as_str(),
                "authority"
            );
        }
    };
    line(&d);
    authority.set_active(d.role == Role::Active);
    Started {
        decision: d,
        resume: resume.filter(|_| d.reason == Reason::ResumingAfterRestart),
    }
}

/// This node's Node object: whether it exists.
#[derive(Clone)]
pub struct NodeApi {
    api: kube::Api<k8s_openapi::api::core::v1::Node>,
    node: String,
}

impl NodeApi {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: kube::Api::all(client),
            node: node.into(),
        }
    }

    /// Whether it exists, at the newest version (once at start).
    pub async fn exists_latest(&self) -> Result<bool, crate::api::RequestError> {
        crate::api::bounded(self.api.get_metadata_opt(&self.node))
            .await
            .map(|n| n.is_some())
    }

    /// Whether it exists, from the watch cache (`resourceVersion=0`: a Node's existence does
    /// not lag in a way that matters; the takeover's proof).
    async fn exists_cached(&self) -> Result<bool, crate::api::RequestError> {
        match crate::api::bounded(
            self.api
                .get_metadata_with(&self.node, &kube::api::GetParams::any()),
        )
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// The longest wait between two Lease reads while the API server fails them.
pub const LEASE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Whether a look must read the Lease (reads on demand, see [`super::lease`]): while the
/// endpoint fails, while active (the renewal that hands back), and, with the endpoint
/// disabled, when the last read is one [`lease::renewal_period`] old (the Lease alone decides
/// then).
pub fn read_needed(
    health: Health,
    active: bool,
    read: Option<Instant>,
    now: Instant,
    threshold: Duration,
) -> bool {
    match health {
        Health::Failed | Health::Gone => true,
        Health::Ok => active,
        Health::Disabled => {
            active
                || read.is_none_or(|r| {
                    now.saturating_duration_since(r) >= lease::renewal_period(threshold)
                })
        }
    }
}

/// In standby (which includes auto mode, whatever the role at start): looks at the two signals
/// every `cfg.poll` and at every Lease change the watch sees, feeds [`decide`] with the current
/// role, proves a takeover before making it ([`proved`]: a consistent Lease read, the Node),
/// flips `authority` on every change of role (one line and one Node event each) and publishes
/// every decision on `state`. Returns at once in primary mode (`--authority=primary` or no API:
/// primary for the life of the process). The Lease is followed by a watch where the identity
/// may; else, or while the watch's news is older than [`lease::fresh_for`] the threshold, read
/// from the cache when [`read_needed`]; a read that fails backs off (to [`LEASE_BACKOFF_MAX`])
/// when the server answered it, and waits for the server when it did not (`api_health`: the
/// agent's prober tries it for everyone).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cfg: StandbyConfig,
    client: kube::Client,
    api_health: crate::api::health::ApiHealth,
    first: Started,
    authority: Arc<Authority>,
    events: EventSink,
    state: watch::Sender<Decision>,
    cancel: CancellationToken,
) {
    let Started {
        decision: first,
        resume,
    } = first;
    if first.mode == Mode::Primary {
        return;
    }
    let leases = LeaseApi::new(client.clone(), &cfg.node_name);
    let nodes = NodeApi::new(client, &cfg.node_name);
    let (watched_tx, mut watched) = watch::channel(Watched::Starting);
    let follower = cancel.child_token();
    let _stop_follower = follower.clone().drop_guard();
    tokio::spawn(lease::follow(
        leases.clone(),
        api_health.clone(),
        watched_tx,
        follower,
    ));
    let start = Instant::now();
    // resuming after a restart: the Lease's age is known from before it; else the start counts
    // as a renewal
    let (mut renewals, mut resuming) = match resume {
        Some((renew_time, age)) => (
            Renewals::resumed(start, cfg.takeover_after, renew_time.clone(), age),
            Some(renew_time),
        ),
        None => (Renewals::new(start, cfg.takeover_after), None),
    };
    // active at start (auto, Lease missing): active since the start, until a renewal is seen
    // after it (`renewed > start`: the start itself never counts)
    let mut active_since = (first.role == Role::Active).then_some(start);
    // resuming: the marker stays until the takeover rewrites it or a renewal removes it
    if let (Some(path), None) = (&cfg.marker, &resuming) {
        marker::record(path, seen_if(first.role, &renewals)).await;
    }
    let mut last = first;
    let mut read_due = start;
    let mut proof_due = start;
    let policy = crate::backoff::Policy {
        min: cfg.poll,
        max: LEASE_BACKOFF_MAX,
    };
    let mut backoff = crate::backoff::Backoff::new(policy);
    let mut proof_backoff = crate::backoff::Backoff::new(policy);
    // the last proof that did not hold (kept until the next try)
    let mut unproved: Option<Proof> = None;
    let mut start_problem = first.reason.identity_problem().map(|_| first.reason);
    let fresh = lease::fresh_for(cfg.takeover_after);
    let mut lease_failing = false;
    let mut failed_probes: u32 = 0;
    let mut forbidden_seen = false;
    let mut following = true;
    // the last probe: probes are a poll apart, whatever else wakes the loop (a Lease change,
    // the watch refused, the server back), so that three failed probes in a row span two
    // polls and never a few milliseconds
    let mut probed: Option<(Instant, Health)> = None;
    loop {
        let health = match probed {
            Some((at, h)) if at.elapsed() < cfg.poll => h,
            _ => {
                let h = probe_endpoint(cfg.healthz_url.as_deref(), cfg.probe_timeout).await;
                probed = Some((Instant::now(), h));
                failed_probes = match h {
                    Health::Ok | Health::Disabled => 0,
                    Health::Failed | Health::Gone => failed_probes.saturating_add(1),
                };
                h
            }
        };
        // what the watch has delivered, as of when it did (an open watch is no news)
        let forbidden = match &*watched.borrow_and_update() {
            Watched::Starting => false,
            Watched::Forbidden => true,
            Watched::Seen { look, at } => {
                renewals.observe(*at, look);
                false
            }
        };
        if forbidden && !forbidden_seen {
            forbidden_seen = true;
            // the first read follows at once when the decision needs it
            read_due = Instant::now();
        }
        let now = Instant::now();
        // the watch refused, or its news too old (silent, relisting, failing): read on demand
        let known = renewals
            .read()
            .is_some_and(|r| now.saturating_duration_since(r) <= fresh);
        let want = (forbidden || !known)
            && now >= read_due
            && api_health.is_reachable()
            && read_needed(
                health,
                active_since.is_some(),
                renewals.read(),
                now,
                cfg.takeover_after,
            );
        if want {
            match leases.read_cached().await {
                Ok(l) => {
                    api_health.answered();
                    api_health.credentials(false);
                    backoff.succeeded();
                    lease_failing = false;
                    renewals.observe(Instant::now(), &Look::of(l.as_ref()));
                    read_due = Instant::now() + cfg.poll;
                }
                Err(e) => {
                    let first_failure = !std::mem::replace(&mut lease_failing, true);
                    let f = e.failure();
                    api_health.credentials(e.credentials_refused());
                    api_health.failed(f);
                    let wait = backoff.failed(f, rand::random());
                    read_due = match f {
                        // read again as soon as the server is back (the read waits for that)
                        crate::backoff::Failure::NoAnswer => Instant::now(),
                        // while active, every poll: a renewal seen late is time both agents act
                        _ if active_since.is_some() => Instant::now() + cfg.poll,
                        _ => Instant::now() + wait,
                    };
                    if first_failure {
                        tracing::warn!(err = %e, "node Lease unreadable; no takeover on the kubelet's health alone");
                    } else {
                        tracing::debug!(err = %e, "node Lease still unreadable");
                    }
                }
            }
        }
        // a Lease not read lately (no permission, the API down) is no signal: the endpoint
        // alone never takes over
        let signals = |renewals: &Renewals| Signals {
            renewed: renewals.renewed(),
            read: renewals.read(),
            health,
            failed_probes,
        };
        let mut d = decide(
            Mode::Standby,
            cfg.takeover_after,
            Instant::now(),
            signals(&renewals),
            active_since,
        );
        // resuming without an endpoint to probe: the Lease alone, so a whole renewal period of
        // reading it first (a kubelet restarted with reaplet renews within it)
        let resume_early = resuming.is_some()
            && health == Health::Disabled
            && start.elapsed() < lease::renewal_period(cfg.takeover_after);
        if d.role == Role::Active && active_since.is_none() && resume_early {
            d = Decision {
                role: Role::Passive,
                reason: Reason::ResumingAfterRestart,
                ..d
            };
        } else if d.role == Role::Active && active_since.is_none() {
            // a takeover: proved first by a consistent read of the Lease, then the Node; while
            // the next try is not due, what the last one found stands
            let proof = match Instant::now() >= proof_due {
                false => unproved.unwrap_or(Proof::Failed),
                true => match leases.read_latest().await {
                    Err(e) => {
                        tracing::debug!(err = %e, "node Lease: consistent read failed");
                        Proof::Failed
                    }
                    Ok(l) => {
                        renewals.observe(Instant::now(), &Look::of(l.as_ref()));
                        d = decide(
                            Mode::Standby,
                            cfg.takeover_after,
                            Instant::now(),
                            signals(&renewals),
                            active_since,
                        );
                        match (l, d.role) {
                            (_, Role::Passive) => Proof::Holds,
                            (None, _) => Proof::LeaseMissing,
                            (Some(_), _) => match nodes.exists_cached().await {
                                Ok(true) => Proof::Holds,
                                Ok(false) => Proof::NodeMissing,
                                Err(e) => {
                                    tracing::debug!(err = %e, "Node read failed");
                                    Proof::Failed
                                }
                            },
                        }
                    }
                },
            };
            d = proved(d, proof, resuming.is_some());
            if d.role == Role::Passive && proof != Proof::Holds && Instant::now() >= proof_due {
                // tried and not proved: not again before the backoff (a quorum read each time)
                let f = crate::backoff::Failure::Answered { retry_after: None };
                proof_due = Instant::now() + proof_backoff.failed(f, rand::random());
                unproved = Some(proof);
            } else if proof == Proof::Holds {
                proof_backoff.succeeded();
                unproved = None;
            }
        } else if d.role == Role::Passive && active_since.is_none() {
            // no takeover wanted: an old failed proof delays no later one
            proof_backoff.succeeded();
            proof_due = proof_due.min(Instant::now());
            unproved = None;
        }
        // the start found the node's name wrong (a Node without its Lease, no Node while a
        // kubelet answers): said for as long as no Lease appears, not only for the first look
        if let Some(r) = start_problem {
            match renewals.renew_time() {
                Some(_) => start_problem = None,
                None if d.role == Role::Passive => d.reason = r,
                None => {}
            }
        }
        // resuming, and the kubelet renewed since: nothing carries over any more
        if resuming.is_some() && renewals.renew_time() != resuming.as_deref() {
            resuming = None;
            if let (Some(path), Role::Passive) = (&cfg.marker, d.role) {
                marker::record(path, None).await;
            }
        }
        let now = Instant::now();
        if d.role != last.role {
            active_since = (d.role == Role::Active).then_some(now);
            resuming = None;
        }
        if d != last {
            let age = renewals.renewed().elapsed();
            let msg = format!(
                "{} (no Lease renewal seen for {:.0?}, Lease last read {}, healthz {}{})",
                d.reason.as_str(),
                age,
                renewals
                    .read()
                    .map_or("never".into(), |r| format!("{:.0?} ago", r.elapsed())),
                health.as_str(),
                match failed_probes {
                    0 | 1 => String::new(),
                    n => format!(" on {n} probes in a row"),
                }
            );
            // a takeover is remembered before it acts: a crash right after it resumes as the
            // node's agent (the marker) instead of waiting one more threshold
            if let (Some(path), Role::Passive, Role::Active) = (&cfg.marker, last.role, d.role) {
                marker::record(path, seen_if(d.role, &renewals)).await;
            }
            // a change of role: the Node event's own log line is the one line
            match (last.role, d.role) {
                (Role::Passive, Role::Active) => {
                    events.record_node(NodeEventReason::ReapletTookOver, &msg)
                }
                (Role::Active, Role::Passive) => {
                    events.record_node(NodeEventReason::ReapletHandedBack, &msg)
                }
                _ if d.reason.is_warning() => {
                    tracing::warn!(
                        why = d.reason.as_str(),
                        ?age,
                        health = health.as_str(),
                        node = %cfg.node_name,
                        "standby"
                    );
                }
                _ => tracing::info!(why = d.reason.as_str(), "standby"),
            }
            // after its line: the line comes before anything the new role does
            authority.set_active(d.role == Role::Active);
            // a hand-back forgets it once no kill may start any more
            if let (Some(path), Role::Active, Role::Passive) = (&cfg.marker, last.role, d.role) {
                marker::record(path, None).await;
            }
            last = d;
            state.send_replace(d);
        }
        let down = !api_health.is_reachable();
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(cfg.poll) => {}
            // a Lease change (or the watch refused): decide at once; once the follower has
            // ended (forbidden: reads on demand), the poll alone paces the looks
            r = watched.changed(), if following => following = r.is_ok(),
            // back after an outage: read the Lease now
            _ = api_health.reachable(), if down => {}
        }
    }
}

/// What the marker keeps for `role`: active, the Lease as last seen; passive, nothing.
fn seen_if(role: Role, renewals: &Renewals) -> Option<marker::LeaseSeen> {
    (role == Role::Active).then(|| marker::LeaseSeen {
        renew_time: renewals.renew_time().map(str::to_owned),
        renewed_ago: renewals.renewed().elapsed(),
    })
}
