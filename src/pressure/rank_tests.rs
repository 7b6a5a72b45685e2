use super::*;
use serde_json::{Value, json};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).expect("a pod")
}

/// A pod named `name` (uid `uid-<name>`) with the given spec.
fn pod_with(name: &str, spec: Value) -> Pod {
    pod(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
}

/// One container `c` requesting `memory` (none: BestEffort), at `priority`.
fn simple(name: &str, priority: i32, memory: Option<&str>) -> Candidate {
    let resources = match memory {
        Some(m) => json!({"requests": {"memory": m}, "limits": {"memory": m}}),
        None => json!({}),
    };
    candidate(&pod_with(
        name,
        json!({"priority": priority, "containers": [{"name": "c", "resources": resources}]}),
    ))
    .expect("a candidate")
}

fn with_stats(mut c: Candidate, pod_ws: Option<u64>, container_ws: u64) -> Candidate {
    c.stats = Some(PodStats {
        working_set: pod_ws,
        processes: None,
        containers: vec![("c".into(), container_ws)],
    });
    c
}

fn names(c: &[Candidate]) -> Vec<&str> {
    c.iter().map(|c| c.name.as_str()).collect()
}

/// Every order of `c`, ranked by `rank`, gives `want` (no ties among them).
fn ranks_as(c: &[Candidate], rank: fn(&mut [Candidate]), want: &[&str]) {
    let n = c.len();
    let mut idx: Vec<usize> = (0..n).collect();
    // Heap's algorithm, iterative
    let mut counters = vec![0; n];
    let check = |idx: &[usize]| {
        let mut v: Vec<Candidate> = idx.iter().map(|&i| c[i].clone()).collect();
        rank(&mut v);
        assert_eq!(names(&v), want, "input order {:?}", idx);
    };
    check(&idx);
    let mut i = 0;
    while i < n {
        if counters[i] < i {
            if i % 2 == 0 {
                idx.swap(0, i);
            } else {
                idx.swap(counters[i], i);
            }
            check(&idx);
            counters[i] += 1;
            i = 0;
        } else {
            counters[i] = 0;
            i += 1;
        }
    }
}

// ---- critical pods -------------------------------------------------------------------

#[test]
fn critical_pods_are_static_mirror_or_system_critical_priority() {
    let annotated = |k: &str, v: &str| {
        pod(
            json!({"metadata": {"name": "p", "uid": "u", "annotations": {k: v}},
                   "spec": {"containers": []}}),
        )
    };
    assert!(is_critical(&annotated(
        "kubernetes.io/config.source",
        "file"
    )));
    assert!(is_critical(&annotated(
        "kubernetes.io/config.source",
        "http"
    )));
    assert!(!is_critical(&annotated(
        "kubernetes.io/config.source",
        "api"
    )));
    assert!(is_critical(&annotated(
        "kubernetes.io/config.mirror",
        "abc"
    )));
    assert!(!is_critical(&annotated("kubernetes.io/config.hash", "abc")));
    let prio = |p: i32| pod_with("p", json!({"priority": p, "containers": []}));
    assert!(is_critical(&prio(2_000_000_000)));
    assert!(is_critical(&prio(2_000_001_000)));
    assert!(!is_critical(&prio(1_999_999_999)));
    assert!(!is_critical(&pod_with("p", json!({"containers": []}))));
    // a priority class name alone is not a priority
    assert!(!is_critical(&pod_with(
        "p",
        json!({"priorityClassName": "system-node-critical", "containers": []})
    )));
    let c = candidate(&prio(2_000_000_000)).unwrap();
    assert!(c.critical);
    assert_eq!(c.priority, 2_000_000_000);
    assert!(!candidate(&prio(5)).unwrap().critical);
}

// ---- candidate: the memory request ---------------------------------------------------

fn request_of(spec: Value) -> i64 {
    candidate(&pod_with("p", spec)).unwrap().memory_request
}

#[test]
fn memory_request_sums_containers_and_takes_the_largest_init_step() {
    let mem = |m: &str| json!({"requests": {"memory": m}});
    // regular 100Mi + 200Mi and a sidecar of 50Mi: 350Mi; init steps: i1 alone 500Mi (before
    // the sidecar), i2 400Mi + the 50Mi sidecar before it = 450Mi; the largest is 500Mi
    let spec = json!({
        "containers": [{"name": "a", "resources": mem("100Mi")}, {"name": "b", "resources": mem("200Mi")}],
        "initContainers": [
            {"name": "i1", "resources": mem("500Mi")},
            {"name": "s1", "restartPolicy": "Always", "resources": mem("50Mi")},
            {"name": "i2", "resources": mem("400Mi")},
        ],
    });
    assert_eq!(request_of(spec.clone()), 500 * MI as i64);
    // a bigger sidecar: 300Mi + 250Mi = 550Mi beats i1 (500Mi) and i2 (400Mi + 250Mi = 650Mi)?
    // no: i2's step is 650Mi, the largest
    let mut bigger = spec.clone();
    bigger["initContainers"][1]["resources"] = mem("250Mi");
    assert_eq!(request_of(bigger), 650 * MI as i64);
    // overhead is added to a non-zero request
    let mut with_overhead = spec;
    with_overhead["overhead"] = json!({"memory": "10Mi", "cpu": "100m"});
    assert_eq!(request_of(with_overhead), 510 * MI as i64);
    // the candidate keeps each container's and init container's text, in that order
    let c = candidate(&pod_with(
        "p",
        json!({"containers": [{"name": "a", "resources": mem("0.5Gi")}, {"name": "b"}],
               "initContainers": [{"name": "i", "resources": mem("1000")}]}),
    ))
    .unwrap();
    assert_eq!(
        c.container_requests,
        vec![
            ("a".to_owned(), Some("0.5Gi".to_owned())),
            ("b".to_owned(), None),
            ("i".to_owned(), Some("1000".to_owned())),
        ]
    );
    // the ordinary init container's 1000 bytes is below the containers' 512Mi
    assert_eq!(c.memory_request, 512 * MI as i64);
    assert_eq!(c.pod_level_memory_request, None);
    assert_eq!(c.stats, None);
}

#[test]
fn overhead_alone_is_no_request() {
    // BestEffort with a runtime class overhead: the request stays 0
    assert_eq!(
        request_of(json!({"overhead": {"memory": "64Mi"}, "containers": [{"name": "c"}]})),
        0
    );
    // a CPU request only: memory is still 0 and gets no overhead
    assert_eq!(
        request_of(json!({"overhead": {"memory": "64Mi"},
                          "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]})),
        0
    );
}

#[test]
fn pod_level_resources_replace_the_containers() {
    let c100 = json!([{"name": "c", "resources": {"requests": {"memory": "100Mi"}}}]);
    // pod-level memory request: it alone counts, then overhead
    assert_eq!(
        request_of(
            json!({"resources": {"requests": {"memory": "1Gi"}}, "containers": c100,
                          "overhead": {"memory": "1Mi"}})
        ),
        (GI + MI) as i64
    );
    // pod-level resources set without a memory request: the containers are skipped all the
    // same, so the request is 0 (and the overhead is not added)
    assert_eq!(
        request_of(
            json!({"resources": {"limits": {"memory": "1Gi"}}, "containers": c100,
                          "overhead": {"memory": "1Mi"}})
        ),
        0
    );
    assert_eq!(
        request_of(json!({"resources": {"requests": {"cpu": "1"}}, "containers": c100})),
        0
    );
    // a pod-level resource that may not be set there does not make them set
    assert_eq!(
        request_of(
            json!({"resources": {"requests": {"ephemeral-storage": "1Gi"}},
                          "containers": c100})
        ),
        100 * MI as i64
    );
    let c = candidate(&pod_with(
        "p",
        json!({"resources": {"requests": {"memory": "1Gi"}}, "containers": c100}),
    ))
    .unwrap();
    assert_eq!(c.pod_level_memory_request.as_deref(), Some("1Gi"));
}

#[test]
fn a_fractional_byte_request_is_rounded_down() {
    // 1000.5 bytes
    assert_eq!(
        request_of(json!({"containers": [{"name": "c",
            "resources": {"requests": {"memory": "1000500m"}}}]})),
        1000
    );
    assert_eq!(
        request_of(json!({"containers": [{"name": "c",
            "resources": {"requests": {"memory": "1001"}}}]})),
        1001
    );
}

#[test]
fn candidate_reads_identity_and_refuses_what_the_api_would_not_serve() {
    let c = simple("web", 7, Some("64Mi"));
    assert_eq!(c.uid, PodUid::parse("uid-web").unwrap());
    assert_eq!((c.namespace.as_str(), c.name.as_str()), ("ns", "web"));
    assert_eq!(c.priority, 7);
    assert_eq!(c.memory_request, 64 * MI as i64);
    assert!(!c.critical);
    let no_uid = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
    assert!(matches!(
        candidate(&no_uid),
        Err(CandidateError::Pod(PodError::Missing { .. }))
    ));
    let bad_uid = pod(json!({"metadata": {"name": "p", "uid": "a/b"}, "spec": {"containers": []}}));
    assert!(matches!(
        candidate(&bad_uid),
        Err(CandidateError::Pod(PodError::InvalidUid { .. }))
    ));
    let bad = pod_with(
        "p",
        json!({"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}),
    );
    let err = candidate(&bad).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.containers[c].resources.requests.memory"),
        "{err}"
    );
    let bad_overhead = pod_with(
        "p",
        json!({"overhead": {"memory": "x"},
               "containers": [{"name": "c", "resources": {"requests": {"memory": "1"}}}]}),
    );
    assert!(
        candidate(&bad_overhead)
            .unwrap_err()
            .to_string()
            .contains("spec.overhead.memory")
    );
}

// ---- ranking -------------------------------------------------------------------------

#[test]
fn best_effort_above_its_request_goes_before_burstable_below() {
    let be = with_stats(simple("be", 0, None), Some(10 * MI), 10 * MI);
    let under = with_stats(simple("under", 0, Some("100Mi")), Some(50 * MI), 50 * MI);
    ranks_as(&[be, under], rank_memory, &["be", "under"]);
}

#[test]
fn exceeding_first_then_lower_priority_then_usage_above_request() {
    let a = with_stats(simple("a", 100, None), Some(5 * MI), 0);
    let b = with_stats(simple("b", 0, None), Some(MI), 0);
    // priority 0 and above its request by more than b
    let b2 = with_stats(simple("b2", 0, Some("1Mi")), Some(4 * MI), 0);
    let c = with_stats(simple("c", -5, Some("100Mi")), Some(99 * MI), 0);
    ranks_as(&[a, b, b2, c], rank_memory, &["b2", "b", "a", "c"]);
}

#[test]
fn exceeding_is_strict() {
    // exactly at the request does not exceed, so the lower priority comes first
    let at = with_stats(simple("at", 10, Some("64Mi")), Some(64 * MI), 0);
    let above = with_stats(simple("above", 10, Some("64Mi")), Some(64 * MI + 1), 0);
    let low = with_stats(simple("low", 0, Some("1Gi")), Some(MI), 0);
    ranks_as(&[at, above, low], rank_memory, &["above", "low", "at"]);
    // a fractional request: 1001 bytes is above 1000.5 (so ahead of a lower priority),
    // 1000 is not
    let frac = |n: &str, prio, ws| {
        let mut c = simple(n, prio, Some("1000500m"));
        c.stats = Some(PodStats {
            working_set: Some(ws),
            ..PodStats::default()
        });
        c
    };
    ranks_as(
        &[frac("at", 0, 1000), frac("over", 5, 1001)],
        rank_memory,
        &["over", "at"],
    );
    ranks_as(
        &[frac("at", 5, 1000), frac("low", 0, 1000)],
        rank_memory,
        &["low", "at"],
    );
}

#[test]
fn guaranteed_under_its_request_stays_behind_a_higher_priority_best_effort() {
    let hog = with_stats(simple("hog", 1000, None), Some(2300 * MI), 2300 * MI);
    let g = with_stats(simple("g", 0, Some("64Mi")), Some(MI), MI);
    ranks_as(&[hog, g], rank_memory, &["hog", "g"]);
}

#[test]
fn pods_without_stats_go_first_then_by_priority() {
    let x = simple("x", 1000, None);
    let y = simple("y", 5, Some("1Gi"));
    let hog = with_stats(simple("hog", 0, None), Some(GI), GI);
    ranks_as(&[x, y, hog], rank_memory, &["y", "x", "hog"]);
}

#[test]
fn missing_pod_level_usage_counts_as_zero() {
    // The scenario measured on the real kubelet (notes §5): BestEffort "hog" (priority 1000,
    // 2.3 GiB), BestEffort "mid" (priority 0, 100 MiB), Guaranteed "g" (priority 0, 64Mi
    // request, ~1 MiB). With the pod-level figures present the code's order is
    // [mid, hog, g]: both BestEffort pods exceed their zero request.
    let hog = |ws| with_stats(simple("hog", 1000, None), ws, 2360688 * 1024);
    let mid = |ws| with_stats(simple("mid", 0, None), ws, 100 * MI);
    let g = |ws| with_stats(simple("g", 0, Some("64Mi")), ws, MI);
    ranks_as(
        &[hog(Some(2360688 * 1024)), mid(Some(100 * MI)), g(Some(MI))],
        rank_memory,
        &["mid", "hog", "g"],
    );
    // Without pod-level figures (stats present, pod memory missing) no pod exceeds (0 > 0
    // and 0 > 64Mi are false): priority puts hog last, and usage minus request puts mid
    // (0 - 0) before g (0 - 64Mi): [mid, g, hog], the measured order.
    ranks_as(
        &[hog(None), mid(None), g(None)],
        rank_memory,
        &["mid", "g", "hog"],
    );
    // the second measured pass, mid gone: [g, hog]
    ranks_as(&[hog(None), g(None)], rank_memory, &["g", "hog"]);
    // a container-level figure alone does not count for ranking
    ranks_as(&[hog(None), g(Some(MI))], rank_memory, &["g", "hog"]);
}

#[test]
fn ties_keep_the_input_order() {
    let mk = |n: &str| with_stats(simple(n, 3, Some("1Mi")), Some(2 * MI), 0);
    let mut v = vec![mk("p1"), mk("p2"), mk("p3")];
    rank_memory(&mut v);
    assert_eq!(names(&v), ["p1", "p2", "p3"]);
    let mut v = vec![
        mk("p3"),
        simple("ns1", 3, None),
        mk("p1"),
        simple("ns2", 3, None),
    ];
    rank_memory(&mut v);
    assert_eq!(names(&v), ["ns1", "ns2", "p3", "p1"]);
    // more than 12 pods (where Go's sort would not be stable): still the input order
    let mut v: Vec<Candidate> = (0..30).map(|i| mk(&format!("q{i:02}"))).collect();
    let want: Vec<String> = v.iter().map(|c| c.name.clone()).collect();
    rank_memory(&mut v);
    rank_pids(&mut v);
    assert_eq!(names(&v), want);
}

#[test]
fn huge_working_sets_do_not_overflow() {
    let big = with_stats(simple("big", 0, None), Some(u64::MAX / 2), 0);
    let small = with_stats(simple("small", 0, Some("1Ei")), Some(1 << 61), 0);
    ranks_as(&[big, small], rank_memory, &["big", "small"]);
}

#[test]
fn pid_ranking_is_priority_then_processes() {
    let procs = |n: &str, prio, p: Option<u64>| {
        let mut c = simple(n, prio, None);
        c.stats = Some(PodStats {
            processes: p,
            ..PodStats::default()
        });
        c
    };
    let many = procs("many", 0, Some(500));
    let few = procs("few", 0, Some(3));
    let unknown = procs("unknown", 0, None);
    let nostats = simple("nostats", 0, None);
    let important = procs("important", 10, Some(100_000));
    let low_nostats = simple("low-nostats", -1, None);
    ranks_as(
        &[many, few, unknown, nostats, important],
        rank_pids,
        &["nostats", "many", "few", "unknown", "important"],
    );
    // priority before everything, memory plays no part
    let hog = with_stats(simple("hog", 0, None), Some(GI), GI);
    ranks_as(&[hog, low_nostats], rank_pids, &["low-nostats", "hog"]);
}

// ---- the eviction message ------------------------------------------------------------

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn message_of_the_measured_eviction() {
    let c = with_stats(simple("hog", 0, None), Some(2360688 * 1024), 2360688 * 1024);
    let m = eviction_message("memory", &c, Some(("1Gi".into(), 695431168)));
    assert_eq!(
        m.message,
        "The node was low on resource: memory. Threshold quantity: 1Gi, available: 679132Ki. Container c was using 2360688Ki, request is 0, has larger consumption of memory. "
    );
    assert_eq!(
        m.annotations,
        ann(&[
            ("offending_containers", "c"),
            ("offending_containers_usage", "2360688Ki"),
            ("starved_resource", "memory"),
        ])
    );
}

#[test]
fn message_of_a_pod_without_stats_stops_after_the_node() {
    let c = simple("g", 0, Some("64Mi"));
    let m = eviction_message("memory", &c, Some(("100Mi".into(), 100 * MI as i64 - 4096)));
    assert_eq!(
        m.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 102396Ki. "
    );
    assert!(m.annotations.is_empty());
    // and without an observation: the first sentence alone
    let m = eviction_message("memory", &c, None);
    assert_eq!(m.message, "The node was low on resource: memory. ");
    assert!(m.annotations.is_empty());
}

#[test]
fn containers_within_their_request_are_not_blamed() {
    let mut c = candidate(&pod_with(
        "p",
        json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"memory": "64Mi"}}},
                {"name": "b", "resources": {"requests": {"memory": "1000"}}},
                {"name": "c"},
            ],
            "initContainers": [{"name": "side", "restartPolicy": "Always",
                                "resources": {"requests": {"memory": "0.5Gi"}}}],
            "ephemeralContainers": [{"name": "debug"}],
        }),
    ))
    .unwrap();
    c.stats = Some(PodStats {
        working_set: Some(3 * GI),
        processes: Some(4),
        // summary order, not spec order; "debug" is ephemeral and never blamed; "gone" is
        // in no spec
        containers: vec![
            ("side".into(), GI),
            ("debug".into(), GI),
            ("a".into(), 64 * MI),
            ("c".into(), 1000),
            ("b".into(), 2048),
            ("gone".into(), GI),
        ],
    });
    let m = eviction_message("memory", &c, Some(("5%".into(), 1)));
    assert_eq!(
        m.message,
        "The node was low on resource: memory. Threshold quantity: 5%, available: 1. \
         Container side was using 1Gi, request is 512Mi, has larger consumption of memory. \
         Container c was using 1k, request is 0, has larger consumption of memory. \
         Container b was using 2Ki, request is 1k, has larger consumption of memory. "
    );
    assert_eq!(
        m.annotations,
        ann(&[
            ("offending_containers", "side,c,b"),
            ("offending_containers_usage", "1Gi,1k,2Ki"),
            ("starved_resource", "memory"),
        ])
    );
}

#[test]
fn nothing_blamed_still_annotates() {
    let c = with_stats(simple("g", 0, Some("64Mi")), Some(MI), MI);
    let m = eviction_message("memory", &c, Some(("100Mi".into(), 0)));
    assert_eq!(
        m.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 0. "
    );
    assert_eq!(
        m.annotations,
        ann(&[
            ("offending_containers", ""),
            ("offending_containers_usage", ""),
            ("starved_resource", "memory"),
        ])
    );
}

#[test]
fn pid_messages_blame_no_container() {
    let mut c = with_stats(simple("forky", 0, None), Some(GI), GI);
    c.stats.as_mut().unwrap().processes = Some(30000);
    let m = eviction_message("pids", &c, Some(("1k".into(), 617)));
    assert_eq!(
        m.message,
        "The node was low on resource: pids. Threshold quantity: 1k, available: 617. "
    );
    assert_eq!(
        m.annotations,
        ann(&[
            ("offending_containers", ""),
            ("offending_containers_usage", ""),
            ("starved_resource", "pids"),
        ])
    );
    // without stats: no annotations at all
    let m = eviction_message("pids", &simple("x", 0, None), None);
    assert_eq!(m.message, "The node was low on resource: pids. ");
    assert!(m.annotations.is_empty());
}

#[test]
fn pod_level_request_is_reported_whether_exceeded_or_not() {
    let mut c = candidate(&pod_with(
        "big",
        json!({"resources": {"requests": {"memory": "1024Mi"}},
               "containers": [{"name": "c"}]}),
    ))
    .unwrap();
    assert_eq!(c.memory_request, GI as i64);
    c.stats = Some(PodStats {
        working_set: Some(512 * MI),
        processes: None,
        containers: vec![("c".into(), 512 * MI)],
    });
    let m = eviction_message("memory", &c, Some(("100Mi".into(), 1 << 20)));
    assert_eq!(
        m.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 1Mi. \
         Pod big was using 512Mi, request is 1Gi, has larger consumption of memory. \
         Container c was using 512Mi, request is 0, has larger consumption of memory. "
    );
    assert_eq!(
        m.annotations,
        ann(&[
            ("offending_containers", "c"),
            ("offending_containers_usage", "512Mi"),
            ("offending_pod", "big"),
            ("offending_pod_usage", "512Mi"),
            ("starved_resource", "memory"),
        ])
    );
    // no pod-level figure: no pod sentence
    c.stats.as_mut().unwrap().working_set = None;
    let m = eviction_message("memory", &c, None);
    assert!(!m.message.contains("Pod big"), "{}", m.message);
    assert!(!m.annotations.contains_key(OFFENDING_POD));
    // not for pids
    c.stats.as_mut().unwrap().working_set = Some(GI);
    assert!(
        !eviction_message("pids", &c, None)
            .message
            .contains("Pod big")
    );
}

// ---- quantity printing ---------------------------------------------------------------

#[test]
fn binary_usage_prints_as_upstream() {
    // printed by k8s.io/apimachinery v0.36.5: NewQuantity(v, BinarySI).String()
    for (v, want) in [
        (0, "0"),
        (1, "1"),
        (100, "100"),
        (999, "999"),
        (1000, "1k"),
        (1010, "1010"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1025, "1025"),
        (1500, "1500"),
        (2000, "2000"),
        (3000, "3000"),
        (10240, "10Ki"),
        (1048576, "1Mi"),
        (1073741824, "1Gi"),
        (2417344512, "2360688Ki"),
        (695431168, "679132Ki"),
        (2473639936, "2415664Ki"),
        (-1000, "-1k"),
        (-2048, "-2Ki"),
        (1024000, "1000Ki"),
        (i64::MAX, "9223372036854775807"),
        (1152921504606846976, "1Ei"),
        (67108864, "64Mi"),
    ] {
        assert_eq!(format_binary(v), want, "{v}");
    }
}

#[test]
fn request_text_prints_as_upstream() {
    // printed by k8s.io/apimachinery v0.36.5: ParseQuantity(s).String()
    for (s, want) in [
        ("03Ki", "03Ki"),
        ("1000", "1k"),
        ("0.5Gi", "512Mi"),
        ("1.5Gi", "1536Mi"),
        ("+3Ki", "+3Ki"),
        ("1e3", "1e3"),
        ("1e2", "100"),
        ("1000E", "1"),
        ("64Mi", "64Mi"),
        ("100M", "100M"),
        ("128974848", "128974848"),
        ("129e6", "129e6"),
        ("123Mi", "123Mi"),
        ("1000Mi", "1000Mi"),
        ("1024Mi", "1Gi"),
        ("0.1", "100m"),
        ("100m", "100m"),
        ("1000500m", "1000500m"),
        ("1.0Gi", "1Gi"),
        ("512Ki", "512Ki"),
        ("2Gi", "2Gi"),
        ("100Mi", "100Mi"),
        ("0.25Ki", "256"),
        ("not a quantity", "not a quantity"),
    ] {
        assert_eq!(canonical(s), want, "{s}");
    }
}

#[test]
fn request_text_prints_as_the_quantity_vectors() {
    // every input the crate's quantity parser accepts among the vectors printed by
    // apimachinery itself (src/drain/quantity_vectors.tsv) prints the same string
    let mut checked = 0;
    for line in include_str!("../drain/quantity_vectors.tsv").lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split('\t').collect();
        if cols[1] != "OK" {
            continue;
        }
        let input: String = serde_json::from_str(cols[0]).unwrap();
        if Quantity::parse(&input).is_err() {
            continue;
        }
        let want = cols[2].strip_prefix("string=").unwrap();
        assert_eq!(canonical(&input), want, "{input:?}");
        checked += 1;
    }
    assert!(checked > 400, "{checked}");
}
