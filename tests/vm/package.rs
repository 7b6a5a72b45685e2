//! reaplet from its Debian package (scripts/test.sh builds it with cargo-deb; the maintainer
//! scripts are debian/*), the way an operator handles it:
//! * `package_install_upgrade_purge`: a first install enables the unit and does not start it,
//!   and installs the man pages (every flag in `reaplet-run(1)`), the shell completions (bash
//!   completes a command), README.Debian, NEWS and the guide the README links to;
//!   an upgrade keeps the operator's config without a prompt and restarts the running service
//!   (a new process of the new binary) without touching a running pod; purge leaves nothing of
//!   reaplet behind (files, /etc/reaplet, enablement state);
//! * [`install`] then puts the upgrade package back, with the VM's config, for every scenario
//!   after it (whatever the scenario left).

use super::{Guest, R, REAPLET, UNIT, ensure, sh, show, wait_for};
use reaplet::cri::{ContainerRunState, Runtime};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The packages among the inputs (tests/vm/host.rs): the first install, and the same package
/// at a higher Debian revision.
const FIRST: &str = "reaplet.deb";
pub(super) const UPGRADE: &str = "reaplet-upgrade.deb";
/// The VM's config among the inputs (testbed/vm/config.yaml), written over the conffile.
const VM_CONFIG: &str = "config.yaml";
const CONFIG: &str = "/etc/reaplet/config.yaml";
/// What enabling the unit makes, and deb-systemd-helper's record of it.
const WANTS: &str = "/etc/systemd/system/multi-user.target.wants/reaplet.service";
const DSH_STATE: &str = "/var/lib/systemd/deb-systemd-helper-enabled/reaplet.service.dsh-also";
/// The upper bound of one dpkg run (an upgrade waits for the restarted reaplet's READY).
const DPKG_LIMIT: &str = "180";
/// The standby's marker in the kubelet's default root dir, which the purge removes too.
const MARKER: &str = "/var/lib/kubelet/reaplet-active.json";
/// Where nothing named after reaplet may be left after the purge.
const SEARCHED: [&str; 9] = [
    "/etc",
    "/lib/systemd",
    "/usr/lib/systemd",
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/bash-completion",
    "/usr/share/zsh",
    "/usr/share/fish",
    "/var/lib/systemd",
];
/// The docs and man pages dpkg takes back in (the guest's image leaves both out of every
/// package): man1 itself too, which the image's exclusion left uncreated.
const DOCS_IN: [&str; 3] = [
    "--path-include=/usr/share/doc/reaplet/*",
    "--path-include=/usr/share/man/man1",
    "--path-include=/usr/share/man/man1/reaplet*",
];
const DOC: &str = "/usr/share/doc/reaplet";
/// The VM's own files carry this prefix (testbed/vm/image.sh): the runner unit, a modules file.
const VM_OWN: &str = "reaplet-vm";

/// A command's trimmed stdout, whatever its exit status (`systemctl is-active` exits 3 for
/// `inactive`).
fn query(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// `dpkg ARGS` as an operator's unattended run: no terminal (a conffile prompt would fail on
/// stdin's end), bounded by [`DPKG_LIMIT`].
fn dpkg(args: &[&str]) -> R<String> {
    let out = Command::new("timeout")
        .arg(DPKG_LIMIT)
        .arg("dpkg")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("dpkg: {e}"))?;
    ensure(out.status.success(), || {
        format!(
            "dpkg {} failed ({}; 124 is the {DPKG_LIMIT} s bound): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs (or upgrades to) the package file `deb`. The guest's image leaves /usr/share/doc and
/// /usr/share/man out of every package (dpkg path-excludes, to stay small); reaplet's are taken
/// back in so that their install and purge are seen too.
pub(super) fn dpkg_install(deb: &Path) -> R<String> {
    let deb = deb.to_string_lossy();
    dpkg(&[DOCS_IN[0], DOCS_IN[1], DOCS_IN[2], "-i", &deb])
}

/// The first half of `dpkg -i`: the package's files unpacked (the old `prerm upgrade` leaves
/// the service running), not configured. `dpkg_configure` is the second half, whose postinst
/// restarts the service: under TCG the unpacking alone takes tens of seconds, so a scenario that
/// needs the restart at a chosen moment unpacks first.
pub(super) fn dpkg_unpack(deb: &Path) -> R<String> {
    let deb = deb.to_string_lossy();
    dpkg(&[DOCS_IN[0], DOCS_IN[1], DOCS_IN[2], "--unpack", &deb])
}

/// The second half of `dpkg -i`: postinst `configure` (reaplet.service `try-restart`).
pub(super) fn dpkg_configure() -> R<String> {
    dpkg(&["--configure", "reaplet"])
}

fn deb_version(deb: &Path) -> R<String> {
    sh("dpkg-deb", &["-f", &deb.to_string_lossy(), "Version"])
}

fn installed_version() -> String {
    query("dpkg-query", &["-W", "-f", "${Version}", "reaplet"])
}

/// The VM's config over the conffile, as an operator edits it.
fn write_config(inp: &Path) -> R<()> {
    sh(
        "install",
        &["-m", "0644", &inp.join(VM_CONFIG).to_string_lossy(), CONFIG],
    )
    .map(drop)
}

/// reaplet's main PID once the unit is active with a main process other than `not`.
/// The pod's container `cid` runs as it did `before` the upgrade: same start, still running.
pub(super) async fn untouched(
    g: &Guest,
    cid: &str,
    before: &reaplet::cri::ContainerDetail,
) -> R<()> {
    let after = g
        .cri
        .container_status(cid)
        .await
        .map_err(|e| format!("the pod's container is gone after the upgrade: {e}"))?;
    ensure(
        after.state == ContainerRunState::Running && after.started_at == before.started_at,
        || format!("the upgrade touched the pod's container: {before:?} then {after:?}"),
    )
}

pub(super) async fn wait_active(not: &str) -> R<String> {
    wait_for(Duration::from_secs(90), "reaplet to be active", || async {
        let pid = show(UNIT, "MainPID");
        (show(UNIT, "ActiveState") == "active" && pid != "0" && pid != not).then_some(pid)
    })
    .await
}

/// What the package carries for the operator to read: a man page for reaplet and each command,
/// `reaplet-run(1)` naming every flag; bash completing `reaplet ru` to `run`; zsh and fish
/// completions; README.Debian, NEWS and the changelog; every relative link of the README
/// resolving in the installed documentation.
fn installed_docs() -> R<String> {
    let pages = [
        "reaplet",
        "reaplet-run",
        "reaplet-check",
        "reaplet-pods",
        "reaplet-drain",
        "reaplet-make-room",
        "reaplet-version",
    ];
    for page in pages {
        let path = format!("/usr/share/man/man1/{page}.1.gz");
        let roff = sh("gzip", &["-dc", &path]).map_err(|e| format!("{path}: {e}"))?;
        ensure(roff.contains(&format!(".TH {page} 1")), || {
            format!(
                "{path} is not {page}'s man page: {}",
                &roff[..roff.len().min(200)]
            )
        })?;
        if page == "reaplet-run" {
            // roff writes a flag's dashes escaped
            let missing: Vec<&str> = reaplet::config::flags::FLAG_DOCS
                .iter()
                .map(|d| d.flag)
                .filter(|f| !roff.contains(&format!("\\-\\-{}", f.replace('-', "\\-"))))
                .collect();
            ensure(missing.is_empty(), || {
                format!("{path} does not name the flags {missing:?}")
            })?;
        }
    }
    let completed = sh(
        "bash",
        &[
            "-c",
            "source /usr/share/bash-completion/completions/reaplet && COMP_WORDS=(reaplet ru) \
             COMP_CWORD=1 && _reaplet reaplet ru reaplet && echo \"${COMPREPLY[*]}\"",
        ],
    )?;
    ensure(completed.trim() == "run", || {
        format!("bash completes `reaplet ru` to {completed:?}, not run")
    })?;
    for f in [
        "/usr/share/zsh/vendor-completions/_reaplet",
        "/usr/share/fish/vendor_completions.d/reaplet.fish",
        "/usr/share/doc/reaplet/README.Debian",
        "/usr/share/doc/reaplet/NEWS.Debian.gz",
        "/usr/share/doc/reaplet/changelog.Debian.gz",
    ] {
        ensure(Path::new(f).exists(), || format!("{f} not installed"))?;
    }
    let readme = std::fs::read_to_string(format!("{DOC}/README.md"))
        .map_err(|e| format!("{DOC}/README.md: {e}"))?;
    let mut links = 0;
    for target in readme
        .split("](")
        .skip(1)
        .filter_map(|s| s.split(')').next())
    {
        let file = target.split('#').next().unwrap_or_default();
        if file.is_empty() || file.contains("://") {
            continue;
        }
        links += 1;
        let path = Path::new(DOC).join(file);
        ensure(path.exists(), || {
            format!(
                "the README links {target}: {} is not installed",
                path.display()
            )
        })?;
    }
    ensure(links > 10, || {
        format!("only {links} relative links read in the README")
    })?;
    Ok(format!(
        "{} man pages, completions (bash completes `reaplet ru`), README.Debian, NEWS and the \
         {links} files the README links to installed",
        pages.len()
    ))
}

/// Everything below `dir` whose name mentions reaplet, but for the VM's own files; symlinks are
/// not followed.
fn named_reaplet(dir: &Path, found: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains("reaplet") && !name.starts_with(VM_OWN) {
            found.insert(e.path());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            named_reaplet(&e.path(), found);
        }
    }
}

pub(super) async fn install_upgrade_purge(g: &Guest, inp: &Path) -> R<String> {
    let (first, upgrade) = (inp.join(FIRST), inp.join(UPGRADE));
    let (v1, v2) = (deb_version(&first)?, deb_version(&upgrade)?);
    sh("dpkg", &["--compare-versions", &v2, "gt", &v1])
        .map_err(|_| format!("the upgrade package's version {v2} is not above {v1}"))?;

    // the first install: enabled, not started (the operator runs `reaplet check` first)
    dpkg_install(&first)?;
    ensure(installed_version() == v1, || {
        format!(
            "dpkg-query says version {:?}, {v1} installed",
            installed_version()
        )
    })?;
    let version = sh(REAPLET, &["version"])?;
    ensure(!version.contains("test-hooks"), || {
        format!("the package's reaplet has the test hooks: {version}")
    })?;
    let enabled = query("systemctl", &["is-enabled", UNIT]);
    ensure(enabled == "enabled", || {
        format!("after the first install `systemctl is-enabled` says {enabled:?}")
    })?;
    let active = query("systemctl", &["is-active", UNIT]);
    // the first scenario: the unit never left `inactive` in this boot unless the install started it
    let left = show(UNIT, "InactiveExitTimestampMonotonic");
    ensure(active == "inactive" && left == "0", || {
        format!(
            "the first install started reaplet: is-active {active:?}, left inactive at {left} µs"
        )
    })?;
    let conffiles = query("dpkg-query", &["-W", "-f", "${Conffiles}", "reaplet"]);
    ensure(
        conffiles
            .lines()
            .any(|l| l.split_whitespace().next() == Some(CONFIG)),
        || format!("{CONFIG} is not a conffile of the package: {conffiles:?}"),
    )?;
    let example = Path::new("/usr/share/doc/reaplet/examples/daemonset.yaml");
    ensure(example.exists(), || {
        format!("{} not installed", example.display())
    })?;
    let docs = installed_docs()?;

    // the operator's config, the start, a pod
    write_config(inp)?;
    sh("systemctl", &["start", "--no-block", UNIT])?;
    wait_active("").await?;
    let (manifest, p) = g.manifest_pod("packaged").await?;
    let r = upgrade_and_purge(g, inp, &manifest, &p, &v2).await;
    if r.is_err() {
        // the pod ends the next time reaplet runs
        let _ = std::fs::remove_file(&manifest);
    }
    let (pids, cid, removed) = r?;
    Ok(format!(
        "{v1} installed: enabled, never started, {CONFIG} a conffile, {docs}; upgraded to {v2} with the \
         operator's config kept (no prompt) and reaplet restarted into the new binary \
         (pid {pids}); the pod's container {} ran through the upgrade untouched; purge removed \
         the {removed} paths the package listed (its own directories among them), /etc/reaplet, \
         {WANTS}, deb-systemd-helper's state and {MARKER}: nothing named reaplet left in {}",
        &cid[..12.min(cid.len())],
        SEARCHED.join(", ")
    ))
}

/// The upgrade under a running pod, the pod's end, the purge. Returns the main PIDs before and
/// after the upgrade, the pod's container ID and how many of the package's paths the purge
/// removed.
async fn upgrade_and_purge(
    g: &Guest,
    inp: &Path,
    manifest: &Path,
    p: &reaplet_testbed::LaunchedPod,
    v2: &str,
) -> R<(String, String, usize)> {
    let pid0 = show(UNIT, "MainPID");
    let (_, cid) = p.containers[0].clone();
    let before = g
        .cri
        .container_status(&cid)
        .await
        .map_err(|e| e.to_string())?;

    dpkg_install(&inp.join(UPGRADE))?;
    ensure(installed_version() == v2, || {
        format!(
            "after the upgrade dpkg-query says {:?}, not {v2}",
            installed_version()
        )
    })?;
    let config = std::fs::read(CONFIG).map_err(|e| format!("{CONFIG}: {e}"))?;
    let written = std::fs::read(inp.join(VM_CONFIG)).map_err(|e| e.to_string())?;
    ensure(config == written, || {
        format!("the upgrade changed the operator's {CONFIG}")
    })?;
    // a conffile question (answered or not) leaves the package's version beside it (.dpkg-*)
    let beside: Vec<String> = std::fs::read_dir("/etc/reaplet")
        .map_err(|e| format!("/etc/reaplet: {e}"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".dpkg-"))
        .collect();
    ensure(beside.is_empty(), || {
        format!("the upgrade left {beside:?} beside the config")
    })?;
    let pid = wait_active(&pid0).await.map_err(|e| {
        format!("{e}: the upgrade did not restart the running reaplet (pid {pid0})")
    })?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
    ensure(exe == Path::new(REAPLET), || {
        format!("reaplet's new process runs {}", exe.display())
    })?;
    g.wait_known(&p.uid).await?;
    untouched(g, &cid, &before).await?;
    let ids: Vec<String> = g
        .cri
        .list_containers(Some(p.uid.as_str()))
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|c| c.id)
        .collect();
    ensure(ids == [cid.clone()], || {
        format!("the pod's containers after the upgrade: {ids:?}, only {cid} before")
    })?;

    // the pod ends, then the purge
    std::fs::remove_file(manifest).map_err(|e| e.to_string())?;
    let st = g.wait_stopped(p, Duration::from_secs(60)).await?;
    ensure(st[0].1 == 0, || {
        format!("the pod's container exit {}", st[0].1)
    })?;
    g.wait_slice_gone(&p.uid).await?;
    let listed: Vec<PathBuf> = sh("dpkg", &["-L", "reaplet"])?
        .lines()
        .map(PathBuf::from)
        .collect();
    for must in [REAPLET, "/lib/systemd/system/reaplet.service", CONFIG] {
        ensure(listed.iter().any(|l| l == Path::new(must)), || {
            format!("dpkg -L reaplet does not list {must}")
        })?;
    }
    // the package's files, and its own directories; the shared ones stay (/usr/bin, /lib: a
    // symlink to usr/lib on a merged-/usr system, hence the symlink followed)
    let owned: Vec<&PathBuf> = listed
        .iter()
        .filter(|l| {
            l.metadata().is_ok_and(|m| !m.is_dir()) || l.to_string_lossy().contains("reaplet")
        })
        .collect();
    for made in [WANTS, DSH_STATE] {
        ensure(Path::new(made).symlink_metadata().is_ok(), || {
            format!("{made} missing before the purge")
        })?;
    }
    // as a standby that acted in this boot leaves it (its name is the module's)
    ensure(MARKER.ends_with(reaplet::standby::marker::FILE), || {
        format!("{MARKER} is not the marker's name")
    })?;
    std::fs::write(MARKER, b"{}").map_err(|e| format!("{MARKER}: {e}"))?;
    dpkg(&["--purge", "reaplet"])?;
    let status = query(
        "dpkg-query",
        &["-W", "-f", "${db:Status-Status}", "reaplet"],
    );
    ensure(status.is_empty() || status == "not-installed", || {
        format!("after the purge dpkg-query says {status:?}")
    })?;
    let (active, load) = (show(UNIT, "ActiveState"), show(UNIT, "LoadState"));
    ensure(active == "inactive" && load == "not-found", || {
        format!(
            "after the purge the unit is {active} and {load}: not stopped, or systemd not reloaded"
        )
    })?;
    let left: Vec<&&PathBuf> = owned
        .iter()
        .filter(|l| l.symlink_metadata().is_ok())
        .collect();
    ensure(left.is_empty(), || {
        format!("the purge left files the package listed: {left:?}")
    })?;
    let mut named = BTreeSet::new();
    for dir in SEARCHED {
        named_reaplet(Path::new(dir), &mut named);
    }
    ensure(named.is_empty(), || {
        format!("the purge left these behind: {named:?}")
    })?;
    ensure(!Path::new(MARKER).exists(), || {
        format!("the purge left the standby's marker {MARKER}")
    })?;
    Ok((format!("{pid0} -> {pid}"), cid, owned.len()))
}

/// The upgrade package installed (or reinstalled) with the VM's config, reaplet stopped: what
/// the scenarios after the package scenario start from, whatever it left.
pub(super) async fn install(inp: &Path) -> R<String> {
    if show(UNIT, "ActiveState") != "inactive" {
        // stopping reaplet never stops a pod
        sh("systemctl", &["stop", UNIT])?;
    }
    dpkg_install(&inp.join(UPGRADE))?;
    write_config(inp)?;
    let active = show(UNIT, "ActiveState");
    ensure(active == "inactive", || {
        format!("reaplet is {active} after its install")
    })?;
    Ok(format!(
        "reaplet {} installed from the package, {CONFIG} from testbed/vm/config.yaml",
        installed_version()
    ))
}
