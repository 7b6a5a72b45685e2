//! Hostile input, as properties (no root needed): whatever a pod object, a runtime object's
//! labels and annotations, or a mountinfo file hold, turning them into worker inputs never
//! panics, and what comes out keeps the invariants the pipeline relies on (grace >= 1 and only
//! ever decreasing, UIDs that stay one path component). Cases per property: `PROPTEST_CASES`
//! (default 2,000 here); failures are shrunk and saved under `proptest-regressions/`.

use proptest::prelude::*;
use reaplet::cri::{self, ContainerRunState, RuntimeContainer, RuntimeSandbox};
use reaplet::pod::{PodInfo, PodUid, group_runtime};
use reaplet::terminating::grace;
use std::collections::HashMap;
use std::path::{Component, Path};

fn cases() -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    ProptestConfig::with_cases(n)
}

/// Strings that are sometimes sensible and sometimes not.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9-]{1,20}",
        "\\PC{0,40}",
        Just("../../etc".to_owned()),
        Just("18ea7707-26f2-4dbb-85ee-ffc138276e94".to_owned()),
    ]
}

fn number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        (-5i64..100).prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
        text().prop_map(serde_json::Value::from),
    ]
}

fn handler() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::Value::Null),
        prop::collection::vec(text(), 0..4)
            .prop_map(|c| serde_json::json!({"exec": {"command": c}})),
        (number(), text(), text()).prop_map(|(port, path, scheme)| {
            serde_json::json!({"httpGet": {"port": port, "path": path, "scheme": scheme}})
        }),
        number().prop_map(|s| serde_json::json!({"sleep": {"seconds": s}})),
        text().prop_map(|t| serde_json::json!({ "tcpSocket": {"port": t} })),
    ]
}

fn container() -> impl Strategy<Value = serde_json::Value> {
    (text(), handler(), prop::option::of(text())).prop_map(|(name, pre_stop, restart)| {
        let mut c = serde_json::json!({"name": name, "image": "x"});
        if !pre_stop.is_null() {
            c["lifecycle"] = serde_json::json!({ "preStop": pre_stop });
        }
        if let Some(r) = restart {
            c["restartPolicy"] = r.into();
        }
        c
    })
}

fn pod() -> impl Strategy<Value = serde_json::Value> {
    (
        (text(), text(), text(), prop::option::of(text()), number()),
        (
            number(),
            text(),
            prop::collection::vec(container(), 0..4),
            prop::collection::vec(container(), 0..3),
            text(),
            prop::option::of(text()),
        ),
    )
        .prop_map(
            |(
                (name, ns, uid, deletion_ts, deletion_grace),
                (spec_grace, policy, cs, inits, node, phase),
            )| {
                let mut meta = serde_json::json!({"name": name, "namespace": ns, "uid": uid});
                if let Some(ts) = deletion_ts {
                    // sometimes a valid timestamp, sometimes not
                    meta["deletionTimestamp"] = if ts.len() % 2 == 0 {
                        "2026-11-22T20:00:00Z".into()
                    } else {
                        ts.into()
                    };
                    meta["deletionGracePeriodSeconds"] = deletion_grace;
                }
                serde_json::json!({
                    "apiVersion": "v1", "kind": "Pod", "metadata": meta,
                    "spec": {
                        "terminationGracePeriodSeconds": spec_grace,
                        "restartPolicy": policy,
                        "containers": cs,
                        "initContainers": inits,
                        "nodeName": node,
                    },
                    "status": {"phase": phase},
                })
            },
        )
}

fn path_safe(uid: &PodUid) -> bool {
    let p = Path::new("/root").join(uid.as_str());
    p.parent() == Some(Path::new("/root"))
        && p.components().all(|c| !matches!(c, Component::ParentDir))
}

fn labels() -> impl Strategy<Value = HashMap<String, String>> {
    let key = prop_oneof![
        Just(cri::LABEL_POD_UID.to_owned()),
        Just(cri::LABEL_POD_NAME.to_owned()),
        Just(cri::LABEL_POD_NAMESPACE.to_owned()),
        Just(cri::LABEL_CONTAINER_NAME.to_owned()),
        Just(cri::ANNOTATION_GRACE.to_owned()),
        Just(cri::ANNOTATION_PRESTOP.to_owned()),
        Just(cri::ANNOTATION_RESTART_COUNT.to_owned()),
        text(),
    ];
    let value = prop_oneof![
        text(),
        number().prop_map(|n| n.to_string()),
        handler().prop_map(|h| h.to_string()),
    ];
    prop::collection::hash_map(key, value, 0..8)
}

proptest! {
    #![proptest_config(cases())]

    /// A pod object (as the watch or a manifest delivers it) becomes worker inputs or a clear
    /// error; never a panic, never a grace below 1, never a grace that grows once held.
    #[test]
    fn pod_object_to_worker_inputs(v in pod()) {
        let Ok(p) = serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(v) else {
            return Ok(());
        };
        if let Ok(info) = PodInfo::from_api(&p) {
            prop_assert!(path_safe(&info.uid));
            let g = grace::effective_grace(None, info.deletion_grace, None, info.spec_grace);
            prop_assert!(g >= 1);
            // a held grace only ever decreases, whatever the object or a kill asks for
            for ask in [Some(0), Some(1), Some(i64::MAX), None] {
                let again = grace::effective_grace(Some(g), info.deletion_grace, ask, info.spec_grace);
                prop_assert!(again <= g && again >= 1, "{g} -> {again} for {ask:?}");
            }
            // the API's deletion grace, when set, is never exceeded
            if let Some(d) = info.deletion_grace {
                prop_assert!(g <= d.max(1));
            }
        }
    }

    /// CRI labels and annotations (what the kubelet wrote, or anything at all) become an
    /// orphan's spec; invalid UIDs are set aside, never used.
    #[test]
    fn runtime_labels_to_orphan_spec(
        sb_labels in labels(), sb_ann in labels(),
        c_labels in prop::collection::vec((labels(), labels()), 0..4),
        uid in text(),
    ) {
        let sandboxes = vec![RuntimeSandbox {
            id: "sb".into(),
            pod_uid: uid.clone(),
            pod_name: "n".into(),
            pod_namespace: "ns".into(),
            ready: true,
            created_at: 1,
            labels: sb_labels,
            annotations: sb_ann,
        }];
        let containers: Vec<RuntimeContainer> = c_labels
            .into_iter()
            .enumerate()
            .map(|(i, (labels, annotations))| RuntimeContainer {
                id: format!("c{i}"),
                sandbox_id: "sb".into(),
                name: labels.get(cri::LABEL_CONTAINER_NAME).cloned().unwrap_or_default(),
                attempt: 0,
                pod_uid: labels.get(cri::LABEL_POD_UID).cloned().unwrap_or_else(|| uid.clone()),
                state: ContainerRunState::Running,
                created_at: 1,
                labels,
                annotations,
            })
            .collect();
        let g = group_runtime(&sandboxes, &containers);
        for (u, (sbs, cs)) in &g.pods {
            prop_assert!(path_safe(u));
            let info = PodInfo::from_runtime(u, sbs, cs);
            prop_assert_eq!(&info.uid, u);
            if let Some(s) = info.spec_grace {
                prop_assert!(s >= 0);
            }
        }
        // exactly: a valid sandbox UID groups the sandbox and every container (the sandbox's
        // UID wins over a container's own label); an invalid one sets everything aside
        match reaplet::pod::PodUid::parse(&uid) {
            Ok(valid) => {
                prop_assert_eq!(g.pods.len(), 1);
                let (sbs, cs) = &g.pods[&valid];
                prop_assert_eq!(sbs.len(), 1);
                prop_assert_eq!(cs.len(), containers.len());
                prop_assert!(g.invalid.is_empty());
            }
            Err(_) => {
                prop_assert!(g.invalid.contains(&"sb".to_owned()));
                let grouped: usize = g.pods.values().map(|(s, c)| s.len() + c.len()).sum();
                prop_assert_eq!(grouped + g.invalid.len(), 1 + containers.len());
            }
        }
    }

    /// mountinfo (any text, or lines of whitespace-free fields with hostile escapes) parses
    /// without a panic; a well-formed line's mount point stays absolute after unescaping.
    #[test]
    fn mountinfo_parsing(
        junk in "\\PC{0,300}",
        lines in prop::collection::vec(
            (any::<u16>(), "/[a-z0-9._-]{0,20}", "[a-z0-9._-]{1,20}", "[a-z0-9]{1,20}", "[a-z0-9=,]{1,20}"),
            0..20,
        ),
    ) {
        let _ = reaplet::volumes::parse_mountinfo(&junk);
        let text: String = lines
            .iter()
            .map(|(id, root, mp, fs, opts)| {
                format!("{id} 1 0:1 {root} /{mp}\\040x\\134 rw - {fs} src {opts}\n")
            })
            .collect();
        // exactly: every well-formed line is one mount, its escapes (space, backslash) undone
        let mounts = reaplet::volumes::parse_mountinfo(&text);
        prop_assert_eq!(mounts.len(), lines.len());
        for (m, (_, _, mp, fs, _)) in mounts.iter().zip(&lines) {
            prop_assert_eq!(&m.mount_point, &std::path::PathBuf::from(format!("/{mp} x\\")));
            prop_assert_eq!(&m.fs_type, fs);
        }
    }
}

/// Graces a hostile object or kill may carry: anything at all, and the edges.
fn grace_value() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        any::<i64>().prop_map(Some),
        (-3i64..40).prop_map(Some),
        Just(Some(i64::MAX)),
        Just(Some(i64::MIN)),
        Just(Some(0)),
    ]
}

fn lifecycle_input() -> impl Strategy<Value = reaplet::lifecycle::Input> {
    use reaplet::lifecycle::{CleanupStage, Input, KillReason};
    let reason = prop_oneof![
        Just(KillReason::Deleted),
        Just(KillReason::TerminalPhase),
        Just(KillReason::Completed),
        Just(KillReason::ObjectGone),
        Just(KillReason::ManifestRemoved),
        Just(KillReason::Orphan),
    ];
    prop_oneof![
        (any::<bool>(), grace_value(), any::<bool>(), grace_value()).prop_map(
            |(deletion_requested, deletion_grace, terminal_phase, spec_grace)| Input::Update {
                deletion_requested,
                deletion_grace,
                terminal_phase,
                spec_grace,
            }
        ),
        (grace_value(), reason).prop_map(|(grace_override, reason)| Input::Kill {
            grace_override,
            reason
        }),
        (0u64..6, any::<bool>()).prop_map(|(generation, ok)| Input::KillDone { generation, ok }),
        (any::<bool>(), any::<bool>()).prop_map(|(v, ok)| Input::CleanupDone {
            stage: if v {
                CleanupStage::Volumes
            } else {
                CleanupStage::Cgroup
            },
            ok
        }),
        Just(Input::RetryDue),
    ]
}

proptest! {
    #![proptest_config(cases())]

    /// Any sequence of inputs with any graces through `lifecycle::step`, and the kill deadline
    /// of every state on the way: never a panic; the phase only moves forward; the grace held
    /// is at least 1 and only ever decreases; a kill's grace is the one held.
    #[test]
    fn lifecycle_step_survives_any_input(
        spec in grace_value(),
        inputs in prop::collection::vec(lifecycle_input(), 0..24),
    ) {
        use reaplet::lifecycle::{Effect, PodMachine, step};
        let mut m = PodMachine::new(spec);
        let now = tokio::time::Instant::now();
        let mut phase = m.lifecycle.phase();
        let mut held: Option<i64> = None;
        for input in inputs {
            for e in step(&mut m, input, now) {
                if let Effect::StartKill { grace, .. } = e {
                    prop_assert_eq!(Some(grace), m.grace);
                }
            }
            let _ = m.kill_deadline();
            prop_assert!(m.lifecycle.phase() >= phase, "{:?} -> {:?}", phase, m.lifecycle.phase());
            phase = m.lifecycle.phase();
            if let Some(g) = m.grace {
                prop_assert!(g >= 1);
                prop_assert!(held.is_none_or(|h| g <= h), "{held:?} -> {g}");
                held = Some(g);
            }
        }
    }
}
