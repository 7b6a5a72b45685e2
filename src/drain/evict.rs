//! Evictions wave by wave through the Eviction API, with the operator's credentials: a wave's
//! pods together, each wave gone before the next; a 429 retried after the server's
//! `Retry-After` (else [`BLOCKED_RETRY`]) unless the plan knew the budget allows nothing;
//! Ctrl-C and `--timeout` stop issuing evictions at once.

use super::DrainError;
use super::plan::DrainPod;
use super::progress::{Progress, Row, State};
use crate::api;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Preconditions};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

/// kubectl's wait between eviction attempts a budget refused without a `Retry-After`.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(500);

/// Evicts `waves` one after another (a wave's pods together), each wave finished (its pods
/// gone) before the next. Returns the rows at the end. A pod in `budget_bound` (by UID, with
/// the budgets its eviction violates) is given up at its first 429: that budget allows no
/// disruption, and waiting cannot change what the plan already knew.
#[allow(clippy::too_many_arguments)]
pub(super) async fn evict_waves(
    client: &kube::Client,
    waves: Vec<Vec<DrainPod>>,
    budget_bound: &BTreeMap<String, Vec<String>>,
    grace_period: Option<i64>,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
    p: &mut Progress<'_>,
) -> (Vec<Row>, Option<DrainError>) {
    let now = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut wave_of = Vec::new();
    for (w, wave) in waves.into_iter().enumerate() {
        for pod in wave {
            wave_of.push(w);
            let state = if pod.terminating {
                State::Terminating
            } else {
                State::Waiting
            };
            rows.push(Row {
                pod,
                state,
                since: now,
                gone_after: None,
                next_try: now,
            });
        }
    }
    let waves_n = wave_of.iter().max().map_or(0, |m| m + 1);
    let left = |rows: &[Row]| -> Vec<String> {
        rows.iter()
            .filter(|r| r.state != State::Gone)
            .map(|r| r.pod.key.clone())
            .collect()
    };
    for w in 0..waves_n {
        loop {
            let now = Instant::now();
            if cancel.is_cancelled() {
                let l = left(&rows);
                return (rows, Some(DrainError::Interrupted { left: l }));
            }
            if deadline.is_some_and(|d| now >= d) {
                let l = left(&rows);
                return (
                    rows,
                    Some(DrainError::Timeout {
                        waited: p.start.elapsed(),
                        left: l,
                    }),
                );
            }
            let mut open = false;
            // this round's evictions, all at once (a wave's pods go together), raced against
            // Ctrl-C and the deadline: nothing is issued after either
            let mut due: Vec<usize> = Vec::new();
            let mut watching: Vec<usize> = Vec::new();
            for (i, r) in rows.iter_mut().enumerate() {
                if wave_of[i] != w {
                    continue;
                }
                match r.state {
                    State::Gone | State::Failed(_) => {}
                    State::Waiting | State::Evicting | State::Blocked(_) if r.next_try <= now => {
                        open = true;
                        if r.state == State::Waiting {
                            r.state = State::Evicting;
                            r.since = Instant::now();
                            p.change(r);
                        }
                        due.push(i);
                    }
                    State::Terminating => {
                        open = true;
                        watching.push(i);
                    }
                    _ => open = true,
                }
            }
            let calls = futures_util::future::join_all(
                due.iter()
                    .map(|&i| evict_one(client, &rows[i].pod, grace_period)),
            );
            let checks = futures_util::future::join_all(
                watching.iter().map(|&i| gone(client, &rows[i].pod)),
            );
            let until = deadline.map_or(far_future(), |d| d);
            let answers = tokio::select! {
                _ = cancel.cancelled() => None,
                _ = tokio::time::sleep_until(until) => None,
                r = async { tokio::join!(calls, checks) } => Some(r),
            };
            let Some((evicted, goneness)) = answers else {
                continue; // the checks at the top end it
            };
            for (&i, new) in due.iter().zip(evicted) {
                let r = &mut rows[i];
                let (state, retry) = match new {
                    Evicted::Accepted => (State::Terminating, POLL),
                    Evicted::Gone => (State::Gone, POLL),
                    Evicted::Blocked(m, _) if budget_bound.contains_key(&r.pod.uid) => {
                        let names = budget_bound[&r.pod.uid].join(", ");
                        let why = format!(
                            "evicting it violates PodDisruptionBudget {names}, which allows no \
                             disruption now: the Eviction API refuses it ({m}); not retried"
                        );
                        (State::Failed(why), POLL)
                    }
                    Evicted::Blocked(m, after) => (State::Blocked(m), after),
                    Evicted::Failed(m) => (State::Failed(m), POLL),
                };
                r.next_try = Instant::now() + retry;
                if state != r.state {
                    if state == State::Gone {
                        r.gone_after = Some(p.start.elapsed().as_secs_f64());
                    }
                    r.state = state;
                    r.since = Instant::now();
                    p.change(r);
                }
            }
            for (&i, is_gone) in watching.iter().zip(goneness) {
                let r = &mut rows[i];
                if is_gone {
                    r.state = State::Gone;
                    r.gone_after = Some(p.start.elapsed().as_secs_f64());
                    r.since = Instant::now();
                    p.change(r);
                }
            }
            p.table(&rows);
            if !open {
                break;
            }
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
    let failed: Vec<String> = rows
        .iter()
        .filter_map(|r| match &r.state {
            State::Failed(m) => Some(format!("{}: {m}", r.pod.key)),
            _ => None,
        })
        .collect();
    let err = (!failed.is_empty()).then(|| DrainError::Refused(failed.join("; ")));
    (rows, err)
}

enum Evicted {
    Accepted,
    Gone,
    Blocked(String, Duration),
    Failed(String),
}

/// `--grace-period` as the eviction's: negative is each pod's own (kubectl's -1).
pub fn eviction_grace(flag: Option<i64>) -> Option<u32> {
    flag.filter(|g| *g >= 0)
        .map(|g| u32::try_from(g).unwrap_or(u32::MAX))
}

async fn evict_one(client: &kube::Client, pod: &DrainPod, grace: Option<i64>) -> Evicted {
    let (ns, name) = pod.key.split_once('/').unwrap_or(("", &pod.key));
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    let ep = EvictParams {
        delete_options: Some(DeleteParams {
            grace_period_seconds: eviction_grace(grace),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    match api::evict(&api, name, &ep).await {
        Ok(_) => Evicted::Accepted,
        Err(e) => {
            let detail = e.detail();
            match e.code() {
                Some(404) => Evicted::Gone,
                Some(409) if e.api().is_some_and(api::precondition_failed) => Evicted::Gone,
                Some(429) => Evicted::Blocked(detail, e.retry_after().unwrap_or(BLOCKED_RETRY)),
                _ => Evicted::Failed(detail),
            }
        }
    }
}

/// Gone: not found, or a new pod under its name.
async fn gone(client: &kube::Client, pod: &DrainPod) -> bool {
    let (ns, name) = pod.key.split_once('/').unwrap_or(("", &pod.key));
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    match api::bounded(api.get_opt(name)).await {
        Ok(None) => true,
        Ok(Some(p)) => p.metadata.uid.as_deref() != Some(pod.uid.as_str()),
        Err(_) => false,
    }
}
