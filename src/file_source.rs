//! The static manifest source: kubelet's `--pod-manifest-path` (`pkg/kubelet/config/file.go`,
//! `common.go` `applyDefaults`).
//!
//! Invariants:
//! * each `*.yaml`, `*.yml` or `*.json` file (not hidden, at most 1 MiB) in the directory is
//!   one pod; its UID is derived from the file's path, content and the node name, so it is
//!   stable across restarts and changes when the file does; its name gets `-<node>` appended;
//! * a file that disappears means its pod terminates with its own grace (as upstream);
//! * a file that exists but does not parse keeps the last good version of its pod (reaplet
//!   never kills a pod because its manifest is being rewritten); the error is logged once;
//! * static pods are marked `kubernetes.io/config.source: file`, so they get no terminal
//!   phase and no API delete;
//! * a manifest is matched to the static pod the runtime really runs for it (same namespace,
//!   the kubelet's name `<name>-<node>`, `config.source: file`) and takes that pod's UID: a
//!   pod the kubelet started under its own config hash is this manifest's pod, not an orphan.
//!   reaplet's own UID (a hash of path, content and node) is used only when the runtime has
//!   no such pod.

use crate::cri::Runtime;
use crate::pod::PodInfo;
use crate::workers::{PodWorkers, StaticPods};
use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The source name for [`PodWorkers::expect_sources`].
pub const SOURCE: &str = "file";
const MAX_MANIFEST: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: larger than 1 MiB")]
    TooLarge { path: PathBuf },
    #[error("{path}: not a pod manifest: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Pod {
        path: PathBuf,
        source: crate::pod::PodError,
    },
}

/// Whose the node's static pods are, given reaplet's manifest directory and the kubelet's
/// `staticPodPath` (when its config file was read): only the very same directory (after
/// resolving links) makes every static `file` pod reaplet's to judge.
pub fn static_pod_ownership(ours: Option<&Path>, kubelets: Option<&Path>) -> StaticPods {
    let Some(ours) = ours else {
        return StaticPods::Kubelets;
    };
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    match kubelets {
        Some(k) if real(k) == real(ours) => StaticPods::AllOfNode,
        _ => StaticPods::OwnManifests,
    }
}

/// Reads one manifest into the pod the kubelet would make of it.
pub fn load(path: &Path, node: &str) -> Result<PodInfo, ManifestError> {
    let meta = std::fs::metadata(path).map_err(|source| ManifestError::Read {
        path: path.into(),
        source,
    })?;
    if meta.len() > MAX_MANIFEST {
        return Err(ManifestError::TooLarge { path: path.into() });
    }
    let bytes = std::fs::read(path).map_err(|source| ManifestError::Read {
        path: path.into(),
        source,
    })?;
    let parse = |reason: String| ManifestError::Parse {
        path: path.into(),
        reason,
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| parse(format!("not UTF-8: {e}")))?;
    let mut pod: Pod = crate::config::from_yaml(text).map_err(parse)?;
    if pod.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(parse("metadata.name is missing".into()));
    }
    let mut h = Sha256::new();
    h.update(&bytes);
    h.update(format!("host:{node}").as_bytes());
    h.update(format!("file:{}", path.display()).as_bytes());
    let digest = h.finalize();
    let uid: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!(
        "{}-{node}",
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    pod.metadata.name = Some(name);
    pod.metadata
        .namespace
        .get_or_insert_with(|| "default".into());
    pod.metadata.uid = Some(uid.clone());
    let ann = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    ann.insert("kubernetes.io/config.source".into(), "file".into());
    ann.insert("kubernetes.io/config.hash".into(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.into());
    }
    PodInfo::from_api(&pod).map_err(|source| ManifestError::Pod {
        path: path.into(),
        source,
    })
}

fn manifests(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let is_manifest = [".yaml", ".yml", ".json"].iter().any(|x| name.ends_with(x));
        if name.starts_with('.') || !is_manifest || !e.file_type()?.is_file() {
            continue;
        }
        out.push(e.path());
    }
    out.sort();
    Ok(out)
}

/// Gives each manifest's pod the UID of the static pod the runtime runs for it, if any
/// (logged once per manifest and UID). A manifest keeps a UID it adopted while its file is
/// there, so a runtime listing that fails never flips it back.
async fn adopt_runtime_uids<R: Runtime>(
    workers: &PodWorkers<R>,
    seen: &mut HashMap<PathBuf, PodInfo>,
    adopted: &mut HashMap<PathBuf, crate::pod::PodUid>,
) {
    adopted.retain(|path, _| seen.contains_key(path));
    // a manifest keeps the UID it adopted: the runtime is listed only while one has none
    if seen.keys().all(|path| adopted.contains_key(path)) {
        for (path, pod) in seen.iter_mut() {
            pod.uid = adopted[path].clone();
        }
        return;
    }
    let running = match workers.static_runtime_pods().await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(err = %e, "listing the runtime's static pods failed");
            HashMap::new()
        }
    };
    for (path, pod) in seen.iter_mut() {
        let key = (pod.namespace.clone(), pod.name.clone());
        let uid = match running.get(&key) {
            Some(uid) => {
                if adopted.get(path) != Some(uid) {
                    tracing::info!(pod = %pod.key(), podUID = %uid, file = %path.display(), "manifest matched to the static pod the runtime runs");
                    adopted.insert(path.clone(), uid.clone());
                }
                uid.clone()
            }
            None => match adopted.get(path) {
                Some(uid) => uid.clone(),
                None => continue,
            },
        };
        pod.uid = uid;
    }
}

/// Watches `dir` every `period` until cancelled.
pub async fn run<R: Runtime>(
    dir: PathBuf,
    node: String,
    period: Duration,
    workers: PodWorkers<R>,
    cancel: CancellationToken,
) {
    let mut known: HashMap<PathBuf, PodInfo> = HashMap::new();
    let mut reported: HashMap<PathBuf, String> = HashMap::new();
    let mut dir_error: Option<String> = None;
    let mut adopted: HashMap<PathBuf, crate::pod::PodUid> = HashMap::new();
    loop {
        // before the directory is read: a pod the kubelet starts from a manifest written after
        // it is no orphan of this scan
        let listed_from = crate::wall_ns();
        match manifests(&dir) {
            Ok(files) => {
                dir_error = None;
                let mut seen: HashMap<PathBuf, PodInfo> = HashMap::new();
                for path in files {
                    match load(&path, &node) {
                        Ok(pod) => {
                            reported.remove(&path);
                            seen.insert(path, pod);
                        }
                        Err(e) => {
                            let text = e.to_string();
                            if reported.get(&path) != Some(&text) {
                                tracing::warn!(err = %text, "static pod manifest skipped");
                                reported.insert(path.clone(), text);
                            }
                            // keep the last good version of a file that is still there
                            if let Some(old) = known.get(&path) {
                                seen.insert(path, old.clone());
                            }
                        }
                    }
                }
                adopt_runtime_uids(&workers, &mut seen, &mut adopted).await;
                for (path, old) in &known {
                    let replaced = seen.get(path).is_some_and(|p| p.uid != old.uid);
                    if !seen.contains_key(path) || replaced {
                        tracing::info!(pod = %old.key(), podUID = %old.uid, file = %path.display(), "static pod removed");
                        workers.remove(&old.uid, None);
                    }
                }
                for (path, pod) in &seen {
                    if known.get(path).is_none_or(|old| old.uid != pod.uid) {
                        tracing::info!(pod = %pod.key(), podUID = %pod.uid, file = %path.display(), "static pod added");
                        workers.upsert(pod.clone());
                    }
                }
                known = seen;
                workers.mark_source_synced(SOURCE, listed_from);
            }
            Err(e) => {
                // once per distinct error, not once per scan; the known pods stay as they are
                let text = e.to_string();
                if dir_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(dir = %dir.display(), err = %text, "reading the manifest directory failed");
                    dir_error = Some(text);
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_kubelets_own_directory_makes_every_static_pod_reaplets() {
        use super::{StaticPods, static_pod_ownership as own};
        let d = tempfile::tempdir().unwrap();
        let (k, ours) = (d.path().join("manifests"), d.path().join("reaplet"));
        std::fs::create_dir_all(&k).unwrap();
        std::fs::create_dir_all(&ours).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&k, &link).unwrap();
        assert_eq!(own(None, Some(&k)), StaticPods::Kubelets);
        assert_eq!(own(Some(&ours), None), StaticPods::OwnManifests);
        assert_eq!(own(Some(&ours), Some(&k)), StaticPods::OwnManifests);
        assert_eq!(own(Some(&k), Some(&k)), StaticPods::AllOfNode);
        assert_eq!(
            own(Some(&link), Some(&k)),
            StaticPods::AllOfNode,
            "a link to it"
        );
    }

    use super::*;

    #[test]
    fn manifest_to_static_pod() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("web.yaml");
        std::fs::write(&f, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 7\n  containers:\n  - name: app\n    image: busybox\n").unwrap();
        let p = load(&f, "node1").unwrap();
        assert_eq!(p.name, "web-node1");
        assert_eq!(p.namespace, "default");
        assert!(p.static_pod);
        assert_eq!(p.spec_grace, Some(7));
        assert_eq!(p.uid.as_str().len(), 32);
        // stable for the same file, different for another node or content
        assert_eq!(load(&f, "node1").unwrap().uid, p.uid);
        assert_ne!(load(&f, "node2").unwrap().uid, p.uid);
        std::fs::write(
            &f,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers: []\n",
        )
        .unwrap();
        assert_ne!(load(&f, "node1").unwrap().uid, p.uid);
    }

    #[test]
    fn bad_manifests_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("a.yaml", "::: not yaml"),
            (
                "b.yaml",
                "kind: Pod\nmetadata: {}\nspec: {containers: []}\n",
            ),
            (
                "c.json",
                "{\"metadata\":{\"name\":\"x\"},\"spec\":{\"terminationGracePeriodSeconds\":99999999999999999999999,\"containers\":[]}}",
            ),
            ("d.yaml", ""),
        ] {
            let f = dir.path().join(name);
            std::fs::write(&f, text).unwrap();
            assert!(load(&f, "n").is_err(), "{name}");
        }
        // a type error is one line (it is logged) that names the field; a YAML error its line
        let f = dir.path().join("e.yaml");
        std::fs::write(&f, "metadata:\n  name: x\nspec:\n  containers: 5\n").unwrap();
        let e = load(&f, "n").unwrap_err().to_string();
        assert!(
            !e.contains('\n') && e.ends_with("expected a sequence at spec.containers"),
            "{e}"
        );
        std::fs::write(
            &f,
            "metadata:\n  name: x\nspec:\n  containers:\n  - name: a\n    ports: [{containerPort: x}]\n",
        )
        .unwrap();
        let e = load(&f, "n").unwrap_err().to_string();
        assert!(
            e.ends_with("at spec.containers[0].ports[0].containerPort"),
            "{e}"
        );
        std::fs::write(&f, "metadata:\n  name: x\nspec: [\n").unwrap();
        let e = load(&f, "n").unwrap_err().to_string();
        assert!(!e.contains('\n') && e.contains("line 3"), "{e}");
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; 2 * 1024 * 1024]).unwrap();
        assert!(matches!(
            load(&big, "n"),
            Err(ManifestError::TooLarge { .. })
        ));
    }
}
