//! reaplet's own pod, when it runs as one (the DaemonSet in `deploy/`): found by its UID from
//! the downward API (`REAPLET_POD_UID`, `fieldRef: metadata.uid`) or, failing that, from the
//! process's own cgroup (`/proc/self/cgroup`: the kubelet's `pod<uid>` directory with the
//! cgroupfs driver, `kubepods-…-pod<uid>.slice` with the systemd driver, where the UID's
//! dashes are underscores). No kubelet counterpart: the kubelet never runs inside a pod it
//! ends.
//!
//! Invariants: reaplet never takes its own pod for an orphan, never evicts it for a taint or
//! node affinity, and never stops its containers one by one (that would kill the process doing
//! the ending); a deletion of its own pod is the kubelet's while one holds the node, and
//! otherwise ends it last, its status written first (`workers::own_pod`). A malformed UID is
//! ignored (reaplet is then not in a pod, as far as it knows), never a panic.

use crate::pod::PodUid;

/// The environment variable the DaemonSet sets from the downward API.
pub const ENV: &str = "REAPLET_POD_UID";

/// Where the UID came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    DownwardApi,
    Cgroup,
}

impl Found {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DownwardApi => "downward API",
            Self::Cgroup => "cgroup",
        }
    }
}

/// The pod UID in one cgroup path, if the path is a pod's.
fn uid_in_path(path: &str) -> Option<PodUid> {
    // the innermost pod directory wins (a pod cannot nest, but a path may repeat a prefix)
    path.split('/').rev().find_map(|part| {
        let part = part.strip_suffix(".slice").unwrap_or(part);
        // systemd: kubepods-burstable-pod<uid with _>.slice; cgroupfs: pod<uid>
        let tail = match part.rfind("-pod") {
            Some(i) if part.starts_with("kubepods") => &part[i + 4..],
            _ => part.strip_prefix("pod")?,
        };
        let uid = tail.replace('_', "-");
        // a UID is a UUID (36) or a static pod's hash (32): anything else is not one
        let ok = (uid.len() == 36 || uid.len() == 32)
            && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        ok.then(|| PodUid::parse(&uid).ok()).flatten()
    })
}

/// reaplet's own pod UID from `env` (the downward API's value), else from `cgroup` (the text
/// of `/proc/self/cgroup`).
pub fn own_pod(env: Option<&str>, cgroup: &str) -> Option<(PodUid, Found)> {
    if let Some(uid) = env
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .and_then(|u| PodUid::parse(u).ok())
    {
        return Some((uid, Found::DownwardApi));
    }
    cgroup
        .lines()
        // `hierarchy-ID:controllers:path`
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(uid_in_path)
        .map(|u| (u, Found::Cgroup))
}

/// [`own_pod`] for this process.
pub fn detect() -> Option<(PodUid, Found)> {
    let env = std::env::var(ENV).ok();
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    own_pod(env.as_deref(), &cgroup)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "3f25e7de-8bc9-47a1-b509-d9940894e787";

    #[test]
    fn the_downward_api_wins_then_the_cgroup_of_either_driver() {
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f25e7de_8bc9_47a1_b509_d9940894e787.slice/cri-containerd-0123abcd.scope\n";
        let cgroupfs = "0::/kubepods/besteffort/pod3f25e7de-8bc9-47a1-b509-d9940894e787/0123abcd\n";
        let v1 = "12:memory:/kubepods/pod3f25e7de-8bc9-47a1-b509-d9940894e787/0123abcd\n11:cpu,cpuacct:/kubepods/pod3f25e7de-8bc9-47a1-b509-d9940894e787/0123abcd\n";
        for (cg, why) in [(systemd, "systemd"), (cgroupfs, "cgroupfs"), (v1, "v1")] {
            assert_eq!(
                own_pod(None, cg),
                Some((PodUid::parse(UID).unwrap(), Found::Cgroup)),
                "{why}"
            );
        }
        let other = "d1c2b3a4-0000-4000-8000-000000000001";
        assert_eq!(
            own_pod(Some(other), systemd),
            Some((PodUid::parse(other).unwrap(), Found::DownwardApi))
        );
        // a guaranteed pod sits right below kubepods
        assert!(own_pod(None, "0::/kubepods.slice/kubepods-pod3f25e7de_8bc9_47a1_b509_d9940894e787.slice/cri-containerd-1.scope").is_some());
    }

    #[test]
    fn outside_a_pod_or_with_garbage_there_is_none() {
        for cg in [
            "0::/system.slice/reaplet.service\n",
            "0::/\n",
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "0::/kubepods/podnot-a-uid/x\n",
            "garbage without colons",
            "",
        ] {
            assert_eq!(own_pod(None, cg), None, "{cg:?}");
        }
        // an empty or malformed downward API value falls back to the cgroup
        assert_eq!(own_pod(Some(""), "0::/\n"), None);
        assert_eq!(own_pod(Some("../etc"), "0::/\n"), None);
    }
}
