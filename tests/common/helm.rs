//! Helm and the chart `deploy/helm/reaplet` for the tests: the helm binary `testbed/helm.sh`
//! builds from the Go module proxy (cached outside the repository), `helm template` parsed, and
//! helm commands against a test cluster with its admin kubeconfig. Also the DaemonSet's image:
//! built from the release binary by the test bed's image builder and imported into a node's
//! containerd (no registry).

use super::k8s::Cluster;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The helm binary (built on first use in this process).
pub fn helm_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(super::repo().join("testbed/helm.sh"))
            .arg("path")
            .output()
            .expect("run testbed/helm.sh path");
        assert!(
            out.status.success(),
            "testbed/helm.sh could not provide helm:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The chart's directory.
pub fn chart() -> PathBuf {
    super::repo().join("deploy/helm/reaplet")
}

/// Runs helm with `args` (and `HELM_*` state kept in `home`); (success, stdout, stderr).
pub fn helm(home: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm_bin())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("run helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`helm`] that must succeed; its stdout.
pub fn must(home: &Path, args: &[&str]) -> String {
    let (ok, out, err) = helm(home, args);
    assert!(ok, "helm {}:\n{err}{out}", args.join(" "));
    out
}

/// The objects `helm template reaplet <chart> -n kube-system` renders with `set` (each a
/// `--set` argument) and the values files `files`.
pub fn template(home: &Path, set: &[&str], files: &[&Path]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        "reaplet",
        chart.to_str().unwrap(),
        "--namespace",
        "kube-system",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    for f in files {
        args.extend(["--values", f.to_str().unwrap()]);
    }
    let text = must(home, &args);
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("helm template's output does not parse: {e}\n{text}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

/// helm against `cluster` (its admin kubeconfig), state in `home`.
pub struct HelmOn<'a> {
    pub cluster: &'a Cluster,
    pub home: PathBuf,
}

impl HelmOn<'_> {
    /// `helm <args> --kubeconfig <admin>`; (success, stdout + stderr).
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let kc = self.cluster.admin_kubeconfig.display().to_string();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--kubeconfig", &kc]);
        let (ok, out, err) = helm(&self.home, &all);
        (ok, format!("{out}{err}"))
    }

    /// [`Self::run`] that must succeed; its output.
    pub fn must(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args);
        assert!(ok, "helm {}:\n{out}", args.join(" "));
        out
    }
}

/// The release binary the DaemonSet's image is made from.
pub fn release_binary() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bin = tmp
        .parent()
        .expect("the target dir")
        .join("release/reaplet");
    assert!(
        bin.exists(),
        "\n\n*** {} is missing: this test runs reaplet's release binary in its image. \
         scripts/test.sh builds it (with the Debian package); by hand: \
         cargo build --release --locked ***\n",
        bin.display()
    );
    bin
}

/// Builds (or finds up to date) the image `reaplet:local` and imports it into the test bed's
/// containerd (the Kubernetes namespace `k8s.io`, where the kubelet finds it).
pub fn import_reaplet_image(tb: &reaplet_testbed::Testbed) {
    let out = Command::new("bash")
        .arg(super::repo().join("testbed/testbed.sh"))
        .arg("reaplet-image")
        .arg(release_binary())
        .output()
        .expect("running testbed/testbed.sh reaplet-image");
    assert!(
        out.status.success(),
        "building the image failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tar = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let out = tb
        .ctr()
        .args(["images", "import"])
        .args(["--snapshotter", "overlayfs"])
        .arg(&tar)
        .output()
        .expect("running ctr");
    assert!(
        out.status.success(),
        "importing {tar}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
