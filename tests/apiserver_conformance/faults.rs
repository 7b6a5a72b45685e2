//! The fault-injecting layer (`tests/common/apiserver/faults.rs`) over real HTTP: what a rule
//! answers, for how long, and what stalls, resets and slow bodies look like to a client.

use super::apiserver::User;
use super::apiserver::faults::{FaultRule, Match};
use super::{Backend, Bed, Client, PODS, STRATEGIC, connect, pod_path};
use http_body_util::BodyExt;
use hyper::body::Bytes;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// An answer as the wire gave it, and how long it took to the body's last byte.
struct Raw {
    code: u16,
    headers: http::HeaderMap,
    bytes: Bytes,
    took: Duration,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
}

/// One request on a fresh connection; `Err` when the connection ends with no (whole) answer.
/// Panics after 30 s.
async fn raw(c: &Client, method: &str, path: &str, body: Option<&Value>) -> Result<Raw, String> {
    let req = c.request(method, path, super::JSON, body);
    let start = Instant::now();
    let fut = async {
        let mut send = connect(c.addr()).await;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Raw {
            code,
            headers,
            bytes: bytes.to_bytes(),
            took: start.elapsed(),
        })
    };
    tokio::time::timeout(secs(30.0), fut)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: neither answered nor closed within 30 s"))
}

/// Waits (at most `limit`) for `f`.
async fn until(limit: Duration, what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_patch(ready: &str) -> Value {
    json!({"status": {"conditions": [{"type": "Ready", "status": ready}]}})
}

fn ready_of(pod: &Value) -> String {
    let conds = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = conds.iter().find(|c| c["type"] == "Ready");
    ready.map_or(String::new(), |c| {
        c["status"].as_str().unwrap_or("").to_owned()
    })
}

fn pods_list() -> Match {
    Match::any().verb("list").resource("pods")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_429_retry_after() {
    let bed = Bed::new(Backend::Imitation).await;
    bed.pod("p", None).await;
    let id = bed
        .api()
        .inject(FaultRule::answer(429).retry_after(5).matching(pods_list()));
    let r = bed.admin.get(PODS).await;
    assert_eq!(r.code, 429, "{:#}", r.body);
    assert_eq!(
        r.headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("5")
    );
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["status"], "Failure");
    assert_eq!(r.body["code"], 429);
    assert_eq!(r.reason(), "TooManyRequests");
    assert_eq!(r.body["details"]["retryAfterSeconds"], 5);
    // other requests pass
    bed.admin.get(&pod_path("p")).await.expect(200, None);
    assert_eq!(bed.api().fault_hits(id), 1);
    assert!(bed.api().remove_fault(id));
    bed.admin.get(PODS).await.expect(200, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_answer_reasons() {
    let bed = Bed::new(Backend::Imitation).await;
    let want = [
        (500, "InternalError"),
        (503, "ServiceUnavailable"),
        (504, "Timeout"),
    ];
    for (code, reason) in want {
        bed.api().inject(FaultRule::answer(code).times(1));
        let r = bed.admin.get(PODS).await;
        assert_eq!((r.code, r.reason()), (code, reason), "{:#}", r.body);
        assert_eq!(r.body["code"], code);
        assert!(r.headers.get("retry-after").is_none());
    }
    bed.admin.get(PODS).await.expect(200, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_times_n() {
    let bed = Bed::new(Backend::Imitation).await;
    let id = bed
        .api()
        .inject(FaultRule::answer(500).matching(pods_list()).times(3));
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(bed.admin.get(PODS).await.code);
        bed.admin
            .get("/api/v1/nodes/node-a")
            .await
            .expect(200, None);
    }
    assert_eq!(codes, [500, 500, 500, 200, 200]);
    assert_eq!(bed.api().fault_hits(id), 3);
    let logged: Vec<u16> = bed
        .api()
        .requests_matching(&pods_list())
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(logged, codes, "the log's pod LISTs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_stall_pod_a_not_pod_b() {
    let bed = Bed::new(Backend::Imitation).await;
    bed.running("a").await;
    bed.running("b").await;
    let m = Match::any().verb("patch").subresource("status").name("a");
    let id = bed.api().inject(FaultRule::stall().matching(m));
    let c = bed.node_a.clone();
    let a = tokio::spawn(async move {
        let path = format!("{}/status", pod_path("a"));
        let req = c.request("PATCH", &path, STRATEGIC, Some(&status_patch("False")));
        let mut send = connect(c.addr()).await;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        Ok::<u16, String>(resp.status().as_u16())
    });
    until(secs(5.0), "pod a's PATCH stalled", || {
        bed.api().stalled_by(id) == 1
    })
    .await;
    let t = Instant::now();
    let path_b = format!("{}/status", pod_path("b"));
    let rb = bed
        .node_a
        .patch(&path_b, STRATEGIC, &status_patch("False"))
        .await;
    rb.expect(200, None);
    assert!(
        t.elapsed() < secs(3.0),
        "pod b's PATCH took {:?}",
        t.elapsed()
    );
    assert_eq!(ready_of(&rb.body), "False");
    tokio::time::sleep(secs(0.5)).await;
    assert!(!a.is_finished(), "pod a's PATCH was answered");
    let stored = bed.stored("a").await.expect("pod a");
    assert_eq!(
        ready_of(&stored),
        "True",
        "the stalled PATCH reached the store"
    );
    // removed: the stalled request goes on to the handler
    assert!(bed.api().remove_fault(id));
    let code = tokio::time::timeout(secs(5.0), a).await;
    assert_eq!(code.expect("released within 5 s").unwrap(), Ok(200));
    assert_eq!(ready_of(&bed.stored("a").await.unwrap()), "False");
    assert_eq!(bed.api().stalled_by(id), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_stall_cut() {
    let bed = Bed::new(Backend::Imitation).await;
    bed.pod("x", None).await;
    // cut_fault: the stalled connection is closed with no answer
    let id = bed
        .api()
        .inject(FaultRule::stall().matching(Match::any().name("x")));
    let c = bed.admin.clone();
    let x = tokio::spawn(async move { raw(&c, "GET", &pod_path("x"), None).await.map(|r| r.code) });
    until(secs(5.0), "GET x stalled", || bed.api().stalled_by(id) == 1).await;
    assert!(bed.api().cut_fault(id));
    let got = tokio::time::timeout(secs(5.0), x)
        .await
        .expect("cut within 5 s");
    assert!(got.unwrap().is_err(), "a cut stall answered");
    assert_eq!(bed.api().stalled_by(id), 0);
    let logged = bed.api().requests_matching(&Match::any().name("x"));
    assert_eq!(
        logged.last().map(|r| r.status),
        Some(0),
        "logged as a reset"
    );
    // a refused server cuts stalled connections too
    let id = bed
        .api()
        .inject(FaultRule::stall().matching(Match::any().name("x")));
    let c = bed.admin.clone();
    let x = tokio::spawn(async move { raw(&c, "GET", &pod_path("x"), None).await.map(|r| r.code) });
    until(secs(5.0), "GET x stalled", || bed.api().stalled_by(id) == 1).await;
    bed.api().refuse_connections_for(secs(0.3));
    let got = tokio::time::timeout(secs(5.0), x)
        .await
        .expect("cut within 5 s");
    assert!(got.unwrap().is_err(), "a stall answered across an outage");
    until(secs(5.0), "the stall let go", || {
        bed.api().stalled_by(id) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_stall_ends_when_client_leaves() {
    let bed = Bed::new(Backend::Imitation).await;
    let id = bed.api().inject(FaultRule::stall().matching(pods_list()));
    let c = bed.admin.clone();
    let x = tokio::spawn(async move { raw(&c, "GET", PODS, None).await.map(|r| r.code) });
    until(secs(5.0), "LIST stalled", || bed.api().stalled_by(id) == 1).await;
    x.abort();
    until(secs(5.0), "the stall let go", || {
        bed.api().stalled_by(id) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_reset() {
    let bed = Bed::new(Backend::Imitation).await;
    bed.pod("p", None).await;
    let m = Match::any().verb("get").name("p");
    let id = bed
        .api()
        .inject(FaultRule::reset().matching(m.clone()).times(1));
    let got = raw(&bed.admin, "GET", &pod_path("p"), None).await;
    assert!(
        got.is_err(),
        "answered {}",
        got.map(|r| r.code).unwrap_or(0)
    );
    assert_eq!(bed.api().fault_hits(id), 1);
    bed.admin.get(&pod_path("p")).await.expect(200, None);
    let logged: Vec<u16> = bed
        .api()
        .requests_matching(&m)
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(logged, [0, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_slow_body() {
    let bed = Bed::new(Backend::Imitation).await;
    for i in 0..8 {
        bed.pod(&format!("p{i}"), None).await;
    }
    let plain = raw(&bed.admin, "GET", PODS, None).await.unwrap();
    let len = plain.bytes.len();
    assert!(len > 3000, "a list of {len} bytes");
    let rate = 2000u64;
    let id = bed.api().inject(
        FaultRule::slow_body(Some(rate), Duration::ZERO)
            .matching(pods_list())
            .times(1),
    );
    let slow = raw(&bed.admin, "GET", PODS, None).await.unwrap();
    assert_eq!(slow.code, 200);
    assert_eq!(slow.bytes, plain.bytes, "the trickled body differs");
    assert_eq!(slow.json()["items"].as_array().map(Vec::len), Some(8));
    let least = secs(len as f64 / rate as f64);
    assert!(
        slow.took >= least,
        "{len} bytes at {rate}/s in {:?}",
        slow.took
    );
    assert!(
        slow.took < least + secs(10.0),
        "{len} bytes in {:?}",
        slow.took
    );
    assert_eq!(bed.api().fault_hits(id), 1);
    // a delay before the first byte, the length announced
    let id = bed.api().inject(
        FaultRule::slow_body(None, secs(1.5))
            .matching(pods_list())
            .times(1),
    );
    let late = raw(&bed.admin, "GET", PODS, None).await.unwrap();
    assert_eq!(late.bytes, plain.bytes);
    assert!(late.took >= secs(1.5), "first byte after {:?}", late.took);
    assert!(late.took < secs(11.5), "first byte after {:?}", late.took);
    let cl = late
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(cl, Some(len.to_string()));
    // spent: the next list is not slowed
    let fast = raw(&bed.admin, "GET", PODS, None).await.unwrap();
    assert_eq!(bed.api().fault_hits(id), 1);
    assert!(
        fast.took < secs(1.4),
        "an unfaulted list took {:?}",
        fast.took
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_expire() {
    let bed = Bed::new(Backend::Imitation).await;
    let start = Instant::now();
    bed.api()
        .inject(FaultRule::answer(503).for_duration(secs(3.0)));
    let r = bed.admin.get(PODS).await;
    assert!(start.elapsed() < secs(3.0), "too slow to observe the rule");
    assert_eq!((r.code, r.reason()), (503, "ServiceUnavailable"));
    tokio::time::sleep_until((start + secs(3.1)).into()).await;
    bed.admin.get(PODS).await.expect(200, None);
    // a stall for a while answers when its time is up
    let start = Instant::now();
    let id = bed.api().inject(FaultRule::stall().for_duration(secs(1.5)));
    let r = raw(&bed.admin, "GET", PODS, None).await.unwrap();
    assert_eq!(r.code, 200);
    let took = start.elapsed();
    assert!(
        took >= secs(1.5) && took < secs(6.5),
        "answered after {took:?}"
    );
    assert_eq!(bed.api().fault_hits(id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_fail_for_is_a_rule() {
    let bed = Bed::new(Backend::Imitation).await;
    let start = Instant::now();
    bed.api().fail_for(secs(3.0), 429);
    let r = bed.node_a.get("/api/v1/nodes/node-a").await;
    assert_eq!(
        (r.code, r.reason()),
        (429, "TooManyRequests"),
        "{:#}",
        r.body
    );
    assert_eq!(
        r.headers.get("retry-after").map(|v| v.to_str().unwrap()),
        Some("1")
    );
    // a second call replaces the first
    bed.api().fail_for(secs(3.0), 500);
    let r = bed.admin.get(PODS).await;
    assert_eq!((r.code, r.reason()), (500, "InternalError"), "{:#}", r.body);
    assert!(
        start.elapsed() < secs(3.0),
        "too slow to observe the failure"
    );
    tokio::time::sleep_until((Instant::now() + secs(3.1)).into()).await;
    bed.admin.get(PODS).await.expect(200, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matcher_narrows() {
    let bed = Bed::new(Backend::Imitation).await;
    let api = bed.api();
    api.inject(FaultRule::answer(500).matching(Match::any().watch(true)));
    let node_b = User::Node("node-b".into());
    api.inject(FaultRule::answer(503).matching(Match::any().user(&node_b)));
    api.inject(FaultRule::answer(504).matching(Match::any().namespace("kube-system")));
    api.inject(FaultRule::answer(429).matching(Match::any().method("post").resource("pods")));
    let a = &bed.admin;
    a.get(PODS).await.expect(200, None);
    let w = a.watch(&format!("{PODS}?watch=1")).await;
    assert_eq!(w.err().map(|r| r.code), Some(500), "the watch");
    bed.node_b
        .get("/api/v1/nodes/node-b")
        .await
        .expect(503, None);
    bed.node_a
        .get("/api/v1/nodes/node-a")
        .await
        .expect(200, None);
    a.get("/api/v1/namespaces/kube-system/pods")
        .await
        .expect(504, None);
    a.post(PODS, &super::pod_body("p", None))
        .await
        .expect(429, None);
    a.post("/api/v1/nodes", &json!({"metadata": {"name": "n"}}))
        .await
        .expect(201, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_delay() {
    let bed = Bed::new(Backend::Imitation).await;
    bed.pod("p", None).await;
    bed.api().inject(
        FaultRule::delay(secs(1.0))
            .matching(Match::any().name("p"))
            .times(1),
    );
    let r = raw(&bed.admin, "GET", &pod_path("p"), None).await.unwrap();
    assert_eq!(r.code, 200);
    assert!(
        r.took >= secs(1.0) && r.took < secs(6.0),
        "answered after {:?}",
        r.took
    );
    bed.api()
        .inject(FaultRule::answer(504).after(secs(1.0)).times(1));
    let r = raw(&bed.admin, "GET", &pod_path("p"), None).await.unwrap();
    assert_eq!(
        (r.code, r.json()["reason"].as_str()),
        (504, Some("Timeout"))
    );
    assert!(
        r.took >= secs(1.0) && r.took < secs(6.0),
        "answered after {:?}",
        r.took
    );
}
