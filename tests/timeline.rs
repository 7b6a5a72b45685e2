//! Termination timelines on the test bed's containerd (issue 31): a pod with a preStop hook, a
//! TERM-ignoring pod SIGKILLed at its grace and an orphan, each ended by `reaplet run`; then
//! `reaplet pods --timeline` as text, as JSON (by name and by UID), and as an SVG chart that a
//! real headless Chromium renders, with the deadline line found in the picture where the data
//! puts it. Needs root and `scripts/test.sh`'s set-up (containerd, busybox, chromium).

mod common;

use common::*;
use reaplet::timeline::{Step, StopKind, Timeline};
use reaplet_testbed::{ContainerTemplate, IGNORES_TERM, PodTemplate, TRAPS_TERM};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port for the agent's status endpoint (the test reads it).
fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `reaplet pods --address ADDR ARGS…`: (exit code, stdout, stderr).
fn pods_cmd(address: &str, args: &[&str]) -> (i32, String, String) {
    let out = reaplet()
        .args(["pods", "--address", address])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The timeline of `pod` as the agent serves it, once its worker finished and the API
/// answered its delete (or, without an API object, once finished); waits up to `limit`.
async fn finished_timeline(
    address: &str,
    pod: &str,
    api_object: bool,
    limit: Duration,
) -> Timeline {
    let start = Instant::now();
    loop {
        let (code, out, _) = pods_cmd(address, &["--timeline", pod, "-o", "json"]);
        if code == 0 {
            let t = Timeline::from_json(serde_json::from_str(&out).unwrap()).unwrap();
            let deleted = t
                .entries
                .iter()
                .any(|e| matches!(e.step, Step::ObjectDeleted { .. }));
            if t.finished_ms.is_some() && (deleted || !api_object) {
                return t;
            }
        }
        assert!(
            start.elapsed() < limit,
            "{pod}: no finished timeline after {limit:?} (last answer {code}: {out})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn at(t: &Timeline, container: Option<&str>, f: impl Fn(&Step) -> bool) -> f64 {
    t.entries
        .iter()
        .find(|e| e.container.as_deref() == container && f(&e.step))
        .map(|e| e.at_ms)
        .unwrap_or_else(|| panic!("{}: step missing from {:#?}", t.key(), t.entries))
}

/// Renders `svg` in headless Chromium at its own size; the screenshot's RGB rows.
fn screenshot(svg: &Path, width: u32, height: u32) -> (usize, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("shot.png");
    // bounded: a browser that hangs fails the test instead
    let out = Command::new("timeout")
        .args(["60", "/usr/bin/chromium"])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", svg.display()))
        .stdin(Stdio::null())
        .output()
        .expect("chromium (scripts/test.sh installs it)");
    assert!(
        png.exists(),
        "chromium wrote no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let (w, h) = (info.width as usize, info.height as usize);
    assert_eq!((w, h), (width as usize, height as usize));
    // to RGB
    let mut rgb = Vec::with_capacity(w * h * 3);
    for px in buf[..w * h * channels].chunks(channels) {
        rgb.extend_from_slice(&px[..3]);
    }
    (w, rgb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timelines_of_a_hook_a_sigkill_and_an_orphan_as_text_json_and_a_rendered_chart() {
    let (tb, api, root, kc) = api_bed("timeline").await;
    let log = root.path().join("reaplet.log");
    let hook = serde_json::json!({"exec": {"command": ["/bin/sh", "-c", "sleep 1"]}});
    let hooked = PodTemplate::new("hooked", 10)
        .container(ContainerTemplate::new("app", TRAPS_TERM).pre_stop(hook));
    let stubborn =
        PodTemplate::new("stubborn", 3).container(ContainerTemplate::new("app", IGNORES_TERM));
    let h = launch_in_api(&api, &tb, &hooked).await;
    let s = launch_in_api(&api, &tb, &stubborn).await;
    // in the runtime only: an orphan once reaplet has listed its sources
    let orphan =
        PodTemplate::new("leftover", 30).container(ContainerTemplate::new("app", IGNORES_TERM));
    let o = reaplet_testbed::launch(&tb, &orphan).await.unwrap();

    let address = free_address();
    let kcs = kc.display().to_string();
    // every termination traced, to a collector of the test's own
    let collector = otlp::OtlpReceiver::start().await;
    let endpoint = collector.endpoint();
    let mut agent = spawn_reaplet(
        &tb,
        &root.path().join("kubelet"),
        &[
            "--kubeconfig",
            &kcs,
            "--metrics-bind-address",
            &address,
            "--tracing-endpoint",
            &endpoint,
            "--tracing-sampling-rate-per-million",
            "1000000",
        ],
        &log,
    );
    wait_in_sync(&api).await;
    api.delete_pod("default", "hooked", None);
    api.delete_pod("default", "stubborn", None);
    let ctx = || tail(&read_log(&log), 40);
    wait_pods_gone(&api, &["hooked", "stubborn"], Duration::from_secs(40), ctx).await;

    // --- the TERM-ignoring pod: SIGKILLed at its 3 s grace
    let t = finished_timeline(&address, "default/stubborn", true, Duration::from_secs(30)).await;
    assert_eq!(t.uid, s.uid.as_str());
    let first = &t.entries[0].step;
    assert!(
        matches!(first, Step::Reason { reason, source, grace: 3, .. } if reason == "deleted" && source == "api"),
        "{first:?}"
    );
    let term = at(&t, Some("app"), |s| {
        matches!(
            s,
            Step::StopSent {
                timeout: 3,
                kind: StopKind::Fresh
            }
        )
    });
    let kill = at(&t, Some("app"), |s| matches!(s, Step::Sigkill));
    let exit = at(&t, Some("app"), |s| {
        matches!(
            s,
            Step::Exited {
                code: 137,
                before_kill: false,
                ..
            }
        )
    });
    let deadline = t.deadline_ms.expect("a deadline");
    println!("{}", reaplet::timeline::text::render(&t));
    // the deadline is the grace from the kill's start; the SIGKILL is its stop's timeout
    assert!(
        (2990.0..3100.0)
            .contains(&(deadline - at(&t, None, |s| matches!(s, Step::KillStarted { .. }))))
    );
    assert!(
        (kill - term - 3000.0).abs() < 1.0,
        "SIGKILL = SIGTERM + 3 s: {kill} {term}"
    );
    assert!(
        exit >= kill - 50.0 && exit < kill + 2000.0,
        "exit {exit} after SIGKILL {kill}"
    );
    let order = [
        at(&t, None, |s| matches!(s, Step::KillStarted { .. })),
        term,
        kill,
        at(&t, None, |s| matches!(s, Step::SandboxStopped { .. })),
        at(&t, None, |s| matches!(s, Step::ContainersStopped)),
        at(&t, None, |s| matches!(s, Step::VolumesDone { ok: true })),
        at(&t, None, |s| matches!(s, Step::CgroupRemoved { .. })),
        at(&t, None, |s| matches!(s, Step::Finished)),
        at(&t, None, |s| matches!(s, Step::ObjectDeleted { code: 200 })),
    ];
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "{order:?}\n{:#?}",
        t.entries
    );
    at(&t, None, |s| matches!(s, Step::StatusWritten { code: 200 }));

    // the same by UID, and as text
    let (code, by_uid, _) = pods_cmd(&address, &["--timeline", s.uid.as_str(), "-o", "json"]);
    assert_eq!(code, 0);
    let by_uid = Timeline::from_json(serde_json::from_str(&by_uid).unwrap()).unwrap();
    assert_eq!(by_uid.entries, t.entries);
    let (code, text, err) = pods_cmd(&address, &["--timeline", "default/stubborn"]);
    assert_eq!(code, 0, "{err}");
    println!("{text}");
    for want in [
        "default/stubborn",
        "reason: deleted (from api); grace 3s",
        "SIGTERM (StopContainer, timeout 3s)",
        "SIGKILL: the stop's timeout ran out",
        "exited 137 (SIGKILL)",
        "object deleted, UID precondition (HTTP 200)",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }

    // --- the chart, rendered by a real browser: the deadline line where the data puts it
    let svg = root.path().join("stubborn.svg");
    let (code, _, err) = pods_cmd(
        &address,
        &[
            "--timeline",
            "default/stubborn",
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let layout = reaplet::timeline::svg::layout(&t);
    let (w, rgb) = screenshot(&svg, layout.width as u32, layout.height as u32);
    let px = |x: usize, y: usize| {
        let i = (y * w + x) * 3;
        (rgb[i], rgb[i + 1], rgb[i + 2])
    };
    let (top, bottom) = (layout.row_y(0) as usize, layout.row_y(layout.rows) as usize);
    let red = |p: (u8, u8, u8)| p.0 > 200 && p.1 < 80 && p.2 < 80;
    // the columns where most of the plot's height is the deadline's red
    let columns: Vec<usize> = (0..w)
        .filter(|&x| (top..bottom).filter(|&y| red(px(x, y))).count() * 3 > (bottom - top))
        .collect();
    let want = layout.x(deadline) as usize;
    assert!(
        !columns.is_empty() && columns.iter().all(|&x| x.abs_diff(want) <= 2),
        "deadline drawn at columns {columns:?}, the data says x={want}"
    );
    // the SIGKILL mark: dark red in the container's row, near x of the SIGKILL
    let kx = layout.x(kill) as usize;
    let row = layout.row_y(1) as usize;
    let dark = (row..row + layout.row_height as usize)
        .flat_map(|y| (kx.saturating_sub(8)..kx + 8).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let p = px(x, y);
            p.0 > 90 && p.0 < 160 && p.1 < 30 && p.2 < 30
        })
        .count();
    assert!(
        dark > 10,
        "no SIGKILL mark near x={kx} ({dark} dark red pixels)"
    );
    std::fs::create_dir_all("target/timeline").unwrap();
    std::fs::copy(&svg, "target/timeline/stubborn.svg").unwrap();

    // --- the hook: preStop, then SIGTERM, exit 0, no SIGKILL
    let t = finished_timeline(&address, "default/hooked", true, Duration::from_secs(30)).await;
    assert_eq!(t.uid, h.uid.as_str());
    let hs = at(&t, Some("app"), |s| matches!(s, Step::PreStopStarted));
    let he = at(&t, Some("app"), |s| {
        matches!(s, Step::PreStopEnded { ok: true, .. })
    });
    let term = at(&t, Some("app"), |s| matches!(s, Step::StopSent { .. }));
    let exit = at(&t, Some("app"), |s| {
        matches!(s, Step::Exited { code: 0, .. })
    });
    assert!(
        he - hs >= 1000.0 && he - hs < 5000.0,
        "the hook's sleep 1: {}",
        he - hs
    );
    assert!(he <= term && term <= exit, "{hs} {he} {term} {exit}");
    assert!(!t.entries.iter().any(|e| matches!(e.step, Step::Sigkill)));
    let (_, text, _) = pods_cmd(&address, &["--timeline", "default/hooked"]);
    println!("{text}");
    std::fs::write("target/timeline/hooked.txt", &text).unwrap();
    let svg = root.path().join("hooked.svg");
    pods_cmd(
        &address,
        &[
            "--timeline",
            "default/hooked",
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    std::fs::copy(&svg, "target/timeline/hooked.svg").unwrap();

    // --- the orphan: ended by reaplet alone, SIGKILLed at the 2 s floor over its 1 s
    let t = finished_timeline(&address, o.uid.as_str(), false, Duration::from_secs(30)).await;
    let first = &t.entries[0].step;
    assert!(
        matches!(first, Step::Reason { reason, source, grace: 1, .. } if reason == "orphan" && source == "runtime"),
        "{first:?}"
    );
    at(&t, Some("app"), |s| {
        matches!(s, Step::StopSent { timeout: 2, .. })
    });
    at(&t, Some("app"), |s| matches!(s, Step::Sigkill));
    assert!(
        !t.entries
            .iter()
            .any(|e| matches!(e.step, Step::ObjectDeleted { .. }))
    );

    // --- the same terminations as OTLP traces: one root span per termination, its stages
    // and its CRI and API calls below it, with the pod's attributes
    let s_uid = s.uid.to_string();
    let traced = |spans: &[otlp::ReceivedSpan]| {
        let root = spans
            .iter()
            .find(|r| r.name == "pod_termination" && r.attr("k8s.pod.uid") == Some(s_uid.as_str()));
        root.is_some_and(|root| {
            spans
                .iter()
                .any(|x| x.trace_id == root.trace_id && x.name == "DELETE pods")
        })
    };
    let spans = collector.wait_for(traced, Duration::from_secs(30)).await;
    let root = spans
        .iter()
        .find(|r| r.name == "pod_termination" && r.attr("k8s.pod.uid") == Some(s_uid.as_str()))
        .unwrap();
    assert_eq!(root.parent_span_id, None, "a root span: {root:?}");
    assert_eq!(root.attr("k8s.pod.namespace"), Some("default"));
    assert_eq!(root.attr("k8s.pod.name"), Some("stubborn"));
    assert_eq!(
        root.resource.get("service.name").map(String::as_str),
        Some("reaplet")
    );
    let trace: Vec<&otlp::ReceivedSpan> = spans
        .iter()
        .filter(|x| x.trace_id == root.trace_id)
        .collect();
    let named = |n: &str| {
        trace
            .iter()
            .find(|x| x.name == n)
            .unwrap_or_else(|| panic!("no {n} span in {trace:#?}"))
    };
    let parent_of = |x: &otlp::ReceivedSpan| {
        trace
            .iter()
            .find(|p| Some(&p.span_id) == x.parent_span_id.as_ref())
            .map(|p| p.name.clone())
    };
    for stage in [
        "kill",
        "volumes",
        "cgroup",
        "PATCH pods/status",
        "DELETE pods",
    ] {
        assert_eq!(
            parent_of(named(stage)).as_deref(),
            Some("pod_termination"),
            "{stage}"
        );
    }
    let stop = named("runtime.v1.RuntimeService/StopContainer");
    assert_eq!(parent_of(stop).as_deref(), Some("kill_container"));
    assert_eq!(parent_of(named("kill_container")).as_deref(), Some("kill"));
    assert!(
        stop.end_ns - stop.start_ns >= 2_900_000_000,
        "the 3 s stop: {stop:?}"
    );
    named("runtime.v1.RuntimeService/StopPodSandbox");
    // one trace per termination: the orphan's has no API calls, the hooked pod's is its own
    let roots: Vec<&otlp::ReceivedSpan> = spans
        .iter()
        .filter(|r| r.name == "pod_termination")
        .collect();
    let traces: std::collections::BTreeSet<&str> =
        roots.iter().map(|r| r.trace_id.as_str()).collect();
    assert_eq!(roots.len(), traces.len(), "{roots:#?}");
    assert!(
        roots.len() >= 3,
        "hooked, stubborn and the orphan: {roots:#?}"
    );
    println!(
        "OTLP: {} spans received, {} in stubborn's trace",
        spans.len(),
        trace.len()
    );

    // an unknown pod: a clear error, exit 1
    let (code, _, err) = pods_cmd(&address, &["--timeline", "default/nobody"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no termination timeline kept for default/nobody"),
        "{err}"
    );

    agent.kill().unwrap();
    agent.wait().unwrap();
}
