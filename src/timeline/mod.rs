//! Per-pod termination timelines: every step a pod worker takes to end a pod, with when it
//! took it. The kubelet has no counterpart: it leaves scattered log lines at verbosity 4 and,
//! since KEP-2831, OTLP spans of its CRI calls; this is the one record of a termination that
//! `reaplet pods --timeline` prints as text, JSON or an SVG chart ([`text`], [`svg`]).
//!
//! Invariants:
//! * a timeline starts when the worker first sees a reason to end its pod and counts from that
//!   moment on the monotonic clock (offsets in ms); the wall clock is read once, at the start,
//!   for the reader (and to place the runtime's own timestamps, such as a container's
//!   `finishedAt`, on the same axis);
//! * each step is a typed [`Step`]; what a step means is decided by its variant, never by text;
//! * recording never blocks a termination: a push under a std mutex held for no await, and a
//!   timeline holds at most [`MAX_ENTRIES`] steps (a retry storm is cut, and says so);
//! * the store keeps every pod still terminating and the last `keep` finished ones
//!   (`terminationTimelines`, a setting); the oldest finished one rolls off first. Steps that
//!   come after the worker finished (the status manager's status and delete) still land in
//!   the pod's timeline while it is kept.

pub mod svg;
pub mod text;

use crate::pod::PodUid;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// Steps kept per timeline; past it, one [`Step::Truncated`] and nothing more.
pub const MAX_ENTRIES: usize = 512;

/// How far the runtime's wall-clock exit time and the timeline's monotonic offsets may
/// disagree when an exit is placed.
const CLOCK_SKEW_MS: f64 = 100.0;

/// The default number of finished timelines kept (`terminationTimelines`).
pub const DEFAULT_KEEP: usize = 100;

pub use crate::terminating::grace::GraceSource;

/// How a StopContainer was sent ([`crate::terminating::records::StopStart`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopKind {
    /// A first stop: SIGTERM, SIGKILL when its timeout runs out.
    Fresh,
    /// Continuing a stop the runtime already took (an earlier life of reaplet, a failed
    /// attempt): no new SIGTERM is owed, SIGKILL on its recorded deadline.
    Continued,
    /// A stop never answered, sent again as SIGTERM with the 2 s floor.
    Resent,
}

/// One step of a termination. Container steps carry the container's name in [`Entry`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "camelCase")]
pub enum Step {
    /// A reason to end the pod was seen (the first starts the timeline).
    #[serde(rename_all = "camelCase")]
    Reason {
        reason: Cow<'static, str>,
        /// What asked: `api`, an eviction source, `node` (a request of reaplet's own), ...
        source: Cow<'static, str>,
        /// The pod's effective grace after it, and where that came from.
        grace: i64,
        grace_from: GraceSource,
        /// A free-form detail (a requested kill's message).
        #[serde(skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// A kill attempt started (the first, a retry, or a shorter grace restarting it).
    #[serde(rename_all = "camelCase")]
    KillStarted {
        attempt: u64,
        grace: i64,
    },
    /// The attempt failed; the worker retries after its backoff.
    KillFailed {
        error: String,
    },
    /// The kill was held: this agent is in standby.
    KillHeld,
    PreStopStarted,
    PreStopEnded {
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// StopContainer sent: SIGTERM (unless `timeout` is 0: SIGKILL at once).
    StopSent {
        timeout: i64,
        kind: StopKind,
    },
    /// The runtime answered the stop with an error.
    StopFailed {
        error: String,
    },
    /// The stop's timeout ran out before the container exited: the runtime sent SIGKILL
    /// (read from the exit: code 137 at or after the timeout, at the runtime's `finishedAt`).
    Sigkill,
    /// The container exited, at the runtime's `finishedAt`.
    #[serde(rename_all = "camelCase")]
    Exited {
        code: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        signal: Option<Cow<'static, str>>,
        /// Whether it had exited before this timeline began (on its own, or, for a
        /// termination resumed after a restart of reaplet, in its earlier life).
        before_kill: bool,
    },
    SandboxStopped {
        sandbox: String,
    },
    /// Every container and sandbox stopped; the terminal status may go out.
    ContainersStopped,
    VolumesStarted,
    /// The volumes are gone (or were skipped past `volumeUnmountTimeout`).
    VolumesDone {
        ok: bool,
    },
    #[serde(rename_all = "camelCase")]
    CgroupRemoved {
        removed_dirs: usize,
        killed_pids: usize,
    },
    /// The pod worker is done with the pod.
    Finished,
    /// The terminal status patch, with the API server's answer.
    StatusWritten {
        code: u16,
    },
    /// The DELETE with the UID precondition, with the API server's answer.
    ObjectDeleted {
        code: u16,
    },
    /// [`MAX_ENTRIES`] reached: later steps were not kept.
    Truncated,
}

/// One recorded step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Milliseconds since the timeline started.
    pub at_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(flatten)]
    pub step: Step,
}

/// One pod's termination.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// When the first reason to end the pod was seen (RFC 3339, UTC).
    pub started_at: String,
    /// The same, in ns since the Unix epoch.
    pub started_unix_ns: i64,
    /// When the current attempt's grace runs out (ms from the start): a container's SIGKILL
    /// comes then, or up to the 2 s floor later after a long preStop hook.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<f64>,
    /// When the pod worker finished (ms from the start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<f64>,
    pub entries: Vec<Entry>,
    #[serde(skip)]
    start: Option<Instant>,
}

impl Timeline {
    fn new(uid: &PodUid, namespace: &str, name: &str) -> Self {
        let ns = crate::wall_ns();
        Self {
            uid: uid.to_string(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            started_at: crate::status::rfc3339(ns),
            started_unix_ns: ns,
            deadline_ms: None,
            finished_ms: None,
            entries: Vec::new(),
            start: Some(Instant::now()),
        }
    }

    /// A timeline read back from its JSON (`reaplet pods --timeline` on the agent's answer).
    pub fn from_json(v: serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(v)
    }

    fn offset_ms(&self, at: Instant) -> f64 {
        self.start
            .map_or(0.0, |s| at.saturating_duration_since(s).as_secs_f64() * 1e3)
    }

    fn push(&mut self, at_ms: f64, container: Option<&str>, step: Step) {
        if self.entries.len() >= MAX_ENTRIES {
            return;
        }
        let step = if self.entries.len() + 1 == MAX_ENTRIES {
            Step::Truncated
        } else {
            step
        };
        // in time order (a runtime's exit time can land before steps recorded earlier)
        let pos = self.entries.partition_point(|e| e.at_ms <= at_ms);
        self.entries.insert(
            pos,
            Entry {
                at_ms,
                container: container.map(str::to_owned),
                step,
            },
        );
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The last moment anything happened (ms), for scaling a chart.
    pub fn span_ms(&self) -> f64 {
        let last = self.entries.iter().map(|e| e.at_ms).fold(0.0, f64::max);
        last.max(self.deadline_ms.unwrap_or(0.0))
            .max(self.finished_ms.unwrap_or(0.0))
    }
}

/// Where a worker and its kill record steps; cheap to clone. A [`Recorder::none`] records
/// nothing (a kill outside a pod worker).
#[derive(Debug, Clone, Default)]
pub struct Recorder(Option<Arc<Mutex<Timeline>>>);

impl Recorder {
    pub fn none() -> Self {
        Self(None)
    }

    /// Whether this records anywhere (a timeline was started).
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Timeline) -> T) -> Option<T> {
        let t = self.0.as_ref()?;
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        Some(f(&mut t))
    }

    /// Records `step` now.
    pub fn record(&self, container: Option<&str>, step: Step) {
        let now = Instant::now();
        self.with(|t| {
            let at = t.offset_ms(now);
            t.push(at, container, step)
        });
    }

    /// Records `step` at `at` (an earlier moment on the monotonic clock).
    pub fn record_at(&self, at: Instant, container: Option<&str>, step: Step) {
        self.with(|t| {
            let ms = t.offset_ms(at);
            t.push(ms, container, step)
        });
    }

    /// Records `step` at a wall-clock time from the runtime (ns since the epoch), placed on
    /// the timeline's axis; before the start counts as the start.
    pub fn record_at_wall(&self, unix_ns: i64, container: Option<&str>, step: Step) {
        self.with(|t| {
            let ms = (unix_ns.saturating_sub(t.started_unix_ns) as f64 / 1e6).max(0.0);
            t.push(ms, container, step)
        });
    }

    /// Container `name` exited with `code` at the runtime's `finished_ns` (once per
    /// container: a later attempt reading the same exit adds nothing).
    pub fn record_exit(&self, name: &str, finished_ns: i64, code: i32) {
        self.with(|t| {
            let seen = t.entries.iter().any(|e| {
                e.container.as_deref() == Some(name) && matches!(e.step, Step::Exited { .. })
            });
            if seen || finished_ns <= 0 {
                return;
            }
            let ms = (finished_ns.saturating_sub(t.started_unix_ns) as f64 / 1e6).max(0.0);
            // SIGKILLed at its stop's timeout: exit 137 no earlier than the last stop's
            // timeout ran out (within the two clocks' skew)
            let sigkill = t
                .entries
                .iter()
                .rev()
                .find_map(|e| match e.step {
                    Step::StopSent { timeout, .. } if e.container.as_deref() == Some(name) => {
                        Some((e.at_ms, timeout))
                    }
                    _ => None,
                })
                .filter(|(_, timeout)| *timeout > 0 && code == 137)
                .map(|(at, timeout)| at + timeout as f64 * 1e3)
                .filter(|at| ms >= at - CLOCK_SKEW_MS);
            if let Some(at) = sigkill {
                t.push(at, Some(name), Step::Sigkill);
            }
            let step = Step::Exited {
                code,
                signal: signal_of(code).map(Cow::Borrowed),
                before_kill: finished_ns < t.started_unix_ns,
            };
            t.push(ms, Some(name), step)
        });
    }

    /// The current attempt SIGKILLs by `at`.
    pub fn deadline(&self, at: Instant) {
        self.with(|t| t.deadline_ms = Some(t.offset_ms(at)));
    }

    /// A copy of what is recorded so far.
    pub fn snapshot(&self) -> Option<Timeline> {
        self.with(|t| t.clone())
    }
}

/// Every pod still terminating and the last `keep` finished ones.
#[derive(Debug)]
pub struct Timelines {
    store: Mutex<Store>,
    keep: usize,
}

#[derive(Debug, Default)]
struct Store {
    active: HashMap<PodUid, Arc<Mutex<Timeline>>>,
    finished: VecDeque<(PodUid, Arc<Mutex<Timeline>>)>,
    /// The termination's root trace span, open until the API is done with the pod
    /// ([`Timelines::end_trace`]), with when its worker finished (an open one is closed
    /// [`TRACE_LINGER`] after that at the latest).
    traces: HashMap<PodUid, (tracing::Span, Option<Instant>)>,
}

/// How long a finished termination's trace stays open for its API writes at most.
pub const TRACE_LINGER: std::time::Duration = std::time::Duration::from_secs(60);

/// The target of the termination's trace spans: exported over OTLP ([`crate::otel`]), never
/// in the logs ([`crate::logs`]).
pub const TRACE_TARGET: &str = "reaplet::trace";

/// What `reaplet pods --timeline` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Uid(String),
    Name { namespace: String, name: String },
}

impl Query {
    /// `NAMESPACE/NAME`, else a UID.
    pub fn parse(s: &str) -> Self {
        match s.split_once('/') {
            Some((ns, name)) => Self::Name {
                namespace: ns.to_owned(),
                name: name.to_owned(),
            },
            None => Self::Uid(s.to_owned()),
        }
    }

    fn matches(&self, t: &Timeline) -> bool {
        match self {
            Self::Uid(u) => &t.uid == u,
            Self::Name { namespace, name } => &t.namespace == namespace && &t.name == name,
        }
    }
}

impl Timelines {
    pub fn new(keep: usize) -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::new(Store::default()),
            keep,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The timeline of `uid`'s termination: a new one, or the one already running (a worker
    /// restarted after a panic continues it).
    pub fn start(&self, uid: &PodUid, namespace: &str, name: &str) -> Recorder {
        let mut s = self.lock();
        let t = s
            .active
            .entry(uid.clone())
            .or_insert_with(|| Arc::new(Mutex::new(Timeline::new(uid, namespace, name))));
        Recorder(Some(t.clone()))
    }

    /// `uid`'s termination's root trace span (one `pod_termination` per termination).
    pub fn open_trace(&self, uid: &PodUid, span: tracing::Span) {
        let old = self.lock().traces.insert(uid.clone(), (span, None));
        drop(old); // a span ends outside the store's lock
    }

    /// `uid`'s root trace span while it is open: the parent of the API writes that end it.
    pub fn trace(&self, uid: &PodUid) -> Option<tracing::Span> {
        self.lock().traces.get(uid).map(|(s, _)| s.clone())
    }

    /// Nothing more belongs to `uid`'s trace: its root span closes (and is exported).
    pub fn end_trace(&self, uid: &PodUid) {
        let span = self.lock().traces.remove(uid);
        drop(span);
    }

    /// `uid`'s worker finished: its timeline joins the finished ones, the oldest past `keep`
    /// rolls off.
    pub fn finish(&self, uid: &PodUid) {
        let mut s = self.lock();
        let now = Instant::now();
        if let Some((_, finished)) = s.traces.get_mut(uid) {
            *finished = Some(now);
        }
        let lingering: Vec<PodUid> = s
            .traces
            .iter()
            .filter(|(_, (_, f))| f.is_some_and(|f| now.duration_since(f) >= TRACE_LINGER))
            .map(|(u, _)| u.clone())
            .collect();
        let mut ended = Vec::with_capacity(lingering.len());
        for u in lingering {
            ended.extend(s.traces.remove(&u));
        }
        let Some(t) = s.active.remove(uid) else {
            drop(s);
            drop(ended); // spans end outside the store's lock
            return;
        };
        {
            let mut tl = t.lock().unwrap_or_else(|e| e.into_inner());
            let at = tl.offset_ms(Instant::now());
            tl.finished_ms = Some(at);
            tl.push(at, None, Step::Finished);
        }
        s.finished.push_back((uid.clone(), t));
        while s.finished.len() > self.keep {
            s.finished.pop_front();
        }
        drop(s);
        drop(ended); // spans end outside the store's lock
    }

    /// `uid`'s termination was another agent's (standby released its worker): its timeline
    /// and its trace are dropped, not kept among the finished ones.
    pub fn discard(&self, uid: &PodUid) {
        let mut s = self.lock();
        s.active.remove(uid);
        let span = s.traces.remove(uid);
        drop(s);
        drop(span); // a span ends outside the store's lock
    }

    /// Records `step` in `uid`'s timeline, terminating or finished (the status manager's
    /// writes come after the worker finished); nothing when none is kept.
    pub fn record(&self, uid: &PodUid, step: Step) {
        let t = {
            let s = self.lock();
            s.active.get(uid).cloned().or_else(|| {
                s.finished
                    .iter()
                    .rev()
                    .find(|(u, _)| u == uid)
                    .map(|(_, t)| t.clone())
            })
        };
        if let Some(t) = t {
            Recorder(Some(t)).record(None, step);
        }
    }

    /// The newest timeline `q` names: one still terminating first, else the newest finished.
    /// Copies that one timeline only (the store may keep 100000).
    pub fn find(&self, q: &Query) -> Option<Timeline> {
        let read = |t: &Arc<Mutex<Timeline>>| t.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (active, finished): (Vec<_>, Vec<_>) = {
            let s = self.lock();
            (
                s.active.values().cloned().collect(),
                s.finished.iter().map(|(_, t)| t.clone()).collect(),
            )
        };
        let mut found: Option<Timeline> = None;
        for t in &active {
            let t = t.lock().unwrap_or_else(|e| e.into_inner());
            let newer = found
                .as_ref()
                .is_none_or(|f| t.started_unix_ns >= f.started_unix_ns);
            if q.matches(&t) && newer {
                found = Some(t.clone());
            }
        }
        found.or_else(|| {
            finished.iter().rev().find_map(|t| {
                let m = q.matches(&t.lock().unwrap_or_else(|e| e.into_inner()));
                m.then(|| read(t))
            })
        })
    }

    /// Every kept timeline, finished ones oldest first, then those still terminating (by
    /// start).
    pub fn all(&self) -> Vec<Timeline> {
        let (finished, mut active): (Vec<_>, Vec<_>) = {
            let s = self.lock();
            (
                s.finished.iter().map(|(_, t)| t.clone()).collect(),
                s.active.values().cloned().collect(),
            )
        };
        let read = |t: &Arc<Mutex<Timeline>>| t.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out: Vec<Timeline> = finished.iter().map(read).collect();
        active.sort_by_key(|t| t.lock().unwrap_or_else(|e| e.into_inner()).started_unix_ns);
        out.extend(active.iter().map(read));
        out
    }
}

/// The signal an exit code of 128+N names, for the common ones.
pub fn signal_of(exit_code: i32) -> Option<&'static str> {
    Some(match exit_code - 128 {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        15 => "SIGTERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
