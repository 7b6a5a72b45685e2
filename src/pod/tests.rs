//! Conversions from API objects and runtime labels, hostile values included.

use super::*;

fn pod_json(v: serde_json::Value) -> api::Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn uid_validation() {
    assert!(PodUid::parse("0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e").is_ok());
    assert!(PodUid::parse("6e2b9c1d5f4a3b2c1d0e9f8a7b6c5d4e").is_ok());
    for bad in [
        "",
        "../../etc",
        "a/b",
        ".",
        "..",
        "x\0y",
        "é",
        &"a".repeat(10_000),
    ] {
        assert!(PodUid::parse(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn grace_text() {
    assert_eq!(parse_grace("30"), Some(30));
    assert_eq!(parse_grace("-5"), Some(1));
    assert_eq!(
        parse_grace("99999999999999999999999999999999999999999999"),
        Some(i64::MAX)
    );
    assert_eq!(
        parse_grace("-99999999999999999999999999999999999999999999"),
        Some(1)
    );
    assert_eq!(parse_grace("abc"), None);
    assert_eq!(parse_grace(""), None);
}

#[test]
fn from_api_reads_what_matters() {
    let p = pod_json(serde_json::json!({
        "metadata": {"name": "web", "namespace": "prod", "uid": "0b2f4c1e-8f0a-4a52-9d61-3f2f0b1c2d3e",
                     "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 5},
        "spec": {
            "terminationGracePeriodSeconds": 60,
            "restartPolicy": "OnFailure",
            "hostNetwork": true,
            "initContainers": [
                {"name": "init", "image": "x"},
                {"name": "proxy", "image": "x", "restartPolicy": "Always"}
            ],
            "containers": [{"name": "app", "image": "x",
                "ports": [{"name": "http", "containerPort": 8080}],
                "lifecycle": {"preStop": {"httpGet": {"port": "http", "path": "/quit"}}}}]
        },
        "status": {"phase": "Running", "podIP": "10.1.2.3", "qosClass": "Burstable"}
    }));
    let i = PodInfo::from_api(&p).unwrap();
    assert_eq!(i.key(), "prod/web");
    assert_eq!(i.spec_grace, Some(60));
    assert!(i.deletion_requested);
    assert_eq!(i.deletion_grace, Some(5));
    assert_eq!(i.restart_policy, RestartPolicy::OnFailure);
    assert_eq!(i.sidecars.len(), 1);
    assert_eq!(i.sidecars[0].name, "proxy");
    assert!(i.host_network);
    assert_eq!(i.qos, QosClass::Burstable);
    assert!(!i.terminal_phase);
    match &i.containers[0].pre_stop {
        Some(Handler::HttpGet(g)) => assert_eq!(g.port, HookPort::Name("http".into())),
        other => panic!("{other:?}"),
    }
}

#[test]
fn from_api_rejects_hostile() {
    for uid in ["../../etc", "", &"a".repeat(10_240)] {
        let p = pod_json(serde_json::json!({
            "metadata": {"name": "x", "uid": uid},
            "spec": {"containers": []}
        }));
        assert!(matches!(
            PodInfo::from_api(&p),
            Err(PodError::InvalidUid { .. })
        ));
    }
    let p = pod_json(serde_json::json!({"metadata": {"name": "x"}, "spec": {"containers": []}}));
    assert!(matches!(
        PodInfo::from_api(&p),
        Err(PodError::Missing { .. })
    ));
    // negative and huge graces are carried as-is; the grace math clamps them
    let p = pod_json(serde_json::json!({
        "metadata": {"name": "x", "uid": "u1", "deletionGracePeriodSeconds": -7},
        "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": [
            {"name": "c", "image": "x", "lifecycle": {"preStop": {"httpGet": {"port": 70000}}}}]}
    }));
    assert!(matches!(
        PodInfo::from_api(&p),
        Err(PodError::InvalidHandler { .. })
    ));
}

#[test]
fn hostile_graces_in_the_api_object() {
    let p = pod_json(serde_json::json!({
        "metadata": {"name": "x", "uid": "u1", "deletionTimestamp": "2026-01-01T00:00:00Z",
                     "deletionGracePeriodSeconds": -7},
        "spec": {"terminationGracePeriodSeconds": i64::MAX, "containers": []}
    }));
    let i = PodInfo::from_api(&p).unwrap();
    assert_eq!(
        crate::terminating::grace::effective_grace(None, i.deletion_grace, None, i.spec_grace),
        1,
        "a negative deletion grace means 1"
    );
    let p = pod_json(serde_json::json!({
        "metadata": {"name": "x", "uid": "u1"},
        "spec": {"terminationGracePeriodSeconds": i64::MIN, "containers": []}
    }));
    let i = PodInfo::from_api(&p).unwrap();
    assert_eq!(
        crate::terminating::grace::effective_grace(None, None, None, i.spec_grace),
        1
    );
    // a value beyond i64 is not a pod: the decoder rejects it (the source logs and skips)
    let r: Result<api::Pod, _> = serde_json::from_str(
        r#"{"metadata":{"uid":"u1"},"spec":{"terminationGracePeriodSeconds":99999999999999999999999,"containers":[]}}"#,
    );
    assert!(r.is_err());
}

#[test]
fn group_runtime_skips_hostile_uids() {
    let sb = |id: &str, uid: &str| RuntimeSandbox {
        id: id.into(),
        pod_uid: uid.into(),
        pod_name: String::new(),
        pod_namespace: String::new(),
        ready: true,
        created_at: 0,
        labels: HashMap::new(),
        annotations: HashMap::new(),
    };
    let long = "a".repeat(10_240);
    let sbs = vec![
        sb("s1", "../../etc"),
        sb("s2", ""),
        sb("s3", &long),
        sb("s4", "good"),
    ];
    let g = group_runtime(&sbs, &[]);
    assert_eq!(g.pods.len(), 1);
    assert_eq!(g.invalid, vec!["s1", "s2", "s3"]);
}

proptest::proptest! {
    #[test]
    fn uid_parse_never_panics_and_accepted_uids_are_path_safe(s in "\\PC{0,80}") {
        if let Ok(u) = PodUid::parse(&s) {
            let p = std::path::Path::new("/root").join(u.as_str());
            proptest::prop_assert_eq!(p.parent(), Some(std::path::Path::new("/root")));
            proptest::prop_assert!(p.components().all(|c| !matches!(c, std::path::Component::ParentDir)));
        }
    }

    #[test]
    fn parse_grace_never_panics(s in "\\PC{0,60}") {
        if let Some(g) = parse_grace(&s) {
            proptest::prop_assert!(g >= 0);
        }
    }
}

#[test]
fn qos_fallback() {
    let spec = |res: serde_json::Value| -> api::PodSpec {
        serde_json::from_value(serde_json::json!({"containers": [{"name": "c", "resources": res}]}))
            .unwrap()
    };
    assert_eq!(
        qos_from_spec(&spec(serde_json::json!({}))),
        QosClass::BestEffort
    );
    assert_eq!(
        qos_from_spec(&spec(
            serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}})
        )),
        QosClass::Guaranteed
    );
    assert_eq!(
        qos_from_spec(&spec(serde_json::json!({"requests": {"cpu": "1"}}))),
        QosClass::Burstable
    );
}

#[test]
fn orphan_spec_from_labels() {
    let mut ann = HashMap::new();
    ann.insert(cri::ANNOTATION_GRACE.to_string(), "45".to_string());
    ann.insert(
        cri::ANNOTATION_PRESTOP.to_string(),
        r#"{"exec":{"command":["/bin/sh","-c","sleep 1"]}}"#.to_string(),
    );
    let mut labels = HashMap::new();
    labels.insert(cri::LABEL_POD_NAME.to_string(), "p".to_string());
    labels.insert(cri::LABEL_POD_NAMESPACE.to_string(), "ns".to_string());
    let c = RuntimeContainer {
        id: "c1".into(),
        sandbox_id: "s1".into(),
        name: "app".into(),
        attempt: 0,
        pod_uid: "u1".into(),
        state: cri::ContainerRunState::Running,
        created_at: 1,
        labels: labels.clone(),
        annotations: ann.clone(),
    };
    let mut bad = c.clone();
    bad.name = "side".into();
    bad.annotations
        .insert(cri::ANNOTATION_PRESTOP.into(), "{not json".into());
    bad.annotations.insert(
        cri::ANNOTATION_GRACE.into(),
        "-99999999999999999999999".into(),
    );
    bad.created_at = 0;
    let uid = PodUid::parse("u1").unwrap();
    let info = PodInfo::from_runtime(&uid, &[], &[&c, &bad]);
    assert_eq!(info.key(), "ns/p");
    assert_eq!(info.spec_grace, Some(45));
    assert!(matches!(
        info.containers[0].pre_stop,
        Some(Handler::Exec { .. })
    ));
    assert_eq!(info.containers[1].pre_stop, None);
}

/// `ContainerShouldRestart` with `ContainerRestartRules`: the first matching rule, then the
/// container's policy, then the pod's.
#[test]
fn container_restart_rules_decide_whether_a_container_restarts() {
    let p = pod_json(serde_json::json!({
        "metadata": {"name": "p", "namespace": "d", "uid": "u1"},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "plain"},
            {"name": "retry-42", "restartPolicy": "Never", "restartPolicyRules": [
                {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]},
            {"name": "always-but", "restartPolicy": "Always"},
            {"name": "fail-unless-0", "restartPolicy": "OnFailure", "restartPolicyRules": [
                {"action": "Unknown", "exitCodes": {"operator": "NotIn", "values": [0]}},
                {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [1, 2]}}]},
        ]}
    }));
    let i = PodInfo::from_api(&p).unwrap();
    let c = |n: &str| i.container(n).unwrap();
    let pol = i.restart_policy;
    assert_eq!(pol, RestartPolicy::Never);
    // no policy of its own: the pod's
    assert!(!c("plain").should_restart(pol, 1));
    assert!(!c("plain").always_restarts(pol));
    assert!(c("plain").should_restart(RestartPolicy::OnFailure, 1));
    // a rule matching the exit code restarts a Never container; others fall to Never
    assert!(c("retry-42").should_restart(pol, 42));
    assert!(!c("retry-42").should_restart(pol, 0));
    assert!(!c("retry-42").should_restart(pol, 1));
    // its own Always beats the pod's Never
    assert!(c("always-but").always_restarts(pol));
    assert!(c("always-but").should_restart(pol, 0));
    // an unknown action falls through; NotIn [1, 2] restarts 3 and 0 (a rule, not the
    // policy: OnFailure alone would not restart 0); 1 by OnFailure
    let f = c("fail-unless-0");
    assert!(f.should_restart(pol, 3));
    assert!(f.should_restart(pol, 0));
    assert!(f.should_restart(pol, 1));
    assert!(!f.always_restarts(pol));
}
