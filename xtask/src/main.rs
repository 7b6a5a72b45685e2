//! `reaplet-xtask dist DIR`: writes what the Debian package carries besides the binary, made
//! from reaplet's command-line definition ([`reaplet::cli::man_command`]) at package build time:
//!
//! * `DIR/man/reaplet.1.gz` and `DIR/man/reaplet-<command>.1.gz` for each command (roff,
//!   gzipped as Debian's policy wants them: cargo-deb leaves files under `target/release`
//!   alone): every flag with its default, config file key and environment variable, by topic,
//!   then the exit codes, files and where the guide is;
//! * `DIR/completions/reaplet.bash`, `_reaplet` (zsh) and `reaplet.fish`;
//! * `DIR/NEWS.Debian.gz`, `debian/NEWS` gzipped under the name apt-listchanges reads.
//!
//! Invariants: it only writes below DIR, and leaves in `DIR/man` and `DIR/completions` only what
//! this definition makes (a page of a removed command is gone); the same definition gives the
//! same files (no date, no host name in them), so a package build is reproducible.

use clap_complete::Shell;
use std::io::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = match args.as_slice() {
        [cmd, dir] if cmd == "dist" => PathBuf::from(dir),
        _ => {
            eprintln!("usage: reaplet-xtask dist DIR");
            std::process::exit(64);
        }
    };
    if let Err(e) = dist(&dir) {
        eprintln!("reaplet-xtask: {}: {e}", dir.display());
        std::process::exit(1);
    }
}

fn dist(dir: &Path) -> std::io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        match std::fs::remove_dir_all(d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => std::fs::create_dir_all(d)?,
        }
    }
    let mut cmd = reaplet::cli::man_command();
    cmd.build();
    let mut pages = vec![man_page(&cmd, &man, true)?];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push(man_page(sub, &man, false)?);
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut c = reaplet::cli::man_command();
        let path = clap_complete::generate_to(shell, &mut c, "reaplet", &completions)?;
        pages.push(path);
    }
    pages.push(gzip(
        &std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../debian/NEWS"))?,
        &dir.join("NEWS.Debian.gz"),
    )?);
    for p in pages {
        println!("{}", p.display());
    }
    Ok(())
}

/// `data` gzipped into `path`, with no name and no time in the header (`gzip -n`): the same
/// data, the same bytes.
fn gzip(data: &[u8], path: &Path) -> std::io::Result<PathBuf> {
    let f = std::fs::File::create(path)?;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(f, flate2::Compression::best());
    gz.write_all(data)?;
    gz.finish()?.sync_all()?;
    Ok(path.to_owned())
}

/// One man page: clap_mangen's sections, then the ones a daemon's page carries.
fn man_page(cmd: &clap::Command, dir: &Path, top: bool) -> std::io::Result<PathBuf> {
    let man = clap_mangen::Man::new(cmd.clone())
        .source(format!("reaplet {}", reaplet_version()))
        .manual("reaplet manual")
        .date("");
    let path = dir.join(format!("{}.gz", man.get_filename()));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    // clap_mangen's synopsis lists every flag: 46 of them for `run`
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let words = name
        .replace('-', "\\-")
        .replacen("reaplet\\-", "reaplet ", 1);
    let what = if cmd.has_subcommands() {
        "COMMAND"
    } else {
        "OPTIONS"
    };
    out.extend_from_slice(format!(".SH SYNOPSIS\n\\fB{words}\\fR [\\fI{what}\\fR]\n").as_bytes());
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut out)?;
    }
    out.extend_from_slice(tail(cmd, top).as_bytes());
    gzip(&out, &path)
}

/// reaplet's version, as `reaplet --version` prints it.
fn reaplet_version() -> String {
    reaplet::cli::command()
        .get_version()
        .unwrap_or_default()
        .to_string()
}

/// The sections after the options: the environment, exit codes and files of the agent's
/// commands, and where to read on.
fn tail(cmd: &clap::Command, top: bool) -> String {
    let agent = top || reaplet::cli::AGENT_COMMANDS.contains(&cmd.get_name());
    let mut s = String::new();
    if agent {
        s.push_str(concat!(
            ".SH ENVIRONMENT\n",
            "Every flag of \\fBreaplet run\\fR and \\fBreaplet check\\fR is also read from\n",
            "\\fBREAPLET_\\fR and the flag in upper snake case (\\fBREAPLET_ROOT_DIR\\fR for\n",
            "\\fB\\-\\-root\\-dir\\fR). Precedence: flags, then the environment, then reaplet's config\n",
            "file, then the kubelet's config file, then the defaults.\n",
            ".SH EXIT STATUS\n",
            ".TP\n0\nsuccess; \\fB\\-\\-help\\fR, \\fB\\-\\-version\\fR\n",
            ".TP\n1\na runtime failure; \\fBreaplet check\\fR found a FAIL\n",
            ".TP\n64\na configuration problem, found before anything starts; one line names the field\n",
            ".TP\n75\nthe API server refused reaplet's credentials for 5 minutes (systemd restarts it,\n",
            "and the restart reads the rotated credentials)\n",
            ".SH FILES\n",
            ".TP\n/etc/reaplet/config.yaml\n",
            "the configuration \\fBreaplet.service\\fR runs with (kind ReapletConfiguration)\n",
            ".TP\n/var/lib/kubelet/config.yaml\n",
            "the kubelet's configuration, read (never written) when named by \\fBkubeletConfig\\fR\n",
            ".TP\n/usr/share/doc/reaplet/\n",
            "the guide (README.Debian first), the example configuration, RBAC and DaemonSet\n",
        ));
    }
    if reaplet::cli::OPERATOR_COMMANDS.contains(&cmd.get_name()) {
        s.push_str(&format!(
            concat!(
                ".SH EXIT STATUS\n",
                ".TP\n0\ndone\n",
                ".TP\n1\na failure: the API server, a timeout, an eviction refused to the end\n",
                ".TP\n{usage}\na wrong flag or kubeconfig (make\\-room: also a wrong pod manifest, \
                 or a pod admission would refuse)\n",
                ".TP\n{interrupted}\ninterrupted (Ctrl\\-C): no more evictions; the pods left are named\n",
            ),
            usage = reaplet::drain::cli::EXIT_USAGE,
            interrupted = reaplet::drain::cli::EXIT_INTERRUPTED,
        ));
    }
    s.push_str(concat!(
        ".SH SEE ALSO\n",
        "\\fBreaplet\\fR(1), \\fBreaplet\\-run\\fR(1), \\fBreaplet\\-check\\fR(1),\n",
        "\\fBreaplet\\-pods\\fR(1), \\fBreaplet\\-drain\\fR(1), \\fBreaplet\\-make\\-room\\fR(1),\n",
        "\\fBreaplet\\-version\\fR(1),\n",
        "\\fBsystemctl\\fR(1), \\fBjournalctl\\fR(1); the guide in /usr/share/doc/reaplet/\n",
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    fn read_gz(path: &Path) -> String {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        text
    }

    #[test]
    fn dist_writes_every_page_and_completion_the_same_each_time() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        dist(a.path()).unwrap();
        dist(b.path()).unwrap();
        let pages = [
            "reaplet",
            "reaplet-run",
            "reaplet-check",
            "reaplet-pods",
            "reaplet-drain",
        ];
        for page in pages
            .iter()
            .chain(&["reaplet-make-room", "reaplet-version"])
        {
            let name = format!("man/{page}.1.gz");
            let (x, y) = (a.path().join(&name), b.path().join(&name));
            assert_eq!(
                std::fs::read(&x).unwrap(),
                std::fs::read(&y).unwrap(),
                "{name}"
            );
            let roff = read_gz(&x);
            assert!(
                roff.contains(&format!(".TH {page} 1")),
                "{name}: {roff:.200}"
            );
            assert!(roff.contains(".SH SEE ALSO"), "{name}");
        }
        let run = read_gz(&a.path().join("man/reaplet-run.1.gz"));
        for d in reaplet::config::flags::FLAG_DOCS {
            let flag = format!("\\-\\-{}", d.flag.replace('-', "\\-"));
            assert!(run.contains(&flag), "reaplet-run(1) lacks --{}", d.flag);
        }
        assert!(run.contains("Config file: rootDir."), "the file keys");
        assert!(run.contains("REAPLET_ROOT_DIR"), "the environment");
        assert!(run.contains(".SH EXIT STATUS"), "the exit codes");
        let drain = read_gz(&a.path().join("man/reaplet-drain.1.gz"));
        assert!(drain.contains("\n130\ninterrupted"), "drain's exit codes");
        assert!(!read_gz(&a.path().join("man/reaplet-pods.1.gz")).contains(".SH EXIT STATUS"));
        assert!(
            !a.path().join("man/reaplet-help.1.gz").exists(),
            "help is hidden"
        );
        // a page of a command no longer defined is gone
        std::fs::write(a.path().join("man/reaplet-gone.1.gz"), b"").unwrap();
        dist(a.path()).unwrap();
        assert!(!a.path().join("man/reaplet-gone.1.gz").exists());
        let news = read_gz(&a.path().join("NEWS.Debian.gz"));
        assert!(news.starts_with("reaplet ("), "{news:.100}");
        for f in ["reaplet.bash", "_reaplet", "reaplet.fish"] {
            let text = std::fs::read_to_string(a.path().join("completions").join(f)).unwrap();
            assert!(text.contains("make-room"), "{f} completes the commands");
            assert!(text.contains("root-dir"), "{f} completes the flags");
        }
    }
}
