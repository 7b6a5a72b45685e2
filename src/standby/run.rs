//! The standby loop: feeds [`decide`] with the two signals and flips the [`Authority`] (see the
//! module doc of [`super`] for the rule and its race analysis, and [`super::lease`] for how the
//! Lease is followed at almost no cost to the control plane).
//!
//! Invariants: one decision per look; a look probes the endpoint (local) and reads the Lease
//! only when following it by watch is forbidden and the decision needs it; one line and one
//! Node event per change of role; a Lease change seen by the watch is decided on at once.

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

/// Decides the mode at start (one Lease GET at the newest version: a missing Lease makes
/// reaplet active at once, so this one read is not served from a cache that may lag) and returns the first decision; sets `authority`.
pub async fn start(
    cfg: &StandbyConfig,
    client: Option<&kube::Client>,
    authority: &Authority,
) -> Decision {
    let lease = match client {
        Some(c) if cfg.setting != AuthoritySetting::Primary => {
            let leases = LeaseApi::new(c.clone(), &cfg.node_name);
            match tokio::time::timeout(START_TIMEOUT, leases.read_latest()).await {
                Ok(Ok(l)) => lease_at_start(l.as_ref(), cfg.takeover_after),
                Ok(Err(e)) => {
                    tracing::warn!(err = %e, "node Lease unreadable at start; standby");
                    LeaseAtStart::Unknown
                }
                Err(_) => {
                    tracing::warn!(timeout = ?START_TIMEOUT, "node Lease unanswered at start; standby");
                    LeaseAtStart::Unknown
                }
            }
        }
        _ => LeaseAtStart::Unknown,
    };
    // an active reaplet restarted in this boot, the kubelet still not answering: resume
    let resumed = match (&cfg.marker, lease) {
        (Some(path), LeaseAtStart::Stale) => {
            marker::active_this_boot(path).await
                && probe_endpoint(cfg.healthz_url.as_deref(), cfg.probe_timeout).await != Health::Ok
        }
        _ => false,
    };
    let d = start_mode(cfg.setting, client.is_some(), lease, resumed);
    authority.set_active(d.role == Role::Active);
    tracing::info!(
        setting = cfg.setting.as_str(),
        mode = d.mode.as_str(),
        role = d.role.as_str(),
        why = d.reason.as_str(),
        "authority"
    );
    d
}

/// The longest wait between two Lease reads while the API server fails them.
pub const LEASE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Whether a look must read the Lease (reads on demand, see [`super::lease`]): while the
/// endpoint fails, while active (the renewal that hands back), and, with the endpoint
/// disabled, when the last read is a quarter threshold old (the Lease alone decides then).
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
            active || read.is_none_or(|r| now.saturating_duration_since(r) >= threshold / 4)
        }
    }
}

/// In standby (which includes auto mode, whatever the role at start): looks at the two signals
/// every `cfg.poll` and at every Lease change the watch sees, feeds [`decide`] with the current
/// role, flips `authority` on every change of role (one line and one Node event each) and
/// publishes every decision on `state`. Returns at once in primary mode (`--authority=primary`
/// or no API: primary for the life of the process). The Lease is followed by a watch where the
/// identity may; else read from the cache when [`read_needed`]; a read that fails backs off (to
/// [`LEASE_BACKOFF_MAX`]) when the server answered it, and waits for the server when it did
/// not (`api_health`: the agent's prober tries it for everyone).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cfg: StandbyConfig,
    client: kube::Client,
    api_health: crate::api::health::ApiHealth,
    first: Decision,
    authority: Arc<Authority>,
    events: EventSink,
    state: watch::Sender<Decision>,
    cancel: CancellationToken,
) {
    if first.mode == Mode::Primary {
        return;
    }
    let leases = LeaseApi::new(client, &cfg.node_name);
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
    let mut renewals = Renewals::new(start, cfg.takeover_after);
    // active at start (auto, Lease missing): active since the start, until a renewal is seen
    // after it (`renewed > start`: the start itself never counts)
    let mut active_since = (first.role == Role::Active).then_some(start);
    if let Some(path) = &cfg.marker {
        marker::record(path, first.role == Role::Active).await;
    }
    let mut last = first;
    let mut read_due = start;
    let mut backoff = crate::backoff::Backoff::new(crate::backoff::Policy {
        min: cfg.poll,
        max: LEASE_BACKOFF_MAX,
    });
    let mut lease_failing = false;
    let mut failed_probes: u32 = 0;
    let mut forbidden_seen = false;
    let mut following = true;
    loop {
        let health = probe_endpoint(cfg.healthz_url.as_deref(), cfg.probe_timeout).await;
        failed_probes = match health {
            Health::Ok | Health::Disabled => 0,
            Health::Failed | Health::Gone => failed_probes.saturating_add(1),
        };
        // what the watch has seen
        let forbidden = {
            let w = watched.borrow_and_update();
            match &*w {
                Watched::Starting => false,
                Watched::Forbidden => true,
                Watched::Seen { look, at, current } => {
                    renewals.observe(*at, look);
                    if *current {
                        renewals.unchanged_until(Instant::now());
                    }
                    false
                }
            }
        };
        if forbidden && !forbidden_seen {
            forbidden_seen = true;
            // the first read follows at once when the decision needs it
            read_due = Instant::now();
        }
        let now = Instant::now();
        let want = forbidden
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
        let now = Instant::now();
        // a Lease not read lately (no permission, the API down) is no signal: the endpoint
        // alone never takes over
        let seen = Signals {
            renewed: renewals.renewed(),
            read: renewals.read(),
            health,
            failed_probes,
        };
        let d = decide(Mode::Standby, cfg.takeover_after, now, seen, active_since);
        if d.role != last.role {
            active_since = (d.role == Role::Active).then_some(now);
        }
        if d != last {
            let age = renewals.renewed().elapsed();
            authority.set_active(d.role == Role::Active);
            if let (Some(path), true) = (&cfg.marker, d.role != last.role) {
                marker::record(path, d.role == Role::Active).await;
            }
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
                        "standby"
                    );
                }
                _ => tracing::info!(why = d.reason.as_str(), "standby"),
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
