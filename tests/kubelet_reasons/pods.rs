//! The test pods: what they do once their gate opens, the bystanders, the victims' priority
//! classes.

use super::*;

/// Creates the PriorityClass `name` of `value`, and waits (bounded) until the API server's
/// admission sees it: its Priority plugin reads classes from an informer, and a pod created
/// right after the class was once refused (403 "no PriorityClass with name … was found").
pub(crate) async fn priority_class(n: &KubeNode, name: &str, value: i64) {
    n.cluster
        .must(
            "POST",
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            Some(&json!({
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            })),
        )
        .await;
    let mut probe = pod(&format!("probe-{name}"), 1, "true");
    probe["spec"]["priorityClassName"] = json!(name);
    let t0 = Instant::now();
    loop {
        let (code, v) = n
            .cluster
            .raw(
                "POST",
                "/api/v1/namespaces/default/pods?dryRun=All",
                None,
                Some(&probe),
            )
            .await;
        if (200..300).contains(&code) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "admission does not see PriorityClass {name} after 30 s: {code} {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a test pod does, once its gate (`<name>` on the [`Gate`]) opens.
#[derive(Clone, Copy)]
pub(crate) enum Work {
    /// Nothing: it sleeps.
    Idle,
    /// Takes this many bytes of memory (from the start when the pod is not gated) and keeps
    /// them until it ends.
    Memory(u64),
    /// Starts this many processes, each sleeping.
    Fork(u32),
}

/// A BestEffort pod that does `work` after its gate opens (or at once when not `gated`), then
/// sleeps. On SIGTERM it asks the gate for `<name>-term` (when it got the signal), then exits
/// 0 (`exits_on_term`) or goes on sleeping (only SIGKILL ends it).
pub(crate) fn worker(
    gate: &Gate,
    name: &str,
    work: Work,
    gated: bool,
    exits_on_term: bool,
) -> Value {
    let addr = gate.addr;
    let term = format!("wget -q -O /dev/null http://{addr}/{name}-term");
    let on_term = if exits_on_term {
        format!("{term}; exit 0")
    } else {
        term
    };
    let wait = if gated {
        format!("until wget -q -O /dev/null http://{addr}/{name}; do sleep 0.1; done; ")
    } else {
        String::new()
    };
    let work = match work {
        Work::Idle => String::new(),
        // tail keeps what it reads until its input ends; the sleep holds the input open, so
        // the memory stays taken until the pod is ended (without it, tail's exit frees it)
        Work::Memory(bytes) => {
            format!("(head -c {bytes} /dev/zero; sleep 3600) | tail >/dev/null & ")
        }
        Work::Fork(n) => {
            format!("i=0; while [ $i -lt {n} ]; do sleep 3600 & i=$((i+1)); done; ")
        }
    };
    let script =
        format!("trap '{on_term}' TERM; {wait}{work}while true; do sleep 3600 & wait $!; done");
    let mut p = pod(name, 30, &script);
    p["spec"]["terminationGracePeriodSeconds"] = json!(30);
    p
}

/// A gated BestEffort pod taking [`HOG_BYTES`].
pub(crate) fn hog(gate: &Gate, name: &str, exits_on_term: bool) -> Value {
    worker(gate, name, Work::Memory(HOG_BYTES), true, exits_on_term)
}

pub(crate) fn bystander(name: &str, guaranteed: bool) -> Value {
    let mut p = pod(name, 30, reaplet_testbed::TRAPS_TERM);
    let r = json!({"cpu": "10m", "memory": "64Mi"});
    p["spec"]["containers"][0]["resources"] = if guaranteed {
        json!({"requests": r, "limits": r})
    } else {
        json!({"requests": r})
    };
    p
}

/// Creates the tests' victims, `pods` in order of priority (10, 20, …: each agent's victims
/// are fixed whichever way the kubelet ranks), each with its SIGTERM record open at the gate.
pub(crate) async fn create_victims(n: &KubeNode, gate: &Gate, pods: Vec<Value>) {
    for (i, mut p) in pods.into_iter().enumerate() {
        let name = p["metadata"]["name"].as_str().expect("a name").to_owned();
        gate.open(&format!("{name}-term"));
        priority_class(n, &name, 10 * (i as i64 + 1)).await;
        p["spec"]["priorityClassName"] = json!(name);
        n.create(&p).await;
    }
}

/// The Burstable and the Guaranteed bystander, both of priority 1000 (above every pod the
/// tests mean to be evicted). The real kubelet's ranking on this test bed is intermittently
/// by priority alone: its eviction summary then carries no pod-level usage (every pod counts
/// as using 0 bytes, so none exceeds its request; measured in `ranking`, where its logged
/// order was [low, mid, guaranteed, grower]), and a bystander of priority 0 was evicted first
/// (3 of 6 runs of the memory test before this). With the higher priority the victims are the
/// same whichever way the kubelet ranks.
pub(crate) async fn steady_bystanders(n: &KubeNode) {
    priority_class(n, "steady", 1000).await;
    for (name, guaranteed) in [("burstable", false), ("guaranteed", true)] {
        let mut p = bystander(name, guaranteed);
        p["spec"]["priorityClassName"] = json!("steady");
        n.create(&p).await;
    }
}
