//! The `drain` and `make-room` commands against the API, with the operator's credentials.

use super::DrainError;
use super::plan::{self, DrainPod, Options, Plan};
use super::pods;
use super::preempt::{self, Resources};
use crate::api;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, Preconditions};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}

/// kubectl's wait between eviction attempts a budget refused without a `Retry-After`.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(500);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A live table redrawn in place (a terminal).
    Table,
    /// One line per change (not a terminal).
    Plain,
    /// One JSON document at the end.
    Json,
}

#[derive(Debug, Clone)]
pub struct DrainArgs {
    pub node: String,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub grace_period: Option<i64>,
    pub options: Options,
    pub output: Output,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Waiting,
    Evicting,
    Blocked(String),
    Terminating,
    Gone,
    Failed(String),
}

impl State {
    fn label(&self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Evicting => "evicting",
            State::Blocked(_) => "blocked",
            State::Terminating => "terminating",
            State::Gone => "gone",
            State::Failed(_) => "failed",
        }
    }
}

struct Row {
    pod: DrainPod,
    state: State,
    since: Instant,
    gone_after: Option<f64>,
    next_try: Instant,
}

struct Progress<'a> {
    out: &'a mut dyn Write,
    output: Output,
    start: Instant,
    drawn: usize,
}

impl<'a> Progress<'a> {
    fn new(out: &'a mut dyn Write, output: Output) -> Self {
        Progress {
            out,
            output,
            start: Instant::now(),
            drawn: 0,
        }
    }

    fn line(&mut self, s: &str) {
        if self.output != Output::Json {
            let _ = writeln!(self.out, "{s}");
        }
    }

    fn change(&mut self, row: &Row) {
        if self.output != Output::Plain {
            return;
        }
        let t = self.start.elapsed().as_secs_f64();
        let detail = match &row.state {
            State::Blocked(m) | State::Failed(m) => format!(": {m}"),
            _ => String::new(),
        };
        let _ = writeln!(
            self.out,
            "[{t:6.1}s] {:<12} {}{detail}",
            row.state.label(),
            row.pod.key
        );
    }

    /// The live table (a terminal only): redrawn in place.
    fn table(&mut self, rows: &[Row]) {
        if self.output != Output::Table {
            return;
        }
        let mut s = String::new();
        if self.drawn > 0 {
            s += &format!("\x1b[{}A", self.drawn);
        }
        let count = |l: &str| rows.iter().filter(|r| r.state.label() == l).count();
        s += &format!(
            "\x1b[2K{:6.1}s  waiting {}  evicting {}  blocked {}  terminating {}  gone {}\n",
            self.start.elapsed().as_secs_f64(),
            count("waiting"),
            count("evicting"),
            count("blocked"),
            count("terminating"),
            count("gone")
        );
        // one screen line per row, never wrapped (a wrapped line would break the redraw): cut to
        // the terminal's width (`$COLUMNS`, else 80), and at most 30 rows, unfinished first
        let width: usize = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(80)
            .max(20);
        let mut shown: Vec<&Row> = rows.iter().filter(|r| r.state != State::Gone).collect();
        shown.extend(rows.iter().filter(|r| r.state == State::Gone));
        shown.truncate(30);
        for r in &shown {
            let detail = match &r.state {
                State::Blocked(m) | State::Failed(m) => m.as_str(),
                _ => "",
            };
            let line = format!(
                "  {:<44} {:<12} {:>6.1}s  {detail}",
                r.pod.key,
                r.state.label(),
                r.since.elapsed().as_secs_f64()
            );
            let line: String = line.chars().take(width - 1).collect();
            s += &format!("\x1b[2K{line}\n");
        }
        self.drawn = shown.len() + 1;
        let _ = self.out.write_all(s.as_bytes());
        let _ = self.out.flush();
    }
}

fn print_plan(p: &mut Progress<'_>, plan: &Plan) {
    for (pod, skip) in &plan.skipped {
        let why = match skip {
            plan::Skip::DaemonSet => "DaemonSet-managed: ignored",
            plan::Skip::Mirror => "mirror of a static pod: left to the kubelet's manifest",
        };
        p.line(&format!("skip     {}: {why}", pod.key));
    }
    for (pod, r) in &plan.refused {
        p.line(&format!("refuse   {}: {}", pod.key, r.message()));
    }
    for (i, wave) in plan.waves.iter().enumerate() {
        let names: Vec<String> = wave
            .iter()
            .map(|d| format!("{} (priority {})", d.key, d.priority))
            .collect();
        p.line(&format!("wave {:>2}: {}", i + 1, names.join(", ")));
    }
}

async fn node_pods(client: &kube::Client, node: &str) -> Result<Vec<Pod>, DrainError> {
    let api: kube::Api<Pod> = kube::Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(api::bounded(api.list(&lp)).await?.items)
}

async fn get_node(client: &kube::Client, node: &str) -> Result<Node, DrainError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    match api::bounded(nodes.get(node)).await {
        Ok(n) => Ok(n),
        Err(e) if e.code() == Some(404) => Err(DrainError::NoNode(node.into())),
        Err(e) => Err(e.into()),
    }
}

async fn cordon(client: &kube::Client, node: &str) -> Result<(), DrainError> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    api::bounded(nodes.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
    ))
    .await?;
    Ok(())
}

/// Evicts `waves` one after another (a wave's pods together), each wave finished (its pods
/// gone) before the next. Returns the rows at the end. A pod in `budget_bound` (by UID, with
/// the budgets its eviction violates) is given up at its first 429: that budget allows no
/// disruption, and waiting cannot change what the plan already knew.
#[allow(clippy::too_many_arguments)]
async fn evict_waves(
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

fn summary_json(
    node: &str,
    plan: &Plan,
    rows: &[Row],
    err: Option<&DrainError>,
) -> serde_json::Value {
    serde_json::json!({
        "node": node,
        "skipped": plan.skipped.iter().map(|(p, s)| serde_json::json!({"pod": p.key, "why": format!("{s:?}")})).collect::<Vec<_>>(),
        "refused": plan.refused.iter().map(|(p, r)| serde_json::json!({"pod": p.key, "why": r.message()})).collect::<Vec<_>>(),
        "waves": plan.waves.iter().map(|w| w.iter().map(|p| p.key.clone()).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "pods": rows.iter().map(|r| serde_json::json!({
            "pod": r.pod.key, "state": r.state.label(), "goneAfterSeconds": r.gone_after,
            "detail": match &r.state { State::Blocked(m) | State::Failed(m) => Some(m.clone()), _ => None },
        })).collect::<Vec<_>>(),
        "error": err.map(|e| e.to_string()),
    })
}

/// `reaplet drain`.
pub async fn drain(
    client: kube::Client,
    a: DrainArgs,
    cancel: CancellationToken,
    out: &mut dyn Write,
) -> Result<(), DrainError> {
    let mut p = Progress::new(out, a.output);
    get_node(&client, &a.node).await?;
    if a.dry_run {
        p.line(&format!("node {} (dry run: not cordoned)", a.node));
    } else {
        cordon(&client, &a.node).await?;
        p.line(&format!("node {} cordoned", a.node));
    }
    let listed = node_pods(&client, &a.node).await?;
    let plan = plan::plan(pods::drain_pods(&listed), a.options);
    print_plan(&mut p, &plan);
    if !plan.refused.is_empty() {
        let why: Vec<String> = plan
            .refused
            .iter()
            .map(|(d, r)| format!("{} {}", d.key, r.message()))
            .collect();
        let e = DrainError::Refused(format!(
            "cannot drain: {}; nothing was evicted{}",
            why.join("; "),
            if a.dry_run {
                ""
            } else {
                " (the node stays cordoned)"
            }
        ));
        if a.output == Output::Json {
            let _ = writeln!(p.out, "{}", summary_json(&a.node, &plan, &[], Some(&e)));
        }
        return Err(e);
    }
    if a.dry_run {
        if a.output == Output::Json {
            let _ = writeln!(p.out, "{}", summary_json(&a.node, &plan, &[], None));
        }
        return Ok(());
    }
    let deadline = a.timeout.map(|t| Instant::now() + t);
    let (rows, err) = evict_waves(
        &client,
        plan.waves.clone(),
        &BTreeMap::new(),
        a.grace_period,
        deadline,
        &cancel,
        &mut p,
    )
    .await;
    if a.output == Output::Json {
        let _ = writeln!(
            p.out,
            "{}",
            summary_json(&a.node, &plan, &rows, err.as_ref())
        );
    } else if err.is_none() {
        p.line(&format!(
            "node {} drained: {} pods evicted in {:.1} s",
            a.node,
            rows.len(),
            p.start.elapsed().as_secs_f64()
        ));
    }
    err.map_or(Ok(()), Err)
}

/// What `make-room` asks for.
#[derive(Debug, Clone)]
pub struct RoomArgs {
    pub node: String,
    pub request: Resources,
    pub priority: i32,
    pub dry_run: bool,
    pub timeout: Option<Duration>,
    pub output: Output,
}

/// `reaplet make-room`.
pub async fn make_room(
    client: kube::Client,
    a: RoomArgs,
    cancel: CancellationToken,
    out: &mut dyn Write,
) -> Result<(), DrainError> {
    let mut p = Progress::new(out, a.output);
    let node = get_node(&client, &a.node).await?;
    let listed: Vec<Pod> = node_pods(&client, &a.node)
        .await?
        .into_iter()
        // finished pods free their share; pods already leaving count as gone (the scheduler
        // does not preempt again for them either)
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
        })
        .collect();
    let pdbs: kube::Api<PodDisruptionBudget> = kube::Api::all(client.clone());
    let budgets: Vec<_> = api::bounded(pdbs.list(&ListParams::default()))
        .await?
        .items
        .iter()
        .map(pods::budget)
        .collect();
    let candidates: Vec<_> = listed.iter().map(pods::candidate).collect();
    let by_uid: BTreeMap<String, &Pod> = listed
        .iter()
        .map(|p| (p.metadata.uid.clone().unwrap_or_default(), p))
        .collect();
    let plan = preempt::select(
        a.request,
        a.priority,
        pods::allocatable(&node),
        &candidates,
        &budgets,
    );
    let victims = match plan {
        preempt::Plan::FitsAlready => {
            p.line("the request fits already: nothing to evict");
            return Ok(());
        }
        preempt::Plan::Impossible { short } => {
            return Err(DrainError::Impossible(format!(
                "cpu {}m, memory {} bytes, pods {}",
                short.cpu_milli, short.memory, short.pods
            )));
        }
        preempt::Plan::Victims(v) => v,
    };
    for v in &victims {
        let why = if v.violates.is_empty() {
            format!("priority {} < {}", v.pod.priority, a.priority)
        } else {
            format!(
                "priority {} < {}; violates budget {} (the Eviction API will refuse it while \
                 the budget allows no disruption: make-room then stops, exit 1)",
                v.pod.priority,
                a.priority,
                v.violates.join(", ")
            )
        };
        p.line(&format!(
            "victim   {}/{}: {why}",
            v.pod.namespace, v.pod.key
        ));
    }
    if a.output == Output::Json {
        let v: Vec<serde_json::Value> = victims
            .iter()
            .map(|v| {
                serde_json::json!({"pod": format!("{}/{}", v.pod.namespace, v.pod.key),
                    "priority": v.pod.priority, "violates": v.violates})
            })
            .collect();
        let _ = writeln!(
            p.out,
            "{}",
            serde_json::json!({"node": a.node, "victims": v, "dryRun": a.dry_run})
        );
    }
    if a.dry_run {
        return Ok(());
    }
    let wave: Vec<DrainPod> = victims
        .iter()
        .filter_map(|v| by_uid.get(&v.pod.uid))
        .map(|pod| pods::drain_pods(std::slice::from_ref(*pod)).remove(0))
        .collect();
    let deadline = a.timeout.map(|t| Instant::now() + t);
    let budget_bound: BTreeMap<String, Vec<String>> = victims
        .iter()
        .filter(|v| !v.violates.is_empty())
        .map(|v| (v.pod.uid.clone(), v.violates.clone()))
        .collect();
    let (_, err) = evict_waves(
        &client,
        vec![wave],
        &budget_bound,
        None,
        deadline,
        &cancel,
        &mut p,
    )
    .await;
    err.map_or(Ok(()), Err)
}
