//! Standby beside the kubelet: whether reaplet acts (kills) or only watches, and the task that
//! switches [`Authority`] between the two.
//!
//! Counterparts: the node lifecycle controller's Lease-based node health (a node whose Lease
//! `kube-node-lease/<node>` is not renewed for `nodeMonitorGracePeriod`, 40 s, is marked
//! `NotReady`/`Unknown`; the kubelet renews every 10 s) and the kubelet's own health endpoint
//! (`--healthz-port` 10248, `GET /healthz` on `127.0.0.1`). reaplet uses both: the Lease says
//! what the control plane sees, the endpoint says whether the process on this node answers.
//!
//! # Modes
//!
//! * [`AuthoritySetting::Primary`]: reaplet is the node's only termination agent (always
//!   active, for the life of the process); also what running without an API (static manifests
//!   only) means. [`Mode::Primary`] means exactly these two.
//! * [`AuthoritySetting::Standby`]: a kubelet is the primary; reaplet follows the kubelet's
//!   signals and kills nothing until it takes over (it watches no pod meanwhile).
//! * [`AuthoritySetting::Auto`] (the default): always [`Mode::Standby`], with the standby loop
//!   running for the life of the process. The role at start depends on the Lease: passive when
//!   a kubelet holds this node's Lease (it exists and its `renewTime` is within the threshold)
//!   or when the Lease cannot be read, or is stale (a node reboot: reaplet may read it before
//!   the kubelet's first renewal; the start counts as a renewal, so a kubelet that never comes
//!   back is taken over one threshold later, by the rule below). A missing Lease is "no
//!   kubelet" only when nothing else says there is one: active at once ("active since start",
//!   ending like any takeover at the first Lease renewal seen) when the Node object does not
//!   exist under reaplet's node name either and nothing answers on the kubelet's health
//!   endpoint. A Node without a Lease (a kubelet registered under another name, or not yet),
//!   a missing Node while something answers the health endpoint (the same, seen from the
//!   other side), or a Node that cannot be read, is passive with a warning
//!   ([`Reason::NodeWithoutLease`], [`Reason::NoNodeKubeletAnswers`],
//!   [`Reason::NodeUnknownAtStart`]): a wrong node name must never look like a dead kubelet. A
//!   Lease never read (no permission, the API down since the start) is no signal: the endpoint
//!   alone never takes over.
//! * A restart of an active reaplet in the same boot ([`marker`]) starts passive too, but does
//!   not count its start as a renewal: the marker keeps the Lease's `renewTime` and when
//!   reaplet last saw it change (`CLOCK_BOOTTIME`), so when the Lease still carries that
//!   `renewTime` the loop knows its age on the monotonic clock and takes over again with the
//!   same proof as any takeover (three failed probes, a stale read, the consistent read),
//!   a few seconds after the start instead of a whole threshold ([`Reason::ActiveBeforeRestart`]).
//!   A kubelet restarted together with reaplet that has not bound its health port yet answers
//!   one of those probes, or renews: reaplet stays passive.
//!
//! The decision is the pure [`decide`] (and [`start_mode`] once at start); [`run`] feeds it.
//!
//! # The rule in standby
//!
//! Take over ([`Role::Active`]) only when **both** signals say the kubelet is gone: a look at
//! the Lease no older than [`lease::fresh_for`] the threshold (a read, or the last thing its
//! watch delivered) shows it not renewed for longer than the threshold (default 40 s) **and**
//! the health endpoint failed [`FAILED_PROBES_TO_TAKE_OVER`] probes in a row (an error status,
//! a timeout, or nothing listening: the process is gone). Then, before anything is done, the
//! proof: one consistent read of the Lease (a GET without `resourceVersion`, never served by a
//! watch cache that may lag) must still show it unrenewed, and the Node object must exist under
//! reaplet's node name; a consistent read that fails, a missing Lease or a missing Node keep
//! reaplet passive ([`Reason::TakeoverUnconfirmed`], [`Reason::LeaseMissing`],
//! [`Reason::NodeMissing`]) and the proof is tried again at the next look. A
//! Lease that cannot be read (the API down for reaplet, no permission) is not a stale Lease:
//! the endpoint alone never takes over ([`Reason::LeaseUnread`]), and one slow answer or a
//! kubelet restarting is not a dead kubelet ([`Reason::KubeletMayBeGone`]). One signal alone is
//! a warning ([`Reason::LeaseStale`], [`Reason::HealthzFailing`]), never a takeover.
//!
//! Once active, the decision has memory (hysteresis): reaplet stays active until the Lease is
//! seen renewed *after* the moment it became active (the takeover, or the start), and hands
//! back ([`Role::Passive`]) then, whatever the endpoint says (a kubelet that renews is acting,
//! even while its endpoint is not up yet). The endpoint alone never hands back: a crash-looping
//! kubelet answers `/healthz` for a few seconds between crashes without renewing, and handing
//! back on that would flap (an active reaplet whose endpoint answers again reports the warning
//! [`Reason::HealthzBackNoRenewal`]). After a hand-back the standby rule applies afresh.
//!
//! # Lease age is measured on reaplet's monotonic clock
//!
//! The Lease's `renewTime` is the kubelet's wall clock. reaplet does not subtract it from its
//! own wall clock (a step of the clock, NTP or a VM resume, would fake a dead or a live
//! kubelet); it remembers the [`Instant`] at which it *saw* `renewTime` change, and the age is
//! `now - that instant`. How it sees the Lease, and what that costs the control plane, is
//! [`lease`]: a watch on the one object where the identity may (a renewal is seen when it
//! happens), else reads from the watch cache only while the decision needs them (the node
//! identity may not watch its Lease; beside a kubelet that answers `/healthz` nothing is read
//! at all). A change seen after a gap in reading is dated back by its wall-clock age, at most
//! one kubelet renewal period ([`lease::KUBELET_RENEWAL`]): the only use of the wall clock after
//! the start, bounded so that a skewed clock moves a takeover by at most that much. At start
//! the first observation counts as a renewal (takeover at the earliest one threshold after
//! start: the safe direction); [`start_mode`] compares `renewTime` with the wall clock, once,
//! to tell whether a kubelet holds the Lease at all. After the first observation, every change
//! is a renewal: a new `renewTime`, or a Lease appearing where there was none (a kubelet
//! registering). A Lease that cannot be read (API down, a watch that fails) is neither renewed
//! nor stale as far as reaplet knows: a passive reaplet stays passive, an active one stays
//! active until it sees a renewal. A look probes the endpoint (bounded by the probe timeout)
//! and, reading on demand, reads the Lease (bounded by [`crate::api::REQUEST_TIMEOUT`]): an API
//! that hangs delays the next decision by up to that bound.
//!
//! # Nothing kept for pods another agent ends
//!
//! While passive, reaplet holds no pod watch at all: it decodes no pod and keeps nothing of
//! the node's pods (the API pod source waits, [`crate::api::source`]; going passive forgets
//! what it had delivered). A pod that must end (deleted, terminal, completed, an orphan) gets
//! no worker: the kubelet ends it. At a takeover the source lists the node's pods (from the
//! watch cache) and every deleted pod whose object is still there is ended at once; the next
//! relist ends terminal pods and orphans that still run: what is gone costs nothing. A worker parked on a held kill (a hand-back in the middle of its termination) is
//! released when its pod is gone from the sources and the runtime.
//!
//! # Race analysis: never both agents acting on one pod
//!
//! reaplet stops a container only through a kill that [`Authority::check`] allowed at the moment
//! the kill started (every kill attempt and every retry consults it; the leftover sweeps check
//! [`Authority::is_active`] too). So:
//!
//! * while the kubelet is alive by either signal, reaplet starts no kill: both agents never
//!   start on the same pod while the kubelet is up;
//! * a takeover needs a recent Lease read showing it unrenewed for the threshold (40 s, four
//!   missed renewals) and the local endpoint failing on three probes in a row up to that
//!   evaluation. A kubelet that is wedged yet answers
//!   `/healthz`, or dead for the API yet alive locally, keeps reaplet passive. What is *not*
//!   excluded: a kubelet that stops renewing and answering for 40 s and then resumes work
//!   without renewing first (its pod workers run independently of its Lease loop), or, in auto
//!   mode, a kubelet that starts working before its first renewal after reaplet started active
//!   on a missing Lease (a kubelet registering for the first time). In that window both may act on a pod; both
//!   then act the same way (the same grace, StopContainer is idempotent, the status write is
//!   guarded by the pod's UID and the delete by its UID precondition), so the outcome is one
//!   termination, reported once or twice. The window ends at the kubelet's first renewal: a
//!   crash-looping kubelet that answers `/healthz` between crashes but never renews keeps
//!   reaplet active (no flapping), and one that does renew is handed the node;
//! * at a takeover, [`Authority::set_active`]`(true)` also wakes the kills held by the
//!   authority check (a held kill parks, with no retry timer, until the authority turns on), so
//!   they retry at once: that is when reaplet starts acting, no sooner than the takeover itself
//!   (one threshold after the last renewal seen), so the bounds above hold for them too;
//! * hand-back: as soon as a renewal after the takeover is seen (at most one poll period after
//!   it happened), [`Authority::set_active`]`(false)`: no new kill and no retry starts. A kill
//!   already in flight is not cut: it runs to its end (its CRI calls return, then its status
//!   write and delete), the safe point; it is never abandoned between StopContainer and the
//!   status write of the same pod. For that pod, the kubelet may overlap with the rest of this
//!   one kill (the same idempotent steps as above). Pods not yet in a kill are left to the
//!   kubelet.
//!
//! The volumes the kubelet mounted: while active, the terminated stage tears down node-local
//! ones itself and waits for the rest ([`crate::volumes::teardown`]); it asks the authority
//! before every pass, so a hand-back mid-cleanup leaves the rest to the kubelet (unmounting is
//! idempotent for both: EINVAL and ENOENT mean done).

use std::time::Duration;
use tokio::time::Instant;

mod healthz;
pub mod lease;
pub mod marker;
mod run;

pub use healthz::{probe, probe_endpoint};
pub use run::{LEASE_BACKOFF_MAX, NodeApi, START_TIMEOUT, Started, begin, read_needed, run, start};

/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The kubelet's health endpoint (`--healthz-port` 10248).
pub const DEFAULT_HEALTHZ_URL: &str = "http://127.0.0.1:10248/healthz";
/// The node lifecycle controller's `nodeMonitorGracePeriod`.
pub const DEFAULT_TAKEOVER_AFTER: Duration = Duration::from_secs(40);

/// `--authority`: the configured mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthoritySetting {
    Primary,
    Standby,
    Auto,
}

impl AuthoritySetting {
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "primary" => Some(Self::Primary),
            "standby" => Some(Self::Standby),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Standby => "standby",
            Self::Auto => "auto",
        }
    }
}

/// The mode reaplet runs in after start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Primary,
    Standby,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "primary",
            Self::Standby => "standby",
        }
    }
}

/// This node's Lease as seen once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAtStart {
    /// It exists and was renewed within the threshold: a kubelet holds it.
    Fresh,
    /// It exists, last renewed longer ago than the threshold (or never).
    Stale,
    Missing,
    /// The API did not answer.
    Unknown,
}

/// The kubelet's health endpoint, last probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Ok,
    /// An error status or a timeout.
    Failed,
    /// Nothing listens: the process is gone.
    Gone,
    /// The kubelet serves no health endpoint (`healthzPort: 0`): nothing is probed, and that
    /// is no failure: the Lease alone decides.
    Disabled,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::Gone => "not listening",
            Self::Disabled => "disabled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Kills (the [`Authority`] allows them).
    Active,
    /// Watches and tracks, kills nothing.
    Passive,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Passive => "passive",
        }
    }
}

/// Why reaplet is in its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `--authority=primary`.
    ConfiguredPrimary,
    /// No API client: static manifests only, nobody else to defer to.
    NoApi,
    /// Auto: no Lease for this node at start (active until a renewal is seen).
    NoLeaseAtStart,
    /// Auto: the Lease was stale at start (active until a renewal is seen).
    StaleLeaseAtStart,
    /// `--authority=standby`, not yet evaluated.
    ConfiguredStandby,
    /// Auto: a kubelet held the Lease at start (standby, not yet evaluated).
    LeaseHeldAtStart,
    /// Auto: the Lease could not be read at start (standby, not yet evaluated).
    LeaseUnknownAtStart,
    /// Auto, a warning: no Lease, but a Node object under this name: a kubelet registered
    /// under another name (or not yet): passive.
    NodeWithoutLease,
    /// Auto, a warning: neither a Lease nor a Node object under this name, but something
    /// answers on the kubelet's health endpoint: a kubelet registered under another name.
    NoNodeKubeletAnswers,
    /// Auto, a warning: no Lease, and the Node object could not be read: passive.
    NodeUnknownAtStart,
    /// Standby, passive at start: reaplet was the acting agent before it restarted (in this
    /// boot) and the Lease carries the `renewTime` it last saw: the loop takes over again on
    /// the takeover's proof, the Lease's age known from before the restart.
    ResumingAfterRestart,
    /// Standby, active: reaplet was the acting agent before it restarted and the takeover's
    /// proof holds again (active until a renewal is seen).
    ActiveBeforeRestart,
    /// Standby: the Lease is renewed and the endpoint answers.
    KubeletAlive,
    /// Standby, a warning: the Lease is stale but the endpoint answers.
    LeaseStale,
    /// Standby, a warning: the endpoint fails but the Lease is renewed.
    HealthzFailing,
    /// Standby, a warning: the endpoint fails and the Lease was not read lately (the API down
    /// or refusing): no takeover on the endpoint alone.
    LeaseUnread,
    /// Standby, a warning: the Lease is stale and the endpoint fails, not yet on
    /// [`FAILED_PROBES_TO_TAKE_OVER`] probes in a row.
    KubeletMayBeGone,
    /// Standby, active: the Lease is stale (not renewed since the takeover) and the endpoint
    /// fails.
    KubeletGone,
    /// Standby, a warning: both signals say the kubelet is gone, but the consistent read of
    /// the Lease or the read of the Node failed: no takeover without them (tried again).
    TakeoverUnconfirmed,
    /// Standby, a warning: the kubelet looks gone but its Lease does not exist (deleted, or a
    /// kubelet under another name): no takeover.
    LeaseMissing,
    /// Standby, a warning: the kubelet looks gone but no Node object exists under reaplet's
    /// node name (a wrong name, or a deleted node): no takeover.
    NodeMissing,
    /// Standby, active, a warning: the endpoint answers again but the Lease has not been renewed
    /// since reaplet became active (a crash-looping kubelet): still active until it renews.
    HealthzBackNoRenewal,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfiguredPrimary => "configured primary",
            Self::NoApi => "no API: static manifests only",
            Self::NoLeaseAtStart => {
                "no kubelet held the node Lease at start: active until the Lease is renewed"
            }
            Self::StaleLeaseAtStart => {
                "the node Lease was stale at start: standby, the start counting as its last renewal"
            }
            Self::ConfiguredStandby => "configured standby",
            Self::LeaseHeldAtStart => "a kubelet held the node Lease at start",
            Self::LeaseUnknownAtStart => "the node Lease could not be read at start",
            Self::NodeWithoutLease => {
                "no node Lease under this node name but a Node object: a kubelet registered \
                 under another name, or not yet? passive (check the node name)"
            }
            Self::NoNodeKubeletAnswers => {
                "no node Lease and no Node object under this node name, but a kubelet answers \
                 healthz: registered under another name? passive (check the node name)"
            }
            Self::NodeUnknownAtStart => {
                "no node Lease, and the Node object could not be read: passive"
            }
            Self::ResumingAfterRestart => {
                "active before the restart in this boot, the node Lease unrenewed since: \
                 passive until the kubelet is proved gone again"
            }
            Self::ActiveBeforeRestart => {
                "resumed as the node's agent: active before the restart, the node Lease still \
                 stale and the kubelet's healthz failing (active until the Lease is renewed)"
            }
            Self::KubeletAlive => "standby: the kubelet renews its Lease and answers healthz",
            Self::LeaseStale => {
                "standby: the node Lease is stale but the kubelet answers healthz (warning)"
            }
            Self::HealthzFailing => {
                "standby: the kubelet's healthz fails but its Lease is renewed (warning)"
            }
            Self::LeaseUnread => {
                "standby: the kubelet's healthz fails and the node Lease could not be read \
                 lately: no takeover on the kubelet's health alone (warning)"
            }
            Self::KubeletMayBeGone => {
                "standby: the node Lease is stale and the kubelet's healthz fails, not yet on \
                 three probes in a row (warning)"
            }
            Self::KubeletGone => {
                "took over: the node Lease is read stale and the kubelet's healthz fails"
            }
            Self::TakeoverUnconfirmed => {
                "standby: the kubelet looks gone, but the consistent read of the node Lease or \
                 the read of the Node failed: no takeover without them (warning)"
            }
            Self::LeaseMissing => {
                "standby: the kubelet looks gone, but the node Lease does not exist: no \
                 takeover (a kubelet registered under another name?) (warning)"
            }
            Self::NodeMissing => {
                "standby: the kubelet looks gone, but no Node object exists under this node \
                 name: no takeover (check the node name) (warning)"
            }
            Self::HealthzBackNoRenewal => {
                "active: the kubelet answers healthz again but has not renewed its Lease since \
                 reaplet became active (warning; hand back at the first renewal)"
            }
        }
    }

    /// A warning worth a `warn` line (one signal alone).
    pub fn is_warning(self) -> bool {
        matches!(
            self,
            Self::LeaseStale
                | Self::HealthzFailing
                | Self::LeaseUnread
                | Self::KubeletMayBeGone
                | Self::HealthzBackNoRenewal
                | Self::NodeWithoutLease
                | Self::NoNodeKubeletAnswers
                | Self::NodeUnknownAtStart
                | Self::TakeoverUnconfirmed
                | Self::LeaseMissing
                | Self::NodeMissing
        )
    }

    /// A sign that reaplet's node name may not be the kubelet's: the
    /// `reaplet_node_identity_problem` it raises (a Node without its Lease; no Node under the
    /// name).
    pub fn identity_problem(self) -> Option<crate::metrics::IdentityProblem> {
        use crate::metrics::IdentityProblem;
        match self {
            Self::NodeWithoutLease | Self::LeaseMissing => Some(IdentityProblem::LeaseMissing),
            Self::NoNodeKubeletAnswers | Self::NodeMissing => Some(IdentityProblem::NodeMissing),
            _ => None,
        }
    }
}

/// A decision: the role and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub mode: Mode,
    pub role: Role,
    pub reason: Reason,
}

/// This node's Node object as seen once at start (read only when the Lease is missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAtStart {
    Exists,
    Missing,
    /// The API did not answer, or refused the read.
    Unknown,
    /// Not read (the Lease exists, or there is no API).
    NotRead,
}

/// The mode at start (pure): Auto is always standby (the loop runs); its role is passive when a
/// kubelet holds the Lease, it cannot be read or it is stale (a reboot), active when it is
/// missing, the Node missing too and nothing answering the kubelet's health endpoint (`health`,
/// probed only then; until a renewal is seen). Primary only for `--authority=primary` or
/// without an API.
///
/// `resuming`: reaplet was the acting agent before this start, in this boot, and the Lease still
/// carries the `renewTime` it last saw ([`marker`]): passive, [`Reason::ResumingAfterRestart`];
/// the loop takes over again on the takeover's proof.
pub fn start_mode(
    setting: AuthoritySetting,
    has_api: bool,
    lease: LeaseAtStart,
    node: NodeAtStart,
    health: Health,
    resuming: bool,
) -> Decision {
    let primary = |reason| Decision {
        mode: Mode::Primary,
        role: Role::Active,
        reason,
    };
    let standby = |reason| Decision {
        mode: Mode::Standby,
        role: Role::Passive,
        reason,
    };
    let standby_active = |reason| Decision {
        mode: Mode::Standby,
        role: Role::Active,
        reason,
    };
    if !has_api {
        return primary(Reason::NoApi);
    }
    // something listens on the kubelet's health endpoint (an answer, or an error status)
    let answers = matches!(health, Health::Ok | Health::Failed);
    match (setting, lease) {
        (AuthoritySetting::Primary, _) => primary(Reason::ConfiguredPrimary),
        (AuthoritySetting::Standby | AuthoritySetting::Auto, LeaseAtStart::Stale) if resuming => {
            standby(Reason::ResumingAfterRestart)
        }
        (AuthoritySetting::Standby, _) => standby(Reason::ConfiguredStandby),
        (AuthoritySetting::Auto, LeaseAtStart::Fresh) => standby(Reason::LeaseHeldAtStart),
        (AuthoritySetting::Auto, LeaseAtStart::Unknown) => standby(Reason::LeaseUnknownAtStart),
        (AuthoritySetting::Auto, LeaseAtStart::Missing) => match node {
            NodeAtStart::Exists => standby(Reason::NodeWithoutLease),
            NodeAtStart::Missing if answers => standby(Reason::NoNodeKubeletAnswers),
            NodeAtStart::Missing => standby_active(Reason::NoLeaseAtStart),
            NodeAtStart::Unknown | NodeAtStart::NotRead => standby(Reason::NodeUnknownAtStart),
        },
        // a node that rebooted: reaplet may read the Lease before the kubelet's first
        // renewal; the start counts as a renewal, so a dead kubelet is taken over from after
        // one threshold, by the standby rule
        (AuthoritySetting::Auto, LeaseAtStart::Stale) => standby(Reason::StaleLeaseAtStart),
    }
}

/// How many probes of the health endpoint in a row must fail for a takeover: one slow answer
/// or a kubelet restarting (a fraction of a second) is not a dead kubelet.
pub const FAILED_PROBES_TO_TAKE_OVER: u32 = 3;

/// What reaplet has seen of the two signals, for [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signals {
    /// When reaplet last saw the Lease renewed (monotonic, see the module doc; the start and
    /// the first read count as one).
    pub renewed: Instant,
    /// When the Lease was last read (`None`: never). Only a read can show the Lease stale: one
    /// that cannot be read (the API down, no permission) is not a stale Lease.
    pub read: Option<Instant>,
    /// The last probe of the health endpoint.
    pub health: Health,
    /// How many probes in a row have failed, the last one included (0 when it answered).
    pub failed_probes: u32,
}

/// The role in standby (pure): `threshold` is the takeover delay, `active_since` the current
/// role: `None` when passive, `Some(t)` when active since `t` (the takeover, or the start).
/// Primary is always active.
///
/// Passive: active only when a look at the Lease no older than [`lease::fresh_for`]
/// `threshold` (one of the kubelet's 10 s renewals by default, plus slack) saw it unrenewed for
/// longer than `threshold`, and the endpoint failed [`FAILED_PROBES_TO_TAKE_OVER`] probes in a
/// row (the caller then proves it, see [`proved`]). Active (hysteresis):
/// passive only when a renewal was seen after `t` (`renewed > t`), whatever the endpoint says;
/// the endpoint alone never hands back.
pub fn decide(
    mode: Mode,
    threshold: Duration,
    now: Instant,
    seen: Signals,
    active_since: Option<Instant>,
) -> Decision {
    if mode == Mode::Primary {
        return Decision {
            mode,
            role: Role::Active,
            reason: Reason::ConfiguredPrimary,
        };
    }
    let failing = matches!(seen.health, Health::Failed | Health::Gone);
    // no endpoint to probe: the Lease alone decides
    let disabled = seen.health == Health::Disabled;
    if let Some(since) = active_since {
        let (role, reason) = match (seen.renewed > since, failing, disabled) {
            // a renewal after the takeover: the kubelet is back, hand back
            (true, true, _) => (Role::Passive, Reason::HealthzFailing),
            (true, false, _) => (Role::Passive, Reason::KubeletAlive),
            (false, true, _) | (false, false, true) => (Role::Active, Reason::KubeletGone),
            (false, false, false) => (Role::Active, Reason::HealthzBackNoRenewal),
        };
        return Decision { mode, role, reason };
    }
    let read_lately = seen
        .read
        .filter(|r| now.saturating_duration_since(*r) <= lease::fresh_for(threshold));
    let Some(read) = read_lately else {
        let reason = match failing {
            true => Reason::LeaseUnread,
            false => Reason::KubeletAlive,
        };
        return Decision {
            mode,
            role: Role::Passive,
            reason,
        };
    };
    let stale = read.saturating_duration_since(seen.renewed) > threshold;
    let gone = disabled || seen.failed_probes >= FAILED_PROBES_TO_TAKE_OVER;
    let (role, reason) = match (stale, failing, gone) {
        (true, _, true) => (Role::Active, Reason::KubeletGone),
        // (disabled: `gone` above)
        (true, true, false) => (Role::Passive, Reason::KubeletMayBeGone),
        (true, false, _) => (Role::Passive, Reason::LeaseStale),
        (false, true, _) => (Role::Passive, Reason::HealthzFailing),
        (false, false, _) => (Role::Passive, Reason::KubeletAlive),
    };
    Decision { mode, role, reason }
}

/// What the takeover's proof found (see the module doc): the consistent read of the Lease,
/// then the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The Lease read consistently (and fed to the decision) and the Node exists.
    Holds,
    /// The consistent read found no Lease.
    LeaseMissing,
    /// No Node object under this name.
    NodeMissing,
    /// A read failed (not answered, refused, timed out).
    Failed,
}

/// The decision after the takeover's proof (pure): `d` is [`decide`]'s takeover, re-decided on
/// the consistent read; `resumed` whether the Lease's age came from before a restart.
pub fn proved(d: Decision, proof: Proof, resumed: bool) -> Decision {
    let passive = |reason| Decision {
        mode: d.mode,
        role: Role::Passive,
        reason,
    };
    match (d.role, proof) {
        // the consistent read showed a renewal: the re-decision is already passive
        (Role::Passive, _) => d,
        (Role::Active, Proof::Holds) if resumed => Decision {
            reason: Reason::ActiveBeforeRestart,
            ..d
        },
        (Role::Active, Proof::Holds) => d,
        (Role::Active, Proof::LeaseMissing) => passive(Reason::LeaseMissing),
        (Role::Active, Proof::NodeMissing) => passive(Reason::NodeMissing),
        (Role::Active, Proof::Failed) => passive(Reason::TakeoverUnconfirmed),
    }
}

/// What [`run`] needs.
#[derive(Debug, Clone)]
pub struct StandbyConfig {
    pub setting: AuthoritySetting,
    pub node_name: String,
    /// The kubelet's health endpoint (`None`: the kubelet serves none, `healthzPort: 0`).
    pub healthz_url: Option<String>,
    pub takeover_after: Duration,
    /// How often the Lease and the endpoint are looked at.
    pub poll: Duration,
    /// How long one healthz probe may take.
    pub probe_timeout: Duration,
    /// Where the role is remembered across restarts ([`marker`]; `None`: nowhere).
    pub marker: Option<std::path::PathBuf>,
}

impl StandbyConfig {
    pub fn new(node_name: &str) -> Self {
        Self {
            setting: AuthoritySetting::Auto,
            node_name: node_name.into(),
            healthz_url: Some(DEFAULT_HEALTHZ_URL.into()),
            takeover_after: DEFAULT_TAKEOVER_AFTER,
            poll: Duration::from_secs(2),
            probe_timeout: Duration::from_secs(1),
            marker: None,
        }
    }
}

#[cfg(test)]
mod tests;
