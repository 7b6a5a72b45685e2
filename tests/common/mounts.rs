//! Real mounts laid out as the kubelet lays out a pod's volumes under
//! `<root-dir>/pods/<uid>/` (privileged: mounting needs CAP_SYS_ADMIN). Dropping the layout
//! unmounts whatever is still mounted (lazily, deepest first), so a failed test leaks no mount.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct KubeletVolumes {
    pub pod_dir: PathBuf,
    /// The node-local volume directories (`<plugin>/<volume>`), each with a file inside.
    pub local: Vec<PathBuf>,
    /// The subPath bind mounts under `volume-subpaths/`.
    pub subpaths: Vec<PathBuf>,
    /// A CSI-like volume (a tmpfs at `kubernetes.io~csi/<pv>/mount`, a file `db` inside), when
    /// asked for.
    pub csi: Option<PathBuf>,
    mounted: Vec<PathBuf>,
}

fn mount(args: &[&str], target: &Path) {
    let ok = Command::new("mount")
        .args(args)
        .arg(target)
        .status()
        .unwrap();
    assert!(
        ok.success(),
        "mount {args:?} {} failed (needs root)",
        target.display()
    );
}

impl KubeletVolumes {
    /// secret, configMap, projected token, downwardAPI and `medium: Memory` emptyDir volumes
    /// on tmpfs; a disk emptyDir (a directory with data); a directory subPath of the emptyDir
    /// and a file subPath of the configMap, bind-mounted under `volume-subpaths/`; and, with
    /// `csi`, a CSI-like volume.
    pub fn lay_out(root_dir: &Path, uid: &str, csi: bool) -> Self {
        let pod_dir = root_dir.join("pods").join(uid);
        let vols = pod_dir.join("volumes");
        let mut me = KubeletVolumes {
            pod_dir: pod_dir.clone(),
            local: Vec::new(),
            subpaths: Vec::new(),
            csi: None,
            mounted: Vec::new(),
        };
        for (plugin, name, tmpfs) in [
            ("kubernetes.io~secret", "creds", true),
            ("kubernetes.io~configmap", "conf", true),
            ("kubernetes.io~projected", "kube-api-access-7xk2p", true),
            ("kubernetes.io~downward-api", "podinfo", true),
            ("kubernetes.io~empty-dir", "mem", true),
            ("kubernetes.io~empty-dir", "cache", false),
        ] {
            let d = vols.join(plugin).join(name);
            std::fs::create_dir_all(&d).unwrap();
            if tmpfs {
                mount(&["-t", "tmpfs", "tmpfs"], &d);
                me.mounted.push(d.clone());
            }
            std::fs::write(d.join("data"), name).unwrap();
            me.local.push(d);
        }
        // subPaths: kubelet bind-mounts the path inside the volume on
        // volume-subpaths/<volume>/<container>/<index>
        let cache = vols.join("kubernetes.io~empty-dir/cache");
        std::fs::create_dir_all(cache.join("sub")).unwrap();
        let dir_sub = pod_dir.join("volume-subpaths/cache/app/0");
        std::fs::create_dir_all(&dir_sub).unwrap();
        mount(&["--bind", cache.join("sub").to_str().unwrap()], &dir_sub);
        me.mounted.push(dir_sub.clone());
        let file_sub = pod_dir.join("volume-subpaths/conf/app/1");
        std::fs::create_dir_all(file_sub.parent().unwrap()).unwrap();
        std::fs::write(&file_sub, "").unwrap();
        let conf_file = vols.join("kubernetes.io~configmap/conf/data");
        mount(&["--bind", conf_file.to_str().unwrap()], &file_sub);
        me.mounted.push(file_sub.clone());
        me.subpaths = vec![dir_sub, file_sub];
        if csi {
            let d = vols.join("kubernetes.io~csi/pvc-1/mount");
            std::fs::create_dir_all(&d).unwrap();
            mount(&["-t", "tmpfs", "tmpfs"], &d);
            me.mounted.push(d.clone());
            std::fs::write(d.join("db"), "precious").unwrap();
            me.csi = Some(d);
        }
        me
    }

    /// The mount points of this pod still in this mount namespace (relative to the pod's
    /// directory), as util-linux's `findmnt` reads them: not reaplet's own parser.
    pub fn still_mounted(&self) -> Vec<PathBuf> {
        let out = Command::new("findmnt")
            .args(["-rn", "-o", "TARGET"])
            .output()
            .unwrap();
        let mut v: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| Path::new(l).strip_prefix(&self.pod_dir).ok())
            .map(Path::to_path_buf)
            .collect();
        v.sort();
        v
    }

    /// Unmounts the CSI-like volume, as its driver would.
    pub fn unmount_csi(&self) {
        let d = self.csi.as_ref().expect("no CSI volume laid out");
        assert!(Command::new("umount").arg(d).status().unwrap().success());
    }
}

impl Drop for KubeletVolumes {
    fn drop(&mut self) {
        for d in self.mounted.iter().rev() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(d)
                .stderr(Stdio::null())
                .status();
        }
    }
}
