//! Unit tests of the config module (layers, reaplet's own file, kinds).
use super::*;

fn raw() -> RawSettings {
    RawSettings::default()
}

#[test]
fn defaults_are_valid() {
    let s = resolve(raw()).unwrap();
    assert_eq!(s.root_dir, PathBuf::from("/var/lib/kubelet"));
    assert_eq!(
        s.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(s.metrics_bind_address.to_string(), DEFAULT_METRICS_ADDRESS);
    assert!(s.metrics_bind_address.ip().is_loopback());
    assert_eq!(s.cgroup_driver, None);
    assert_eq!(s.kube_api_qps, 100.0);
}

/// Every field, with an invalid value, fails naming that field.
pub const INVALID: &[(&str, &str)] = &[
    ("kubeconfig", "relative/kubeconfig"),
    ("kubeletConfig", "relative/config.yaml"),
    ("hostnameOverride", "Not_A_Node!"),
    ("containerRuntimeEndpoint", "tcp://10.0.0.1:1234"),
    ("runtimeRequestTimeout", "soon"),
    ("rootDir", "var/lib/kubelet"),
    ("cgroupDriver", "openrc"),
    ("cgroupRoot", "../escape"),
    ("cgroupsPerQOS", "maybe"),
    ("podManifestPath", "manifests"),
    ("fileCheckFrequency", "1ns"),
    ("kubeAPIQPS", "-3"),
    ("kubeAPIBurst", "0"),
    ("eventRecordQPS", "many"),
    ("eventBurst", "-1"),
    ("terminationTimelines", "100001"),
    ("metricsBindAddress", "localhost"),
    ("logFormat", "xml"),
    ("volumeUnmountTimeout", "0s"),
    ("relistPeriod", "10ms"),
    ("relistPeriodWithEvents", "500ms"),
    ("containerEvents", "yes"),
    ("authority", "secondary"),
    ("kubeletHealthzURL", "https://127.0.0.1:10248/healthz"),
    ("healthzPort", "65536"),
    ("healthzBindAddress", "not an address"),
    ("takeoverAfter", "10s"),
    ("enableTaintManager", "on"),
    ("enforceNodeAffinity", "1"),
    ("nodeAffinityNamespaces", "Kube_System"),
    ("nodeAffinitySelector", "app=a b"),
    ("nodeAffinitySettle", "soon"),
    ("evictionDryRun", "maybe"),
    ("shutdownGracePeriod", "500ms"),
    ("shutdownGracePeriodCriticalPods", "-3s"),
    (
        "shutdownGracePeriodByPodPriority",
        "[{\"priority\": 1, \"shutdownGracePeriodSeconds\": -1}]",
    ),
    ("tracing.endpoint", "https://collector:4317"),
    ("tracing.samplingRatePerMillion", "1000001"),
    ("evictionHard", "nodefs.available<101%"),
    ("evictionSoft", "memory.available=1Gi"),
    ("evictionSoftGracePeriod", "memory.available=-1m"),
    ("evictionMinimumReclaim", "memory.available=-1Gi"),
    ("evictionMaxPodGracePeriod", "30s"),
    ("evictionPressureTransitionPeriod", "soon"),
    ("mergeDefaultEvictionSettings", "yes"),
    ("enforceNodeAllocatable", "pods,none"),
];

fn set(field: &str, v: &str) -> RawSettings {
    let mut r = raw();
    let v = Some(v.to_string());
    match field {
        "kubeconfig" => r.kubeconfig = v,
        "kubeletConfig" => r.kubelet_config = v,
        "hostnameOverride" => r.hostname_override = v,
        "containerRuntimeEndpoint" => r.container_runtime_endpoint = v,
        "runtimeRequestTimeout" => r.runtime_request_timeout = v,
        "rootDir" => r.root_dir = v,
        "cgroupDriver" => r.cgroup_driver = v,
        "cgroupRoot" => r.cgroup_root = v,
        "cgroupsPerQOS" => r.cgroups_per_qos = v,
        "podManifestPath" => r.pod_manifest_path = v,
        "fileCheckFrequency" => r.file_check_frequency = v,
        "kubeAPIQPS" => r.kube_api_qps = v,
        "kubeAPIBurst" => r.kube_api_burst = v,
        "eventRecordQPS" => r.event_qps = v,
        "eventBurst" => r.event_burst = v,
        "terminationTimelines" => r.termination_timelines = v,
        "metricsBindAddress" => r.metrics_bind_address = v,
        "logFormat" => r.log_format = v,
        "volumeUnmountTimeout" => r.volume_unmount_timeout = v,
        "relistPeriod" => r.relist_period = v,
        "relistPeriodWithEvents" => r.relist_period_with_events = v,
        "containerEvents" => r.container_events = v,
        "authority" => r.authority = v,
        "kubeletHealthzURL" => r.kubelet_healthz_url = v,
        "healthzPort" => r.healthz_port = v,
        "healthzBindAddress" => r.healthz_bind_address = v,
        "takeoverAfter" => r.takeover_after = v,
        "enableTaintManager" => r.enable_taint_manager = v,
        "enforceNodeAffinity" => r.enforce_node_affinity = v,
        "nodeAffinityNamespaces" => r.node_affinity_namespaces = v,
        "nodeAffinitySelector" => r.node_affinity_selector = v,
        "nodeAffinitySettle" => r.node_affinity_settle = v,
        "evictionDryRun" => r.eviction_dry_run = v,
        "shutdownGracePeriod" => r.shutdown_grace_period = v,
        "shutdownGracePeriodCriticalPods" => r.shutdown_grace_period_critical_pods = v,
        "shutdownGracePeriodByPodPriority" => r.shutdown_grace_period_by_pod_priority = v,
        "tracing.endpoint" => r.tracing_endpoint = v,
        "tracing.samplingRatePerMillion" => r.tracing_sampling_rate_per_million = v,
        "evictionHard" => r.eviction_hard = v.map(Given::Text),
        "evictionSoft" => r.eviction_soft = v.map(Given::Text),
        "evictionSoftGracePeriod" => r.eviction_soft_grace_period = v.map(Given::Text),
        "evictionMinimumReclaim" => r.eviction_minimum_reclaim = v.map(Given::Text),
        "evictionMaxPodGracePeriod" => r.eviction_max_pod_grace_period = v,
        "evictionPressureTransitionPeriod" => r.eviction_pressure_transition_period = v,
        "mergeDefaultEvictionSettings" => r.merge_default_eviction_settings = v,
        "enforceNodeAllocatable" => r.enforce_node_allocatable = v.map(Given::Text),
        _ => panic!("unknown field {field}"),
    }
    r
}

#[test]
fn every_invalid_field_is_named() {
    for (field, value) in INVALID {
        let e = resolve(set(field, value)).unwrap_err();
        assert_eq!(e.field, *field, "{value:?}: {e}");
        assert!(e.to_string().contains(field));
    }
}

#[test]
fn precedence_flags_over_env_over_file_over_defaults() {
    let file = RawSettings {
        root_dir: Some("/file".into()),
        cgroup_root: Some("/f".into()),
        log_format: Some("json".into()),
        ..raw()
    };
    let env = RawSettings {
        root_dir: Some("/env".into()),
        cgroup_root: Some("/e".into()),
        ..raw()
    };
    let flags = RawSettings {
        root_dir: Some("/flag".into()),
        ..raw()
    };
    let s = resolve(flags.over(env.over(file))).unwrap();
    assert_eq!(s.root_dir, PathBuf::from("/flag"));
    assert_eq!(s.cgroup_root, "/e");
    assert_eq!(s.log_format, LogFormat::Json);
    assert_eq!(s.file_check_frequency, Duration::from_secs(1), "default");
}

#[test]
fn config_file_in_camel_case() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.yaml");
    std::fs::write(&f, "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\nrootDir: /srv/kubelet\nkubeAPIQPS: 50\nkubeAPIBurst: 100\ncgroupDriver: systemd\nruntimeRequestTimeout: 1m30s\n").unwrap();
    let s = resolve(RawSettings::from_file(&f).unwrap()).unwrap();
    assert_eq!(s.root_dir, PathBuf::from("/srv/kubelet"));
    assert_eq!(s.kube_api_qps, 50.0);
    assert_eq!(s.kube_api_burst, 100);
    assert_eq!(s.cgroup_driver, Some(CgroupDriver::Systemd));
    assert_eq!(s.runtime_request_timeout, Duration::from_secs(90));
    std::fs::write(&f, "rootDirr: /x\n").unwrap();
    let e = RawSettings::from_file(&f).unwrap_err();
    assert!(e.why.contains("rootDirr"), "{e}");
    std::fs::write(&f, "rootDir: [a, b]\n").unwrap();
    assert_eq!(RawSettings::from_file(&f).unwrap_err().field, "rootDir");
    assert_eq!(
        RawSettings::from_file(&dir.path().join("missing"))
            .unwrap_err()
            .field,
        "config"
    );
}

#[test]
fn config_scalars_are_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.yaml");
    let read = |text: &str| {
        std::fs::write(&f, text).unwrap();
        RawSettings::from_file(&f)
    };
    // YAML 1.1 booleans, leading zeros and underscores are strings, as written
    let r = read("hostnameOverride: yes\nkubeAPIBurst: 012\neventBurst: 1_000\n").unwrap();
    assert_eq!(r.hostname_override.as_deref(), Some("yes"));
    assert_eq!(r.kube_api_burst.as_deref(), Some("012"));
    assert_eq!(r.event_burst.as_deref(), Some("1_000"));
    let r = read("kubeAPIQPS: 2.5\nkubeAPIBurst: 7\nlogFormat: ~\n").unwrap();
    assert_eq!(r.kube_api_qps.as_deref(), Some("2.5"));
    assert_eq!(r.kube_api_burst.as_deref(), Some("7"));
    assert_eq!(r.log_format, None);
    // a non-finite float is a string that fails as a number, naming its field
    let e = resolve(read("kubeAPIQPS: .inf\n").unwrap()).unwrap_err();
    assert_eq!(e.field, "kubeAPIQPS", "{e}");
    // duplicate keys, a non-mapping and broken YAML: one-line errors about the file
    for text in ["rootDir: /a\nrootDir: /b\n", "- a\n", "rootDir: [a\n"] {
        let e = read(text).unwrap_err();
        assert_eq!(e.field, "config", "{text:?}: {e}");
        assert!(!e.to_string().contains('\n'), "{text:?}: {e}");
    }
    assert_eq!(read("# nothing\n").unwrap(), RawSettings::default());
    assert_eq!(read("rootDir: {a: b}\n").unwrap_err().field, "rootDir");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
    // Go's time.Duration.String() forms, as the kubelet's file has them
    assert_eq!(
        parse_duration("4h0m0s").unwrap(),
        Duration::from_secs(4 * 3600)
    );
    assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
    assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
    assert_eq!(parse_duration("250µs").unwrap(), Duration::from_micros(250));
    assert_eq!(parse_duration("10ns").unwrap(), Duration::from_nanos(10));
    for bad in ["", "s", "1x", "-1s", "1e999s", "abc"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_file_key_has_an_invalid_case() {
    let mut named: Vec<&str> = INVALID.iter().map(|(f, _)| *f).collect();
    let mut fields = FIELDS.to_vec();
    named.sort();
    fields.sort();
    assert_eq!(named, fields);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f
}

const KUBELET_HEADER: &str =
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

#[test]
fn file_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // no header: reaplet's own, as before kinds existed
    let f = write(d, "a.yaml", "rootDir: /srv\n");
    assert!(
        matches!(ConfigFile::read(&f).unwrap(), ConfigFile::Reaplet(r) if r.root_dir.as_deref() == Some("/srv"))
    );
    let f = write(
        d,
        "b.yaml",
        "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\nrootDir: /srv\n",
    );
    assert!(matches!(
        ConfigFile::read(&f).unwrap(),
        ConfigFile::Reaplet(_)
    ));
    let f = write(d, "c.yaml", &format!("{KUBELET_HEADER}staticPodPath: /m\n"));
    assert!(matches!(
        ConfigFile::read(&f).unwrap(),
        ConfigFile::Kubelet(_)
    ));
    assert_eq!(RawSettings::from_file(&f).unwrap_err().field, "kind");
    for (text, field) in [
        ("apiVersion: v1\nkind: Pod\n", "kind"),
        (
            "apiVersion: reaplet.io/v1\nkind: ReapletConfiguration\n",
            "apiVersion",
        ),
        ("kind: KubeletConfiguration\n", "apiVersion"),
        (
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            "apiVersion",
        ),
        ("apiVersion: reaplet.io/v1alpha1\n", "kind"),
        ("apiVersion: reaplet.io/v1alpha1\nkind: [a]\n", "kind"),
        // unknown keys in reaplet's own kind stay errors
        (
            "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\nstaticPodPath: /m\n",
            "config",
        ),
    ] {
        let f = write(d, "x.yaml", text);
        let e = ConfigFile::read(&f).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

#[test]
fn load_layers_flags_env_reaplet_file_kubelet_file_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubelet = write(
        d,
        "kubelet.yaml",
        &format!(
            "{KUBELET_HEADER}staticPodPath: /k/manifests\ncgroupRoot: /k\nkubeAPIQPS: 7\nkubeAPIBurst: 9\ncgroupDriver: cgroupfs\nshutdownGracePeriod: 30s\n"
        ),
    );
    let own = write(
        d,
        "reaplet.yaml",
        &format!(
            "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\nkubeletConfig: {}\ncgroupRoot: /r\nkubeAPIQPS: 8\n",
            kubelet.display()
        ),
    );
    let flags_env = RawSettings {
        cgroup_root: Some("/flag".into()),
        ..RawSettings::default()
    };
    let l = load(flags_env, Some(&own)).unwrap();
    let s = &l.settings;
    assert_eq!(s.cgroup_root, "/flag", "flags over both files");
    assert_eq!(s.kube_api_qps, 8.0, "reaplet's file over the kubelet's");
    assert_eq!(s.kube_api_burst, 9, "the kubelet's file over the defaults");
    assert_eq!(
        s.pod_manifest_path, None,
        "the kubelet's staticPodPath is not reaplet's"
    );
    assert_eq!(s.shutdown.grace_period, Duration::from_secs(30));
    assert_eq!(s.event_burst, 50, "default");
    assert_eq!(s.kubelet_config.as_deref(), Some(kubelet.as_path()));
    assert_eq!(l.kubelet.unwrap().path, kubelet);
    // the kubelet's file as --config itself
    let l = load(RawSettings::default(), Some(&kubelet)).unwrap();
    assert_eq!(l.settings.cgroup_root, "/k");
    // --kubelet-config with the kubelet's file as --config: which one is meant is unclear
    let flags_env = RawSettings {
        kubelet_config: Some(kubelet.display().to_string()),
        ..RawSettings::default()
    };
    assert_eq!(
        load(flags_env.clone(), Some(&kubelet)).unwrap_err().field,
        "kubeletConfig"
    );
    // --kubelet-config alone
    assert_eq!(load(flags_env, None).unwrap().settings.kube_api_qps, 7.0);
    // kubeletConfig naming reaplet's own kind, a missing file, a relative path
    for (named, field) in [
        (own.display().to_string(), "kind"),
        ("/nonexistent/config.yaml".to_string(), "kubeletConfig"),
        ("relative.yaml".to_string(), "kubeletConfig"),
    ] {
        let flags_env = RawSettings {
            kubelet_config: Some(named.clone()),
            ..RawSettings::default()
        };
        let e = load(flags_env, None).unwrap_err();
        assert_eq!(e.field, field, "{named}: {e}");
    }
}

#[test]
fn authority_defaults_to_auto_beside_the_kubelets_healthz_after_40s() {
    use crate::standby::AuthoritySetting;
    let s = resolve(raw()).unwrap();
    assert_eq!(s.authority, AuthoritySetting::Auto);
    assert_eq!(
        s.kubelet_healthz_url.as_deref(),
        Some("http://127.0.0.1:10248/healthz")
    );
    assert_eq!(s.takeover_after, Duration::from_secs(40));
    let s = resolve(RawSettings {
        authority: Some("standby".into()),
        kubelet_healthz_url: Some("http://[::1]:9999/healthz".into()),
        takeover_after: Some("25s".into()),
        ..raw()
    })
    .unwrap();
    assert_eq!(s.authority, AuthoritySetting::Standby);
    assert_eq!(
        s.kubelet_healthz_url.as_deref(),
        Some("http://[::1]:9999/healthz")
    );
    assert_eq!(s.takeover_after, Duration::from_secs(25));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.yaml");
    std::fs::write(
        &f,
        "authority: primary\nkubeletHealthzURL: http://127.0.0.1:1/healthz\ntakeoverAfter: 1m\n",
    )
    .unwrap();
    let s = resolve(RawSettings::from_file(&f).unwrap()).unwrap();
    assert_eq!(s.authority, AuthoritySetting::Primary);
    assert_eq!(
        s.kubelet_healthz_url.as_deref(),
        Some("http://127.0.0.1:1/healthz")
    );
    assert_eq!(s.takeover_after, Duration::from_secs(60));
    for v in ["primary", "standby", "auto"] {
        let s = resolve(set("authority", v)).unwrap();
        assert_eq!(s.authority.as_str(), v);
    }
}

/// The shutdown settings with the kubelet's names in reaplet's own file and flags, each field
/// over the kubelet's file's, checked once merged.
#[test]
fn shutdown_settings_from_reaplets_file_flags_and_the_kubelets() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = write(
        dir.path(),
        "kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n",
    );
    let own = write(
        dir.path(),
        "reaplet.yaml",
        "shutdownGracePeriodByPodPriority:\n\
         - priority: 100000\n  shutdownGracePeriodSeconds: 6\n\
         - priority: 0\n  shutdownGracePeriodSeconds: 8\n",
    );
    let s = load(RawSettings::default(), Some(&own))
        .unwrap()
        .settings
        .shutdown;
    let by: Vec<(i32, u64)> = s
        .by_pod_priority
        .iter()
        .map(|g| (g.priority, g.grace.as_secs()))
        .collect();
    assert_eq!(by, vec![(0, 8), (100_000, 6)]);
    // the kubelet's file alone
    let periods = |s: ShutdownSettings| {
        (
            s.grace_period.as_secs(),
            s.grace_period_critical_pods.as_secs(),
        )
    };
    let s = load(RawSettings::default(), Some(&kubelet))
        .unwrap()
        .settings;
    assert_eq!(periods(s.shutdown), (30, 10));
    // a flag over the kubelet's file, field by field: 30 s from the file, 5 s from the flag
    let flags = RawSettings {
        shutdown_grace_period_critical_pods: Some("5s".into()),
        kubelet_config: Some(kubelet.display().to_string()),
        ..RawSettings::default()
    };
    let s = load(flags.clone(), None).unwrap().settings;
    assert_eq!(periods(s.shutdown), (30, 5));
    // checked once merged: a critical part longer than the kubelet's period
    let flags = RawSettings {
        shutdown_grace_period_critical_pods: Some("40s".into()),
        ..flags
    };
    let e = load(flags, None).unwrap_err();
    assert_eq!(e.field, "shutdownGracePeriodCriticalPods", "{e}");
    // the flag set it: the error does not blame the kubelet's file
    assert!(
        !e.to_string().contains(&kubelet.display().to_string()),
        "{e}"
    );
    // reaplet's list over the kubelet's period: the kubelet's rule, exclusive
    let flags = RawSettings {
        kubelet_config: Some(kubelet.display().to_string()),
        ..RawSettings::default()
    };
    let e = load(flags, Some(&own)).unwrap_err();
    assert_eq!(e.field, "shutdownGracePeriodByPodPriority", "{e}");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "shutdownGracePeriodByPodPriority: 3\n",
    );
    assert_eq!(
        load(RawSettings::default(), Some(&bad)).unwrap_err().field,
        "shutdownGracePeriodByPodPriority"
    );
}

fn tracing(endpoint: &str, rate: u32) -> Option<crate::otel::TracingConfig> {
    Some(crate::otel::TracingConfig {
        endpoint: endpoint.into(),
        sampling_rate_per_million: rate,
    })
}

/// The kubelet's `tracing` (`TracingConfiguration`): off unless a field is set; the kubelet's
/// defaults (`localhost:4317`, rate 0) for the other; its bounds.
#[test]
fn tracing_settings_default_and_validate_as_the_kubelets() {
    assert_eq!(resolve(raw()).unwrap().tracing, None, "off by default");
    let s = resolve(set("tracing.samplingRatePerMillion", "100")).unwrap();
    assert_eq!(s.tracing, tracing("http://localhost:4317", 100));
    let s = resolve(set("tracing.endpoint", "otel-collector.monitoring:4317")).unwrap();
    assert_eq!(
        s.tracing,
        tracing("http://otel-collector.monitoring:4317", 0),
        "an endpoint without a scheme gets http://; the rate defaults to 0"
    );
    for (v, rate) in [("0", 0), ("1000000", 1_000_000), (" 42 ", 42)] {
        let s = resolve(set("tracing.samplingRatePerMillion", v)).unwrap();
        assert_eq!(s.tracing.unwrap().sampling_rate_per_million, rate, "{v:?}");
    }
    for v in ["-1", "1000001", "2.5", "all", "", "4294967296"] {
        let e = resolve(set("tracing.samplingRatePerMillion", v)).unwrap_err();
        assert_eq!(e.field, "tracing.samplingRatePerMillion", "{v:?}: {e}");
    }
    for v in [
        "",
        "collector",
        "https://collector:4317",
        "http://collector:4317/v1/traces",
        "collector:port",
    ] {
        let e = resolve(set("tracing.endpoint", v)).unwrap_err();
        assert_eq!(e.field, "tracing.endpoint", "{v:?}: {e}");
        assert!(e.to_string().contains("tracing.endpoint"), "{e}");
    }
}

#[test]
fn tracing_in_reaplets_own_file_is_the_kubelets_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let read = |text: &str| {
        let f = write(dir.path(), "c.yaml", text);
        RawSettings::from_file(&f)
    };
    let r = read("tracing:\n  endpoint: 127.0.0.1:4317\n  samplingRatePerMillion: 250\n").unwrap();
    assert_eq!(r.tracing_endpoint.as_deref(), Some("127.0.0.1:4317"));
    assert_eq!(r.tracing_sampling_rate_per_million.as_deref(), Some("250"));
    assert_eq!(
        resolve(r).unwrap().tracing,
        tracing("http://127.0.0.1:4317", 250)
    );
    let r = read("tracing:\n  samplingRatePerMillion: \"10\"\n").unwrap();
    assert_eq!(
        resolve(r).unwrap().tracing,
        tracing("http://localhost:4317", 10)
    );
    assert_eq!(read("tracing: ~\n").unwrap(), RawSettings::default());
    assert_eq!(
        resolve(read("tracing: {}\n").unwrap()).unwrap().tracing,
        None
    );
    for (text, field) in [
        ("tracing: localhost:4317\n", "tracing"),
        ("tracing:\n  endpiont: localhost:4317\n", "tracing"),
        ("tracing:\n  endpoint: [a]\n", "tracing.endpoint"),
        ("tracing:\n  endpoint: 4317\n", "tracing.endpoint"),
        (
            "tracing:\n  samplingRatePerMillion: [1]\n",
            "tracing.samplingRatePerMillion",
        ),
        (
            "tracing:\n  samplingRatePerMillion: true\n",
            "tracing.samplingRatePerMillion",
        ),
        // the flat names are the flags' and the environment's, never the file's
        ("tracingEndpoint: localhost:4317\n", "config"),
    ] {
        let e = read(text).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
    }
    for (text, field) in [
        (
            "tracing:\n  samplingRatePerMillion: -5\n",
            "tracing.samplingRatePerMillion",
        ),
        (
            "tracing:\n  samplingRatePerMillion: 1.5\n",
            "tracing.samplingRatePerMillion",
        ),
        ("tracing:\n  endpoint: https://c:4317\n", "tracing.endpoint"),
    ] {
        let e = resolve(read(text).unwrap()).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
    }
}

/// Each of `tracing`'s fields layered on its own: flags > environment > reaplet's file > the
/// kubelet's file; the kubelet's values are validated naming its field and file.
#[test]
fn tracing_from_the_kubelets_file_below_reaplets_settings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubelet = write(
        d,
        "kubelet.yaml",
        &format!(
            "{KUBELET_HEADER}tracing:\n  endpoint: otel.monitoring:4317\n  samplingRatePerMillion: 100\n"
        ),
    );
    let l = load(RawSettings::default(), Some(&kubelet)).unwrap();
    assert_eq!(
        l.settings.tracing,
        tracing("http://otel.monitoring:4317", 100)
    );
    let used = l.kubelet.unwrap().used;
    assert!(
        used.contains(&"tracing.endpoint") && used.contains(&"tracing.samplingRatePerMillion"),
        "{used:?}"
    );
    let own = write(
        d,
        "reaplet.yaml",
        &format!(
            "kubeletConfig: {}\ntracing:\n  samplingRatePerMillion: 1000000\n",
            kubelet.display()
        ),
    );
    let l = load(RawSettings::default(), Some(&own)).unwrap();
    assert_eq!(
        l.settings.tracing,
        tracing("http://otel.monitoring:4317", 1_000_000),
        "the rate from reaplet's file, the endpoint from the kubelet's"
    );
    let flags = RawSettings {
        tracing_endpoint: Some("http://127.0.0.1:14317".into()),
        ..raw()
    };
    let l = load(flags, Some(&own)).unwrap();
    assert_eq!(
        l.settings.tracing,
        tracing("http://127.0.0.1:14317", 1_000_000)
    );
    // the kubelet's zero values are unset: no tracing
    let zero = write(
        d,
        "zero.yaml",
        &format!(
            "{KUBELET_HEADER}tracing:\n  endpoint: \"\"\n  samplingRatePerMillion: 0\n  extra: 1\n"
        ),
    );
    let l = load(RawSettings::default(), Some(&zero)).unwrap();
    assert_eq!(l.settings.tracing, None);
    assert_eq!(l.kubelet.unwrap().ignored, ["tracing.extra"]);
    // the kubelet's invalid values name its field and file, unless reaplet's settings win
    for (text, field) in [
        (
            "tracing:\n  samplingRatePerMillion: 2000000\n",
            "tracing.samplingRatePerMillion",
        ),
        (
            "tracing:\n  samplingRatePerMillion: -1\n",
            "tracing.samplingRatePerMillion",
        ),
        (
            "tracing:\n  endpoint: https://otel:4317\n",
            "tracing.endpoint",
        ),
        ("tracing:\n  endpoint: otel\n", "tracing.endpoint"),
        ("tracing: [a]\n", "tracing"),
    ] {
        let f = write(d, "bad.yaml", &format!("{KUBELET_HEADER}{text}"));
        let e = load(RawSettings::default(), Some(&f)).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert!(e.to_string().contains("bad.yaml"), "names the file: {e}");
        if field != "tracing" && !text.contains("-1") {
            let flags = RawSettings {
                tracing_endpoint: Some("127.0.0.1:4317".into()),
                tracing_sampling_rate_per_million: Some("5".into()),
                ..raw()
            };
            let l = load(flags, Some(&f)).unwrap();
            assert_eq!(l.settings.tracing, tracing("http://127.0.0.1:4317", 5));
        }
    }
}

/// Issue 44: `hostnameOverride` must be the node the credentials name; the error names both,
/// and where each came from. No name in the credentials, or the same name: no error.
#[test]
fn an_override_that_disagrees_with_the_credentials_names_both() {
    use identity::{CredentialsName, Found, NameFrom};
    let found = Found {
        name: Some(CredentialsName {
            name: "ip-10-0-1-7.ec2.internal".into(),
            from: NameFrom::Certificate,
            detail: "CN=system:node:ip-10-0-1-7.ec2.internal of client certificate \
                     /var/lib/kubelet/pki/kubelet-client-current.pem"
                .into(),
        }),
        problem: None,
    };
    let e = node_name_check(Some("worker-7"), &found).unwrap_err();
    assert_eq!(e.field, "hostnameOverride");
    assert_eq!(
        e.to_string(),
        "invalid configuration: hostnameOverride: \"worker-7\" (from --hostname-override or the \
         config file) is not \"ip-10-0-1-7.ec2.internal\", the node's name in the API \
         credentials (CN=system:node:ip-10-0-1-7.ec2.internal of client certificate \
         /var/lib/kubelet/pki/kubelet-client-current.pem, where the API server takes the node's \
         identity from): give that name, or leave hostnameOverride out"
    );
    assert_eq!(
        node_name_check(Some("ip-10-0-1-7.ec2.internal"), &found),
        Ok(())
    );
    assert_eq!(node_name_check(None, &found), Ok(()));
    assert_eq!(node_name_check(Some("worker-7"), &Found::default()), Ok(()));
}

/// The kubelet's file named by `kubeletConfig` that cannot be read is an error naming
/// `kubeletConfig` (the setting to mend), not `config` (reaplet's own file, which was fine).
#[test]
fn an_unreadable_kubelet_file_names_kubelet_config() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("kubelet.yaml");
    let own = write(
        dir.path(),
        "reaplet.yaml",
        &format!("kubeletConfig: {}\n", missing.display()),
    );
    let e = load(RawSettings::default(), Some(&own)).unwrap_err();
    assert_eq!(e.field, "kubeletConfig", "{e}");
    let flags = RawSettings {
        kubelet_config: Some(missing.display().to_string()),
        ..RawSettings::default()
    };
    let e = load(flags, None).unwrap_err();
    assert_eq!(e.field, "kubeletConfig", "{e}");
    // a file that is no mapping too
    let bad = write(dir.path(), "list.yaml", "- a\n");
    let flags = RawSettings {
        kubelet_config: Some(bad.display().to_string()),
        ..RawSettings::default()
    };
    assert_eq!(load(flags, None).unwrap_err().field, "kubeletConfig");
    // reaplet's own file unreadable still names config
    let e = load(RawSettings::default(), Some(&dir.path().join("none.yaml"))).unwrap_err();
    assert_eq!(e.field, "config", "{e}");
}
