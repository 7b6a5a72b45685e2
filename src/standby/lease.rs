//! What reaplet knows of the node Lease (`kube-node-lease/<node>`), and how it learns it
//! without costing the control plane.
//!
//! Counterpart: the node lifecycle controller, which watches every node Lease through an
//! informer (`nodeLeaseInformer`) and judges a node by when it *observed* a renewal, on its own
//! clock. reaplet does the same for one Lease.
//!
//! Two ways to learn the Lease, chosen once per connection by what the identity may do:
//!
//! * **a watch** on that one object (`fieldSelector=metadata.name=<node>`): a list served from
//!   the watch cache (`resourceVersion=0`) and a watch with bookmarks from its version. Beside a
//!   live kubelet this costs one watch per [`WATCH_TIMEOUT`] and no quorum read; a renewal is
//!   seen when it happens (not up to one poll later). What the watch says is as old as the last
//!   thing it delivered (the list, an event, a bookmark): an open watch proves nothing by being
//!   open. Silence longer than [`fresh_for`] (the kubelet's renewal period plus slack) makes
//!   the Lease *unknown*, not stale, and the decision then reads it on demand as below; a
//!   relist, its backoff and a failed list deliver nothing, so they age the same way. A watch
//!   silent for [`WATCH_IDLE`] is restarted; one that ends in under a second having delivered
//!   nothing is a failure and backs off (client-go's reflector: "very short watch").
//! * **reads on demand**: the Node authorizer lets a node identity get its own Lease but not
//!   list or watch it (apiserver facts 8.5: `403`), so with the node's own credentials (the
//!   default, and the DaemonSet) the list is refused (twice in a row, [`FORBIDDEN_RECHECK`]
//!   apart: a restarted server may refuse before its RBAC is loaded) and reaplet falls back to a GET served
//!   from the watch cache (`resourceVersion=0`, never a quorum read), made only when the
//!   decision needs the Lease: while the kubelet's health endpoint fails, while reaplet is
//!   active (to see the renewal that hands back), or, with the endpoint disabled, once per
//!   renewal period ([`renewal_period`]). Beside a kubelet that answers `/healthz` this costs nothing at all.
//!   The watch path falls back to the same reads while its news is older than [`fresh_for`].
//!
//! Neither is proof enough for a takeover: both may be served by a watch cache that lags
//! etcd. Before becoming active the standby loop makes one consistent read
//! ([`LeaseApi::read_latest`], a GET without `resourceVersion`): takeovers are rare, so this
//! read costs a fleet nothing.
//!
//! # Renewals (the pure part: [`Renewals`])
//!
//! A renewal is a change of `renewTime` seen by reaplet, dated on its monotonic clock (see the
//! module doc of [`super`]). While the Lease is followed continuously (a current watch, or reads
//! no further apart than one [`renewal_period`]), a change is dated when it is seen. After
//! a gap (reads on demand start when the kubelet's endpoint first fails), a changed
//! `renewTime` is dated back by its wall-clock age, but never by more than the kubelet's
//! renewal period ([`KUBELET_RENEWAL`], 10 s; half the threshold if that is less): a skewed
//! clock can bring a takeover at most that much sooner, and a takeover still needs the rest of
//! the threshold (30 s by default, 10 s at the shortest) of reaplet's own continuous reading
//! without a renewal, with the endpoint failing. Without that credit, a takeover after a gap
//! would come up to one renewal period later than while polling. The start counts as a
//! renewal, as before.

use crate::api::health::ApiHealth;
use crate::backoff::{Backoff, Failure, Policy, STABLE_RESET};
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{GetParams, ListParams, WatchEvent, WatchParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The server ends a Lease watch after this long (a fresh watch from the last version follows).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(290);
/// The kubelet's Lease renewal period (a quarter of its `nodeLeaseDurationSeconds`, 40 s).
pub const KUBELET_RENEWAL: Duration = Duration::from_secs(10);
/// A watch that has sent nothing (no event, no bookmark: the server sends one about every
/// 60 s, apiserver facts 7.6) for this long is taken for dead and started again.
pub const WATCH_IDLE: Duration = Duration::from_secs(90);
/// After a `403` on the Lease list or watch, the list is asked again once this much later
/// (reads on demand meanwhile): a server that has just restarted may refuse before its RBAC is
/// loaded. A second `403` in a row is final (the node identity's, which may never list its
/// Lease: one more request per node and process start).
pub const FORBIDDEN_RECHECK: Duration = Duration::from_secs(10);
/// A watch that ends sooner than this having delivered nothing failed (client-go's reflector:
/// "very short watch"): it backs off instead of being opened again at once.
pub const SHORT_WATCH: Duration = Duration::from_secs(1);

/// The kubelet's renewal period as reaplet counts on it for the takeover `threshold`:
/// [`KUBELET_RENEWAL`] (the kubelet renews every 10 s whatever reaplet's threshold), or half
/// the threshold below 20 s (only tests scale the threshold down, with their stand-in's
/// renewals). The one period behind [`fresh_for`], the reads on demand and the credit a change
/// seen after a gap gets.
pub fn renewal_period(threshold: Duration) -> Duration {
    KUBELET_RENEWAL.min(threshold / 2)
}

/// How long a look at the Lease (a read, or the last thing the watch delivered) tells what it
/// is: one [`renewal_period`] plus half of one as slack for a renewal's latency (15 s). A live
/// kubelet's watch delivers a renewal within it; past it the Lease is unknown.
pub fn fresh_for(threshold: Duration) -> Duration {
    let renewal = renewal_period(threshold);
    renewal + renewal / 2
}

/// The Lease's `renewTime` (RFC 3339 with microseconds) as a string, to compare for change.
pub fn renew_time(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0.to_string())
}

/// How long ago, by this machine's wall clock, the Lease was renewed (`None`: no renewTime,
/// or one ahead of this clock).
pub fn wall_age(lease: &Lease) -> Option<Duration> {
    let t = lease.spec.as_ref()?.renew_time.as_ref()?;
    Duration::try_from(jiff::Timestamp::now().duration_since(t.0)).ok()
}

/// One look at the Lease: its `renewTime` (`None`: missing, or never renewed) and that time's
/// wall-clock age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    pub renew_time: Option<String>,
    pub wall_age: Option<Duration>,
}

impl Look {
    pub fn of(lease: Option<&Lease>) -> Self {
        Self {
            renew_time: lease.and_then(renew_time),
            wall_age: lease.and_then(wall_age),
        }
    }
}

/// The renewals reaplet has seen (pure: every instant is passed in).
#[derive(Debug, Clone)]
pub struct Renewals {
    /// The last `renewTime` seen (`None`: none yet).
    seen: Option<String>,
    /// When reaplet last saw the Lease renewed (the start counts as one).
    renewed: Instant,
    /// Until when the Lease is known as it is (the last read, or the last thing the watch
    /// delivered).
    current: Option<Instant>,
    /// The most a changed `renewTime` is dated back after a gap, and the longest gap between
    /// two reads that still counts as following the Lease continuously.
    credit: Duration,
}

impl Renewals {
    /// At `start`, with the takeover `threshold`.
    pub fn new(start: Instant, threshold: Duration) -> Self {
        Self {
            seen: None,
            renewed: start,
            current: None,
            credit: renewal_period(threshold),
        }
    }

    /// After a restart of an active reaplet ([`super::marker`]): the Lease was last seen
    /// renewed with `renew_time`, `age` before `start` (that `renewTime` again is no renewal).
    pub fn resumed(start: Instant, threshold: Duration, renew_time: String, age: Duration) -> Self {
        Self {
            seen: Some(renew_time),
            renewed: start.checked_sub(age).unwrap_or(start),
            ..Self::new(start, threshold)
        }
    }

    /// The last `renewTime` seen.
    pub fn renew_time(&self) -> Option<&str> {
        self.seen.as_deref()
    }

    /// When a renewal was last seen.
    pub fn renewed(&self) -> Instant {
        self.renewed
    }

    /// Until when the Lease is known (`None`: never read).
    pub fn read(&self) -> Option<Instant> {
        self.current
    }

    /// The Lease as seen at `at`. A look older than one already taken (the watch's last value,
    /// looked at again after a newer read) tells nothing new: it changes nothing, so that an old
    /// `renewTime` never undoes a newer one (which would make the newer one a "renewal" at
    /// every later look).
    pub fn observe(&mut self, at: Instant, look: &Look) {
        if self.current.is_some_and(|c| at < c) {
            return;
        }
        let continuous = self
            .current
            .is_some_and(|c| at.saturating_duration_since(c) <= self.credit);
        if look.renew_time.is_some() && look.renew_time != self.seen {
            // a first look, or a look after a gap, dates the change back by its wall-clock
            // age, capped; a look while following it dates the change when it is seen
            let back = match continuous {
                true => Duration::ZERO,
                false => look.wall_age.unwrap_or_default().min(self.credit),
            };
            let when = at.checked_sub(back).unwrap_or(at);
            self.renewed = self.renewed.max(when);
            self.seen = look.renew_time.clone();
        }
        self.current = Some(self.current.map_or(at, |c| c.max(at)));
    }

    /// Nothing changed up to `at` (a bookmark, a read that found it unchanged).
    pub fn unchanged_until(&mut self, at: Instant) {
        self.current = Some(self.current.map_or(at, |c| c.max(at)));
    }
}

/// What the watch task publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// Not listed yet.
    Starting,
    /// The Lease as of `at`: when the watch last delivered something (the list, an event, a
    /// bookmark). Nothing says it is still so after `at`: an open, silent watch is no news.
    Seen { look: Look, at: Instant },
    /// The identity may not list or watch the Lease (a node identity): read it on demand.
    Forbidden,
}

/// The Lease's API, and the field selector of this node's.
#[derive(Clone)]
pub struct LeaseApi {
    api: kube::Api<Lease>,
    node: String,
}

impl LeaseApi {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, super::LEASE_NAMESPACE),
            node: node.into(),
        }
    }

    /// One read served from the watch cache (`resourceVersion=0`): `None` when there is no
    /// Lease.
    pub async fn read_cached(&self) -> Result<Option<Lease>, crate::api::RequestError> {
        match crate::api::bounded(self.api.get_with(&self.node, &GetParams::any())).await {
            Ok(l) => Ok(Some(l)),
            Err(e) if e.code() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One read at the newest version (a quorum read: only at start, where a missing Lease
    /// makes reaplet active at once).
    pub async fn read_latest(&self) -> Result<Option<Lease>, crate::api::RequestError> {
        crate::api::bounded(self.api.get_opt(&self.node)).await
    }

    fn selector(&self) -> String {
        format!("metadata.name={}", self.node)
    }
}

/// How one watch ended.
enum WatchEnd {
    /// The server ended it (its timeout, or a silent stream): watch again from the version.
    Again,
    /// `410 Gone` or an error event: list again.
    Relist,
    Failed(Failure),
    Forbidden,
    Cancelled,
}

/// Follows the Lease with a list and watches until cancelled, publishing on `tx`; returns
/// after publishing [`Watched::Forbidden`] when the identity may not list it.
pub async fn follow(
    leases: LeaseApi,
    health: ApiHealth,
    tx: watch::Sender<Watched>,
    cancel: CancellationToken,
) {
    // reset only after two quiet minutes, never by an event (client-go's reflector)
    let mut backoff = Backoff::resetting_after(Policy::API, STABLE_RESET);
    let mut failing = false;
    // 403s in a row (a list that works ends the run)
    let mut refusals = 0u32;
    loop {
        let lp = ListParams::default().fields(&leases.selector()).match_any();
        let listed = tokio::select! {
            _ = cancel.cancelled() => return,
            r = crate::api::bounded(leases.api.list(&lp)) => r,
        };
        let (mut version, look) = match listed {
            Ok(list) => {
                health.answered();
                health.credentials(false);
                refusals = 0;
                let v = list.metadata.resource_version.clone().unwrap_or_default();
                (v, Look::of(list.items.first()))
            }
            Err(e) if e.code() == Some(403) => {
                if !refused(&tx, &mut refusals, &cancel).await {
                    tracing::info!(err = %e, "node Lease: this identity may not watch it; reading it from the API server's cache when the kubelet's health needs it");
                    return;
                }
                continue;
            }
            Err(e) => {
                let f = e.failure();
                health.credentials(e.credentials_refused());
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(err = %e, "node Lease list failed; retrying");
                }
                health.failed(f);
                if !health
                    .wait_to_retry(f, backoff.failed(f, rand::random()), &cancel)
                    .await
                {
                    return;
                }
                continue;
            }
        };
        tx.send_replace(Watched::Seen {
            look,
            at: Instant::now(),
        });
        loop {
            let end = watch_once(&leases, &mut version, &health, &tx, &cancel).await;
            match end {
                WatchEnd::Again => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("node Lease watch working again");
                    }
                    continue;
                }
                WatchEnd::Relist => {
                    // 410: the version is gone; relist after the backoff, as the reflector
                    // does, so that a watch expiring at once never makes a list loop
                    let f = Failure::Answered { retry_after: None };
                    if !health
                        .wait_to_retry(f, backoff.failed(f, rand::random()), &cancel)
                        .await
                    {
                        return;
                    }
                    break;
                }
                WatchEnd::Cancelled => return,
                WatchEnd::Forbidden => {
                    if !refused(&tx, &mut refusals, &cancel).await {
                        tracing::info!(
                            "node Lease: this identity may not watch it; reading it from the API server's cache when the kubelet's health needs it"
                        );
                        return;
                    }
                    break;
                }
                WatchEnd::Failed(f) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!("node Lease watch failed; listing it again");
                    }
                    health.failed(f);
                    if !health
                        .wait_to_retry(f, backoff.failed(f, rand::random()), &cancel)
                        .await
                    {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

async fn watch_once(
    leases: &LeaseApi,
    version: &mut String,
    health: &ApiHealth,
    tx: &watch::Sender<Watched>,
    cancel: &CancellationToken,
) -> WatchEnd {
    let wp = WatchParams::default()
        .fields(&leases.selector())
        .timeout(WATCH_TIMEOUT.as_secs() as u32);
    let started = tokio::select! {
        _ = cancel.cancelled() => return WatchEnd::Cancelled,
        r = crate::api::bounded(leases.api.watch(&wp, version)) => r,
    };
    let stream = match started {
        Ok(s) => s,
        Err(e) if e.code() == Some(403) => return WatchEnd::Forbidden,
        Err(e) if e.code() == Some(410) => return WatchEnd::Relist,
        Err(e) => {
            tracing::debug!(err = %e, "node Lease watch not started");
            return WatchEnd::Failed(e.failure());
        }
    };
    health.answered();
    let opened = Instant::now();
    let mut delivered = false;
    let mut stream = std::pin::pin!(stream);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return WatchEnd::Cancelled,
            n = tokio::time::timeout(WATCH_IDLE, stream.next()) => n,
        };
        let ev = match next {
            Err(_) => {
                tracing::debug!(idle = ?WATCH_IDLE, "node Lease watch silent; starting it again");
                return WatchEnd::Again;
            }
            Ok(None) => return ended(opened, delivered),
            Ok(Some(Err(e))) => return WatchEnd::Failed(crate::api::failure_of(&e)),
            Ok(Some(Ok(ev))) => ev,
        };
        delivered = true;
        let now = Instant::now();
        match ev {
            WatchEvent::Added(l) | WatchEvent::Modified(l) => {
                if let Some(v) = l.metadata.resource_version.clone() {
                    *version = v;
                }
                tx.send_replace(Watched::Seen {
                    look: Look::of(Some(&l)),
                    at: now,
                });
            }
            WatchEvent::Deleted(l) => {
                if let Some(v) = l.metadata.resource_version.clone() {
                    *version = v;
                }
                tx.send_replace(Watched::Seen {
                    look: Look::of(None),
                    at: now,
                });
            }
            WatchEvent::Bookmark(b) => {
                *version = b.metadata.resource_version;
                // the watch is caught up to the bookmark: what was seen is still so now (no
                // wake-up: nothing changed)
                tx.send_if_modified(|w| match w {
                    Watched::Seen { at, .. } => {
                        *at = (*at).max(now);
                        false
                    }
                    _ => false,
                });
            }
            WatchEvent::Error(s) if s.code == 410 => return WatchEnd::Relist,
            WatchEvent::Error(s) => {
                tracing::debug!(code = s.code, msg = %s.message, "node Lease watch error event");
                return WatchEnd::Relist;
            }
        }
    }
}

/// A `403` on the list or the watch: reads on demand from now ([`Watched::Forbidden`]); true
/// when the list is to be asked again ([`FORBIDDEN_RECHECK`] later; the first refusal in a
/// row), false when the refusal is final or the follower is cancelled.
async fn refused(
    tx: &watch::Sender<Watched>,
    refusals: &mut u32,
    cancel: &CancellationToken,
) -> bool {
    tx.send_replace(Watched::Forbidden);
    *refusals += 1;
    if *refusals > 1 {
        return false;
    }
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(FORBIDDEN_RECHECK) => true,
    }
}

/// How a watch stream that the server ended counts: the server's timeout after news, or a
/// failure when it ended within [`SHORT_WATCH`] having delivered nothing (a proxy that ends
/// watches at once, an empty body): opened again at once, it would loop.
fn ended(opened: Instant, delivered: bool) -> WatchEnd {
    match delivered || opened.elapsed() >= SHORT_WATCH {
        true => WatchEnd::Again,
        false => WatchEnd::Failed(Failure::Answered { retry_after: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(40);

    fn look(t: &str, age: u64) -> Look {
        Look {
            renew_time: Some(t.into()),
            wall_age: Some(Duration::from_secs(age)),
        }
    }

    #[test]
    fn the_start_counts_as_a_renewal_and_a_first_look_at_start_changes_nothing() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        r.observe(start, &look("a", 300));
        assert_eq!(r.renewed(), start);
        assert_eq!(r.read(), Some(start));
    }

    #[test]
    fn a_change_seen_while_following_is_dated_when_seen() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        r.observe(start, &look("a", 0));
        let later = start + Duration::from_secs(60);
        // followed continuously (a current watch)
        r.unchanged_until(later - Duration::from_secs(1));
        r.observe(later, &look("b", 30));
        assert_eq!(r.renewed(), later);
    }

    #[test]
    fn after_a_gap_a_change_is_dated_back_by_its_age_capped_at_the_renewal_period() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        let at = start + Duration::from_secs(120);
        r.observe(at, &look("a", 4));
        assert_eq!(r.renewed(), at - Duration::from_secs(4));
        // a skewed clock (an age of minutes) gives at most a quarter of the threshold
        let mut r = Renewals::new(start, T);
        r.observe(at, &look("a", 600));
        assert_eq!(r.renewed(), at - KUBELET_RENEWAL);
        // the shortest threshold (20 s): at most half of it
        let mut r = Renewals::new(start, Duration::from_secs(20));
        r.observe(at, &look("a", 600));
        assert_eq!(r.renewed(), at - Duration::from_secs(10));
        // an unchanged renewTime after a gap is no renewal
        let before = r.renewed();
        r.observe(at + Duration::from_secs(100), &look("a", 700));
        assert_eq!(r.renewed(), before);
    }

    #[test]
    fn a_missing_lease_is_no_renewal_and_one_appearing_is() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        r.observe(start + Duration::from_secs(1), &Look::of(None));
        assert_eq!(r.renewed(), start);
        let at = start + Duration::from_secs(3);
        r.observe(at, &look("a", 0));
        assert_eq!(r.renewed(), at);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_ending_at_once_with_nothing_delivered_is_a_failure() {
        let opened = Instant::now();
        assert!(matches!(
            ended(opened, false),
            WatchEnd::Failed(Failure::Answered { retry_after: None })
        ));
        // news delivered, or the server's own timeout after a while: watch again at once
        assert!(matches!(ended(opened, true), WatchEnd::Again));
        tokio::time::advance(SHORT_WATCH).await;
        assert!(matches!(ended(opened, false), WatchEnd::Again));
    }

    #[test]
    fn a_look_tells_the_lease_for_a_renewal_period_and_half_of_one() {
        assert_eq!(fresh_for(T), Duration::from_secs(15));
        // the kubelet renews every 10 s whatever the threshold: the shortest accepted too
        assert_eq!(fresh_for(Duration::from_secs(20)), Duration::from_secs(15));
        assert_eq!(fresh_for(Duration::from_secs(4)), Duration::from_secs(3));
    }

    #[test]
    fn after_a_restart_the_renew_time_seen_before_is_no_renewal_and_a_new_one_is() {
        let start = Instant::now() + Duration::from_secs(3600);
        let age = Duration::from_secs(60);
        let mut r = Renewals::resumed(start, T, "a".into(), age);
        assert_eq!(r.renewed(), start - age);
        assert_eq!(r.renew_time(), Some("a"));
        r.observe(start, &look("a", 61));
        assert_eq!(r.renewed(), start - age, "the same renewTime");
        r.observe(start + Duration::from_secs(2), &look("b", 0));
        assert_eq!(r.renewed(), start + Duration::from_secs(2));
    }

    /// Review of issue 44: a stalled watch's old value, looked at again after a newer read,
    /// must not set the renewal seen back, or the next read's newer `renewTime` counts as a
    /// renewal every time (before: renewed at +32 s and at every read after, so a dead kubelet
    /// was never taken over).
    #[test]
    fn an_older_look_seen_again_is_no_renewal_and_never_undoes_a_newer_one() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        // the watch delivered A at the start, then stalled
        r.observe(start, &look("A", 0));
        // a read on demand 30 s later sees C (the kubelet's last renewal, then it died)
        let c_at = start + Duration::from_secs(30);
        r.observe(c_at, &look("C", 5));
        let renewed = r.renewed();
        // every look after that: the watch's old A again, then another read of C
        for i in 0..10u64 {
            r.observe(start, &look("A", 0));
            r.observe(
                c_at + Duration::from_secs(2 * (i + 1)),
                &look("C", 7 + 2 * i),
            );
        }
        assert_eq!(r.renewed(), renewed, "C seen again is no renewal");
        assert_eq!(r.renew_time(), Some("C"));
    }

    #[test]
    fn renewals_never_go_back_in_time() {
        let start = Instant::now();
        let mut r = Renewals::new(start, T);
        let at = start + Duration::from_secs(5);
        r.observe(at, &look("a", 0));
        // an older observation published late does not move it back
        r.observe(start + Duration::from_secs(2), &look("b", 0));
        assert_eq!(r.renewed(), at);
    }
}
