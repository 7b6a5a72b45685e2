use super::*;
use std::time::Duration;

fn uid(s: &str) -> PodUid {
    PodUid::parse(s).unwrap()
}

fn reason() -> Step {
    Step::Reason {
        reason: "deleted".into(),
        source: "api".into(),
        grace: 5,
        grace_from: GraceSource::Deletion,
        detail: None,
    }
}

#[tokio::test(start_paused = true)]
async fn steps_are_offsets_from_the_start_and_survive_a_json_round_trip() {
    let store = Timelines::new(2);
    let r = store.start(&uid("u1"), "default", "web");
    r.record(None, reason());
    tokio::time::sleep(Duration::from_millis(250)).await;
    r.record(Some("app"), Step::PreStopStarted);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    r.record(
        Some("app"),
        Step::PreStopEnded {
            ok: true,
            error: None,
        },
    );
    r.deadline(Instant::now() + Duration::from_secs(4));
    let t = store.find(&Query::parse("default/web")).unwrap();
    assert_eq!(t.entries.len(), 3);
    assert_eq!(t.entries[1].at_ms, 250.0);
    assert_eq!(t.entries[2].at_ms, 1250.0);
    assert_eq!(t.deadline_ms, Some(5250.0));
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!(json["entries"][1]["step"], "preStopStarted");
    assert_eq!(json["entries"][1]["container"], "app");
    assert_eq!(json["entries"][0]["graceFrom"], "deletion");
    let back = Timeline::from_json(json).unwrap();
    assert_eq!(back.entries, t.entries);
    assert_eq!(back.deadline_ms, t.deadline_ms);
    // by UID too
    assert!(store.find(&Query::parse("u1")).is_some());
    assert!(store.find(&Query::parse("default/other")).is_none());
}

#[tokio::test(start_paused = true)]
async fn finished_timelines_are_kept_up_to_the_setting_and_still_take_api_steps() {
    let store = Timelines::new(2);
    for i in 0..3 {
        let u = uid(&format!("u{i}"));
        store
            .start(&u, "default", &format!("p{i}"))
            .record(None, reason());
        store.finish(&u);
    }
    // the oldest rolled off
    assert!(store.find(&Query::parse("default/p0")).is_none());
    let t = store.find(&Query::parse("default/p2")).unwrap();
    assert!(t.finished_ms.is_some());
    assert_eq!(t.entries.last().unwrap().step, Step::Finished);
    store.record(&uid("u2"), Step::ObjectDeleted { code: 200 });
    let t = store.find(&Query::parse("u2")).unwrap();
    assert_eq!(
        t.entries.last().unwrap().step,
        Step::ObjectDeleted { code: 200 }
    );
    // one still terminating is kept whatever the setting, and named first over a finished
    // one of the same name
    let again = store.start(&uid("u9"), "default", "p2");
    again.record(None, reason());
    assert_eq!(store.find(&Query::parse("default/p2")).unwrap().uid, "u9");
    assert_eq!(store.all().len(), 3);
}

#[test]
fn a_retry_storm_is_cut_at_the_bound() {
    let store = Timelines::new(1);
    let r = store.start(&uid("u1"), "default", "web");
    for _ in 0..MAX_ENTRIES * 2 {
        r.record(
            None,
            Step::KillFailed {
                error: "refused".into(),
            },
        );
    }
    let t = r.snapshot().unwrap();
    assert_eq!(t.entries.len(), MAX_ENTRIES);
    assert_eq!(t.entries.last().unwrap().step, Step::Truncated);
}

fn sample() -> Timeline {
    let mut t = Timeline::new(&uid("u1"), "default", "web");
    let steps: Vec<(f64, Option<&str>, Step)> = vec![
        (0.0, None, reason()),
        (
            1.0,
            None,
            Step::KillStarted {
                attempt: 1,
                grace: 5,
            },
        ),
        (2.0, Some("app"), Step::PreStopStarted),
        (
            1010.0,
            Some("app"),
            Step::PreStopEnded {
                ok: true,
                error: None,
            },
        ),
        (
            1012.0,
            Some("app"),
            Step::StopSent {
                timeout: 4,
                kind: StopKind::Fresh,
            },
        ),
        (
            3.0,
            Some("sidecar"),
            Step::StopSent {
                timeout: 5,
                kind: StopKind::Fresh,
            },
        ),
        (5003.0, Some("sidecar"), Step::Sigkill),
        (
            5050.0,
            Some("sidecar"),
            Step::Exited {
                code: 137,
                signal: Some("SIGKILL".into()),
                before_kill: false,
            },
        ),
        (
            1300.0,
            Some("app"),
            Step::Exited {
                code: 0,
                signal: None,
                before_kill: false,
            },
        ),
        (
            5100.0,
            None,
            Step::SandboxStopped {
                sandbox: "0123456789abcdef".into(),
            },
        ),
        (5101.0, None, Step::ContainersStopped),
        (5102.0, None, Step::VolumesStarted),
        (5200.0, None, Step::VolumesDone { ok: true }),
        (
            5230.0,
            None,
            Step::CgroupRemoved {
                removed_dirs: 3,
                killed_pids: 0,
            },
        ),
        (5240.0, None, Step::Finished),
        (5260.0, None, Step::StatusWritten { code: 200 }),
        (5280.0, None, Step::ObjectDeleted { code: 200 }),
    ];
    for (at, c, s) in steps {
        t.push(at, c, s);
    }
    t.deadline_ms = Some(5001.0);
    t.finished_ms = Some(5240.0);
    t
}

#[test]
fn text_has_every_step_aligned_with_what_each_took() {
    let out = text::render(&sample());
    assert!(out.starts_with("default/web  (uid u1)\n"), "{out}");
    assert!(out.contains("grace deadline +5.001s"), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let header = lines.iter().position(|l| l.contains("STEP")).unwrap();
    let step_col = lines[header].find("STEP").unwrap();
    for l in &lines[header + 1..] {
        assert_eq!(&l[step_col - 2..step_col], "  ", "aligned: {l:?}");
    }
    assert_eq!(lines.len() - header - 1, 17);
    let hook = lines
        .iter()
        .find(|l| l.contains("preStop hook ended"))
        .unwrap();
    assert!(hook.contains("1008ms"), "{hook}");
    let kill = lines
        .iter()
        .find(|l| l.contains("exited 137 (SIGKILL)"))
        .unwrap();
    assert!(
        kill.contains("5047ms") && kill.contains("sidecar"),
        "{kill}"
    );
    assert!(out.contains("SIGTERM (StopContainer, timeout 4s)"));
    assert!(out.contains("grace 5s from deletionGracePeriodSeconds"));
    assert!(out.contains("object deleted, UID precondition (HTTP 200)"));
}

#[test]
fn svg_draws_the_deadline_where_the_data_says_and_marks_the_sigkill() {
    let t = sample();
    let svg = svg::render(&t);
    let l = svg::layout(&t);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(l.rows, 3, "pod, app, sidecar");
    let x = l.x(5001.0);
    assert!(
        svg.contains(&format!(r#"<line id="deadline" data-ms="5001" x1="{x}""#)),
        "{svg}"
    );
    assert_eq!(svg.matches(">SIGKILL</text>").count(), 1);
    // nothing else uses the deadline's red
    assert_eq!(
        svg.matches("rgb(255,0,0)").count(),
        2,
        "the line and its label"
    );
    // well-formed enough: every rect is self-closed or closed, every title closed
    let rects = svg.matches("<rect").count();
    let closed = svg
        .split("<rect")
        .skip(1)
        .filter(|r| {
            r.split('>').next().is_some_and(|head| head.ends_with('/')) || r.contains("</rect>")
        })
        .count();
    assert_eq!(rects, closed, "{svg}");
    assert_eq!(
        svg.matches("<title>").count(),
        svg.matches("</title>").count()
    );
    assert!(!svg.contains("NaN"));
}

#[test]
fn hostile_names_are_escaped_in_the_svg() {
    let mut t = Timeline::new(&uid("u1"), "ns", "<script>");
    t.push(0.0, Some("a&b\""), Step::PreStopStarted);
    let svg = svg::render(&t);
    assert!(!svg.contains("<script>"));
    assert!(svg.contains("&lt;script&gt;"));
    assert!(svg.contains("a&amp;b&quot;"));
}

#[test]
fn exit_codes_name_their_signal() {
    assert_eq!(signal_of(137), Some("SIGKILL"));
    assert_eq!(signal_of(143), Some("SIGTERM"));
    assert_eq!(signal_of(0), None);
    assert_eq!(signal_of(1), None);
}

#[test]
fn a_sandbox_id_of_any_text_is_shortened_without_a_panic() {
    let d = text::describe(&Step::SandboxStopped {
        sandbox: "ééééééééééééééé".into(),
    });
    assert_eq!(d, "sandbox ééééééééééééé stopped");
}
