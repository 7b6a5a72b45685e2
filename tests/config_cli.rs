//! Configuration as an operator meets it, through the binary alone (no runtime, no API
//! server): usage errors and an unreadable or invalid kubeconfig exit 64 in one line naming the
//! field, `--help` exits 0; a closed stdout never panics; the kubelet's own config file from a
//! kubeadm node is read as it is (`tests/fixtures/kubeadm-kubelet-config.yaml`), its ignored
//! fields logged in one line; the unit and example config run with the node's own credentials.
//! The rest of the CLI (the test bed, an API server) is in `tests/cli.rs`.

#[path = "common/port.rs"]
mod port;
#[path = "common/process.rs"]
mod process;

use process::*;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Exit code and stderr of `reaplet <args>`, with nothing started (no runtime socket).
fn config_exit(args: &[&str]) -> (Option<i32>, String) {
    let out = reaplet()
        .args(args)
        .args([
            "--container-runtime-endpoint",
            "unix:///nonexistent/cri.sock",
        ])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn usage_errors_exit_64_in_one_line_and_help_exits_0() {
    for args in [
        &["run", "--no-such-flag"][..],
        &["check", "--kube-api-qps"],
        &["pods", "--no-such-flag"],
        &["no-such-command"],
        &[],
    ] {
        let out = reaplet().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
        if let Some(flag) = args.get(1) {
            assert!(err.contains(flag), "{args:?}: does not name {flag}: {err}");
        }
    }
    for args in [
        &["--help"][..],
        &["--version"],
        &["run", "--help"],
        &["help"],
    ] {
        let out = reaplet().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn an_unreadable_or_invalid_kubeconfig_exits_64_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let not_one = dir.path().join("not-a-kubeconfig");
    std::fs::write(&not_one, "this: is not: a kubeconfig\n").unwrap();
    let no_context = dir.path().join("no-context");
    std::fs::write(&no_context, "apiVersion: v1\nkind: Config\n").unwrap();
    let unreadable = dir.path().join("a-directory");
    std::fs::create_dir(&unreadable).unwrap();
    for cmd in ["run", "check"] {
        for kc in [
            Path::new("/nonexistent/kubelet.conf"),
            &not_one,
            &no_context,
            &unreadable,
        ] {
            let kc = kc.display().to_string();
            let (code, err) = config_exit(&[cmd, "--hostname-override", "n", "--kubeconfig", &kc]);
            assert_eq!(code, Some(64), "{cmd} {kc}: {err}");
            assert!(
                err.starts_with("reaplet: invalid configuration: kubeconfig: "),
                "{err}"
            );
            assert!(err.contains(&kc), "{cmd}: names the file: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{cmd}: one line: {err}");
        }
        // no credentials at all, and no manifest directory to run from alone
        let (code, err) = config_exit(&[cmd, "--hostname-override", "n"]);
        assert_eq!(code, Some(64), "{cmd}: {err}");
        assert!(err.contains("kubeconfig"), "{err}");
    }
}

/// The kubelet's eviction settings are checked before anything starts, as the kubelet's
/// `ParseThresholdConfig`: a soft threshold without its grace period exits 64 in one line
/// naming `evictionSoftGracePeriod`, with the kubelet's text.
#[test]
fn a_soft_eviction_threshold_without_a_grace_period_exits_64() {
    for cmd in ["run", "check"] {
        let (code, err) = config_exit(&[
            cmd,
            "--hostname-override",
            "n",
            "--pod-manifest-path",
            "/nonexistent",
            "--eviction-soft",
            "memory.available<1Gi",
        ]);
        assert_eq!(code, Some(64), "{cmd}: {err}");
        assert_eq!(
            err.trim_end(),
            "reaplet: invalid configuration: evictionSoftGracePeriod: grace period must be \
             specified for the soft eviction threshold memory.available",
            "{cmd}"
        );
    }
    // the kubelet's flag syntax: a pair without `<` is the kubelet's error
    let (code, err) = config_exit(&[
        "run",
        "--hostname-override",
        "n",
        "--pod-manifest-path",
        "/nonexistent",
        "--eviction-hard",
        "memory.available=1Gi",
    ]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("evictionHard") && err.contains("malformed pair, expect string<string"),
        "{err}"
    );
}

#[test]
fn a_closed_stdout_never_panics() {
    let check = [
        "check",
        "--hostname-override",
        "n",
        "--pod-manifest-path",
        "/nonexistent",
        "--container-runtime-endpoint",
        "unix:///nonexistent/cri.sock",
    ];
    for (args, code) in [
        (&["version"][..], 0),
        (&["--help"], 0),
        // the runtime socket is missing: the table has FAIL lines, so 1
        (&check, 1),
        // no agent: the error goes to stderr, exit 1
        (&["pods", "--address", "127.0.0.1:1"], 1),
    ] {
        let out = reaplet()
            .args(args)
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    }
}

#[test]
fn a_kubeadm_nodes_kubelet_config_is_read_as_it_is() {
    let fixture = repo().join("tests/fixtures/kubeadm-kubelet-config.yaml");
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let own = dir.path().join("reaplet.yaml");
    std::fs::write(
        &own,
        format!(
            "apiVersion: reaplet.io/v1alpha1\nkind: ReapletConfiguration\nkubeletConfig: {}\npodManifestPath: {}\n",
            fixture.display(),
            manifests.display()
        ),
    )
    .unwrap();
    let fixture_s = fixture.display().to_string();
    let own_s = own.display().to_string();
    // the kubelet's file as --config, as --kubelet-config, and named by reaplet's own file
    for args in [
        vec!["--config", &fixture_s],
        vec!["--kubelet-config", &fixture_s],
        vec!["--config", &own_s],
    ] {
        let out = reaplet()
            .args(["check", "--hostname-override", "n", "--pod-manifest-path"])
            .arg(&manifests)
            .args([
                "--container-runtime-endpoint",
                "unix:///nonexistent/cri.sock",
            ])
            .args(&args)
            .output()
            .unwrap();
        let (stdout, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        // the runtime is missing (1), but the configuration is valid (not 64)
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}{stdout}");
        let line = row(&stdout, "kubelet config");
        assert!(
            line.contains(&fixture_s)
                && line.contains("cgroupDriver, healthzBindAddress, healthzPort, staticPodPath"),
            "{line}"
        );
        assert!(
            row(&stdout, "cgroups").contains("systemd (configured)"),
            "{stdout}"
        );
    }
    // both as --config and --kubelet-config: which one is meant is unclear
    let (code, err) = config_exit(&[
        "check",
        "--config",
        &fixture_s,
        "--kubelet-config",
        &fixture_s,
    ]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("kubeletConfig"), "{err}");
    // a kind that is neither
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "apiVersion: v1\nkind: Pod\n").unwrap();
    let (code, err) = config_exit(&["check", "--config", &pod.display().to_string()]);
    assert_eq!((code, err.contains("kind")), (Some(64), true), "{err}");
    // a kubelet field reaplet reads, with a value of the wrong kind: the nested field is named
    let bad = dir.path().join("bad-kubelet.yaml");
    let text = std::fs::read_to_string(&fixture).unwrap().replace(
        "  flushFrequency: 0\n",
        "  flushFrequency: 0\n  format: xml\n",
    );
    std::fs::write(&bad, text).unwrap();
    let (code, err) = config_exit(&["run", "--config", &bad.display().to_string()]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("logging.format") && err.contains("bad-kubelet.yaml"),
        "{err}"
    );
}

#[test]
fn run_logs_the_ignored_kubelet_fields_in_one_line() {
    let fixture = repo().join("tests/fixtures/kubeadm-kubelet-config.yaml");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("reaplet.log");
    // nothing to run against: no runtime, an empty manifest directory, no API
    let mut child = reaplet()
        .arg("run")
        .arg("--config")
        .arg(&fixture)
        .args(["--hostname-override", "n", "--log-format", "json"])
        .args([
            "--container-runtime-endpoint",
            "unix:///nonexistent/cri.sock",
        ])
        .args([
            "--cgroup-driver",
            "cgroupfs",
            "--cgroup-root",
            "/reaplet-cli-nonexistent",
        ])
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .arg("--pod-manifest-path")
        .arg(dir.path())
        .arg("--root-dir")
        .arg(dir.path())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _guard = KillOnDrop(child.id());
    // start-up logs: 10 s is far more than reading the configuration takes
    let limit = Duration::from_secs(10);
    let is_config = |m: &str| m.contains("kubelet configuration");
    let logs = wait_line(&mut child, &log, "kubelet configuration", limit, |l| {
        message_is(l, is_config)
    });
    let found = json_lines(&logs, is_config);
    assert_eq!(found.len(), 1, "{logs}");
    let line = &found[0];
    assert_eq!(line["level"], "INFO", "{line}");
    let ignored = line["ignored"].as_str().unwrap();
    for f in [
        "authentication",
        "authorization",
        "clusterDNS",
        "logging.verbosity",
        "rotateCertificates",
    ] {
        assert!(ignored.split(',').any(|i| i == f), "{f} not in {ignored}");
    }
    assert_eq!(
        line["used"], "cgroupDriver,healthzBindAddress,healthzPort,staticPodPath",
        "{line}"
    );
    // kubeadm writes the kubelet's healthz fields out: the probe is where they say, one line.
    // Logged after the configuration line (issue 44: read right after it, it was not there
    // yet once on 2 loaded cores): waited for in its own right
    let is_probe = |m: &str| m == "kubelet healthz probe";
    let logs = wait_line(&mut child, &log, "kubelet healthz probe", limit, |l| {
        message_is(l, is_probe)
    });
    let probe = json_lines(&logs, is_probe);
    assert_eq!(probe.len(), 1, "{logs}");
    assert_eq!(probe[0]["url"], "http://127.0.0.1:10248/healthz", "{logs}");
    assert!(
        probe[0]["from"]
            .as_str()
            .is_some_and(|f| f.contains("the kubelet's config file")),
        "{logs}"
    );
    sigterm(child.id());
    let status = child.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}");
}

/// The default way to run on a node: the unit reads /etc/reaplet/config.yaml, which uses the
/// node's own credentials (the kubelet's kubeconfig) and the kubelet's own config file.
#[test]
fn the_unit_and_example_config_run_with_the_nodes_own_credentials() {
    let example = std::fs::read_to_string(repo().join("systemd/config.example.yaml")).unwrap();
    let unit = std::fs::read_to_string(repo().join("systemd/reaplet.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/reaplet run --config /etc/reaplet/config.yaml"),
        "{unit}"
    );
    // active, reaplet unmounts the node-local volumes the kubelet left: the service must stay
    // in the host's mount namespace (an unmount in a namespace of its own never reaches the
    // host), with CAP_SYS_ADMIN
    for ns_option in [
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "PrivateMounts=",
        "ProtectKernelModules=",
        "ProtectKernelLogs=",
        "ProtectKernelTunables=",
        "ProtectControlGroups=",
        "ReadWritePaths=",
        "ReadOnlyPaths=",
        "InaccessiblePaths=",
        "TemporaryFileSystem=",
        "BindPaths=",
        "MountFlags=",
        "PrivateDevices=",
        "ProtectProc=",
    ] {
        assert!(
            !unit.lines().any(|l| l.starts_with(ns_option)),
            "{ns_option} gives the unit a mount namespace of its own"
        );
    }
    let caps = unit
        .lines()
        .find(|l| l.starts_with("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet");
    assert!(caps.contains("CAP_SYS_ADMIN"), "{caps}");
    // a kubeadm node: its kubelet's files, with the fixture for /var/lib/kubelet/config.yaml
    let fixture = repo().join("tests/fixtures/kubeadm-kubelet-config.yaml");
    assert!(example.contains("\nkubeletConfig: /var/lib/kubelet/config.yaml\n"));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("config.yaml");
    std::fs::write(
        &f,
        example.replace(
            "\nkubeletConfig: /var/lib/kubelet/config.yaml\n",
            &format!("\nkubeletConfig: {}\n", fixture.display()),
        ),
    )
    .unwrap();
    let l = reaplet::config::load(reaplet::config::RawSettings::default(), Some(&f)).unwrap();
    let s = l.settings.clone();
    assert_eq!(
        s.kubeconfig.as_deref(),
        Some(Path::new("/etc/kubernetes/kubelet.conf"))
    );
    // the kubelet's static pods (the control plane on a kubeadm node) are never reaplet's
    assert_eq!(
        s.pod_manifest_path, None,
        "the kubelet's staticPodPath is not reaplet's"
    );
    assert_eq!(
        l.kubelet.as_ref().unwrap().static_pod_path.as_deref(),
        Some(Path::new("/etc/kubernetes/manifests")),
    );
    assert_eq!(
        s.cgroup_driver,
        Some(reaplet::cgroups::CgroupDriver::Systemd),
        "the kubelet's cgroupDriver"
    );
    assert_eq!(s.root_dir, Path::new("/var/lib/kubelet"));
    assert!(s.metrics_bind_address.ip().is_loopback());
    // the RBAC manifest says when it is needed and how to get a kubeconfig for it
    let rbac = std::fs::read_to_string(repo().join("deploy/rbac.yaml")).unwrap();
    let header: String = rbac
        .lines()
        .take_while(|l| l.starts_with('#') || l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    for needle in [
        "/etc/kubernetes/kubelet.conf",
        "system:node:",
        "kubectl create token reaplet",
        "kubectl config set-credentials",
    ] {
        assert!(
            header.contains(needle),
            "the header lacks {needle:?}:\n{header}"
        );
    }
}

/// SIGTERM while reaplet is still starting (here: asking a runtime that accepts the connection
/// and never answers for its cgroup driver) is a clean stop with exit 0, never the signal's
/// default action (before: the handler was installed only once the agent started, so the
/// process died of the signal).
#[test]
fn sigterm_during_start_up_is_a_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("silent.sock");
    // accepts (the kernel's backlog) and never answers
    let _silent = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let mut child = reaplet()
        .args(["run", "--hostname-override", "n", "--pod-manifest-path"])
        .arg(&manifests)
        .arg("--container-runtime-endpoint")
        .arg(format!("unix://{}", sock.display()))
        .args(["--runtime-request-timeout", "60s", "--root-dir"])
        .arg(dir.path().join("root"))
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _g = KillOnDrop(child.id());
    // the whole of start-up up to the runtime call: the process reads its config and logs;
    // 1 s is far more than that takes, and far less than the 60 s the call would hang
    std::thread::sleep(Duration::from_secs(1));
    assert!(child.try_wait().unwrap().is_none(), "reaplet ended early");
    sigterm(child.id());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "SIGTERM did not stop reaplet within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// The status address taken by another process (here: this test's listener) is a start error
/// naming the address and the flag and file field that move it, in one line; nothing is
/// started (exit 1, not the configuration's 64: the address itself is valid, and a restart may
/// find it free).
#[test]
fn a_taken_status_address_is_a_start_error_naming_it_and_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let mut child = reaplet()
        .args(["run", "--hostname-override", "n", "--pod-manifest-path"])
        .arg(&manifests)
        .args([
            "--container-runtime-endpoint",
            "unix:///nonexistent/cri.sock",
            "--cgroup-driver",
            "cgroupfs",
            "--metrics-bind-address",
            &address,
            "--log-format",
            "json",
            "--root-dir",
        ])
        .arg(dir.path().join("root"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _g = KillOnDrop(child.id());
    // the bind is the agent's first step, before any runtime call: well within 10 s
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "reaplet did not exit within 10 s with its status address taken"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    // the last line is the reason (the JSON log lines come before it)
    let reason = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(reason.starts_with("reaplet: "), "{stderr}");
    for needle in [
        address.as_str(),
        "in use",
        "--metrics-bind-address",
        "metricsBindAddress",
    ] {
        assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
    }
    drop(taken);
}

/// `reaplet` alone exits 64 with one line naming every command (drain and make-room too).
#[test]
fn no_command_names_every_command() {
    let out = reaplet().output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for c in ["run", "check", "pods", "drain", "make-room", "version"] {
        assert!(
            err.contains(&format!(" {c},")) || err.contains(&format!(" {c} (")),
            "{c} is not named: {err}"
        );
    }
}
