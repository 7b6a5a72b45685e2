//! The command line's definition: the commands, their flags, and what `--help`, the man pages,
//! the shell completions and `docs/configure.md` say of them (the kubelet's
//! `cmd/kubelet/app/options` with its `--help` flag sections). The binary parses argv with
//! [`parse_from`]; the package's man pages and completions are made from [`command`] when the
//! package is built (`xtask/`); `tests/docs.rs` checks `docs/configure.md`'s flag reference
//! against [`flag_reference`].
//!
//! Invariants:
//! * one definition: `--help`, the man pages, the completions and the guide's flag reference are
//!   all rendered from [`command`] and [`FLAG_DOCS`], never written twice;
//! * every help screen (`-h` and `--help` alike) fits a terminal: `reaplet run --help` lists the
//!   flags an operator sets first, by topic, and says where the rest are; the man page lists
//!   every flag with its default, config file key and environment variable;
//! * nothing here reads argv, the environment or a file but through clap.

use crate::config::flags::{FLAG_DOCS, FlagDoc, Flags, Topic};
use crate::drain::cli::{DrainCmd, MakeRoomCmd};
use crate::pods_view::PodsArgs;
use clap::{Arg, ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::fmt::Write as _;

#[derive(Parser)]
#[command(
    name = "reaplet",
    version,
    about = "Ends pods on a Kubernetes node the way the kubelet does"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the agent: watch this node's pods and end those that must stop.
    Run(Flags),
    /// Preflight: check the runtime, cgroups, root dir, API access and logind.
    ///
    /// Takes the flags of `reaplet run`; exits 1 on a failure.
    Check(Flags),
    /// Show what a running agent sees (from its local status endpoint).
    Pods(PodsArgs),
    /// Empty this node: cordon it, then evict its pods.
    ///
    /// Through the Eviction API (PodDisruptionBudgets hold), lower priority first, each owner's
    /// pods one at a time (the ReplicaSet scale-down ranking).
    Drain(DrainCmd),
    /// Evict the fewest lower-priority pods a pod of priority P needs.
    ///
    /// Frees what the pod requests on this node, through the Eviction API, choosing victims as
    /// the scheduler's preemption does.
    MakeRoom(MakeRoomCmd),
    /// Print the version.
    Version,
}

/// The subcommands that take the agent's flags ([`Flags`]).
pub const AGENT_COMMANDS: [&str; 2] = ["run", "check"];

/// The operator's commands (exit codes [`crate::drain::cli::CliError::exit_code`]).
pub const OPERATOR_COMMANDS: [&str; 2] = ["drain", "make-room"];

/// `reaplet help [COMMAND]`: the command's one screen, as its `-h` prints it (clap's own help
/// command prints the long help, the man page's). Hidden: `--help` is the one advertised.
const HELP: &str = "help";

/// argv parsed (`args` starts with the program's name).
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    parse_with(command(), args)
}

/// [`parse_from`] with the definition `cmd` (a test's fixed terminal width).
fn parse_with<I, T>(cmd: clap::Command, args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = cmd;
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    if let Some((HELP, m)) = matches.subcommand() {
        let mut argv = vec![std::ffi::OsString::from("reaplet")];
        argv.extend(m.get_one::<String>("command").map(Into::into));
        argv.push("--help".into());
        // `--help` always ends the parse with the screen (an unknown command: clap's error)
        return Err(cmd
            .try_get_matches_from_mut(argv)
            .err()
            .unwrap_or_else(|| clap::Error::new(clap::error::ErrorKind::DisplayHelp)));
    }
    Cli::from_arg_matches_mut(&mut matches)
}

/// The whole command line: the derived definition with the flags' topics, the man page's long
/// help (default, config file key) and one-screen help flags.
pub fn command() -> clap::Command {
    let help = clap::Command::new(HELP)
        .about("Print a command's help")
        .hide(true)
        .arg(Arg::new("command").value_name("COMMAND"));
    documented().subcommand(help)
}

/// The commands as documented: [`command`] without the hidden `help`.
fn documented() -> clap::Command {
    let mut cmd = short_help(Cli::command())
        .disable_help_subcommand(true)
        .max_term_width(100);
    for name in AGENT_COMMANDS {
        cmd = cmd.mut_subcommand(name, with_flag_docs);
    }
    cmd
}

/// The commands as the man pages and completions are made from them (no hidden `help`, which
/// the completions would offer): each agent flag names its environment variable too.
pub fn man_command() -> clap::Command {
    let mut cmd = documented();
    for name in AGENT_COMMANDS {
        cmd = cmd.mut_subcommand(name, |c| c.mut_args(|a| a.hide_env(false)));
    }
    cmd
}

/// `-h` and `--help` both print the one-screen help (clap's `--help` would print the long help,
/// which is the man page's), in this command and every subcommand.
fn short_help(cmd: clap::Command) -> clap::Command {
    let help = Arg::new("help")
        .short('h')
        .long("help")
        .action(ArgAction::HelpShort)
        .help("Print help (every flag: the man page)")
        .global(false);
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cmd = cmd.disable_help_flag(true).arg(help);
    for name in names {
        cmd = cmd.mut_subcommand(name, short_help);
    }
    cmd
}

/// Sets each agent flag's topic, whether `--help` lists it, and its long help (the man page's):
/// the help, then its default and its config file key.
fn with_flag_docs(mut cmd: clap::Command) -> clap::Command {
    for d in FLAG_DOCS {
        // the derived argument's id is its field's name
        cmd = cmd.mut_arg(d.flag.replace('-', "_"), |a| {
            let long = long_help(&a, d);
            // the screen names the variables once, in its footer; the man page each of them
            a.help_heading(d.topic.heading())
                .hide_short_help(!d.on_screen)
                .hide_env(true)
                .long_help(long)
        });
    }
    let shown = FLAG_DOCS.iter().filter(|d| d.on_screen).count();
    let name = cmd.get_name().to_owned();
    cmd.after_help(format!(
        "{shown} of {} flags shown; each is also REAPLET_<FLAG> in the environment, and all \
         but --config a key of the config file. All of them: man reaplet-{}, or \
         docs/configure.md.",
        FLAG_DOCS.len(),
        name
    ))
}

/// One flag's help with what the reference adds: the details, its default and its file key.
fn long_help(a: &Arg, d: &FlagDoc) -> String {
    let mut text = help_text(a);
    let mut extra = Vec::new();
    if !d.default.is_empty() {
        extra.push(format!("Default: {}.", d.default));
    }
    if !d.key.is_empty() {
        extra.push(format!("Config file: {}.", file_key(d)));
    }
    if !extra.is_empty() {
        text.push_str("\n\n");
        text.push_str(&extra.join(" "));
    }
    text
}

/// A flag's own help (the doc comment: its first line and the details), ending with a full
/// stop (clap takes the stop off a help of one paragraph).
fn help_text(a: &Arg) -> String {
    let mut text = a
        .get_long_help()
        .or(a.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    if !text.is_empty() && !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// The key as it is written in the file (`tracing.endpoint` is `endpoint` below `tracing:`).
fn file_key(d: &FlagDoc) -> String {
    match d.key.split_once('.') {
        Some((outer, inner)) => format!("{outer}: {{{inner}}}"),
        None => d.key.to_owned(),
    }
}

/// `docs/configure.md`'s flag reference: one table per topic (flag, file key, default, meaning),
/// rendered from [`command`]; the page holds it between two marker comments.
pub fn flag_reference() -> String {
    // the flags' own help, without what `command` adds to it for the man page
    let cmd = Cli::command();
    let run = cmd
        .find_subcommand("run")
        .expect("the run command is defined");
    let mut out = String::new();
    for topic in Topic::ALL {
        let _ = writeln!(out, "### {}\n", topic.heading());
        out.push_str("| flag | file key | default | meaning |\n|---|---|---|---|\n");
        for d in FLAG_DOCS.iter().filter(|d| d.topic == topic) {
            let arg = run
                .get_arguments()
                .find(|a| a.get_long() == Some(d.flag))
                .expect("every documented flag is defined (tested)");
            let meaning = one_line(&help_text(arg));
            let key = if d.key.is_empty() {
                String::new()
            } else {
                format!("`{}`", file_key(d))
            };
            let default = if d.default.is_empty() {
                String::new()
            } else {
                cell(d.default)
            };
            let _ = writeln!(out, "| `--{}` | {key} | {default} | {} |", d.flag, meaning);
        }
        out.push('\n');
    }
    out
}

/// A help text as one table cell: paragraphs joined; `|`, `<` and `>` escaped (a
/// `CN=system:node:<name>` is no HTML tag).
fn one_line(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .join(" ")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A default as a table cell: a value as code, words (with a space) as they are.
fn cell(default: &str) -> String {
    if default.contains(' ') {
        one_line(default)
    } else {
        format!("`{default}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_flag_has_one_doc_and_every_doc_one_flag() {
        let cmd = command();
        let run = cmd.find_subcommand("run").unwrap();
        let flags: Vec<&str> = run
            .get_arguments()
            .filter_map(Arg::get_long)
            .filter(|l| *l != "help")
            .collect();
        let docs: Vec<&str> = FLAG_DOCS.iter().map(|d| d.flag).collect();
        let mut seen = HashSet::new();
        for d in &docs {
            assert!(seen.insert(*d), "--{d} is documented twice");
        }
        let mut missing: Vec<&str> = flags
            .iter()
            .filter(|f| !docs.contains(f))
            .copied()
            .collect();
        missing.sort_unstable();
        assert!(missing.is_empty(), "flags without a FlagDoc: {missing:?}");
        let extra: Vec<&str> = docs
            .iter()
            .filter(|d| !flags.contains(d))
            .copied()
            .collect();
        assert!(extra.is_empty(), "FlagDocs without a flag: {extra:?}");
    }

    /// The flags `reaplet run ARGS` parses to.
    fn run_flags(args: &[String]) -> Flags {
        let mut argv = vec!["reaplet".to_owned(), "run".to_owned()];
        argv.extend_from_slice(args);
        match parse_from(&argv).unwrap().command {
            Command::Run(flags) => flags,
            _ => panic!("{argv:?} is no run"),
        }
    }

    /// The flag's documented default when it is a value ("2m (at least 1s)": the value before
    /// the words); none when it is words ("detected from the runtime": computed elsewhere).
    fn value_default(d: &FlagDoc) -> Option<&'static str> {
        let value = d.default.split(" (").next().unwrap_or_default();
        (!value.is_empty() && !value.contains(' ')).then_some(value)
    }

    /// Each flag and its file key set the same setting: the flag given a value, and the key
    /// given it in reaplet's file, read to the same settings layer (the documented default is
    /// the value: one every flag with a value default accepts).
    #[test]
    fn a_flag_and_its_file_key_set_the_same_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        let mut checked = 0;
        for d in FLAG_DOCS.iter().filter(|d| !d.key.is_empty()) {
            let Some(value) = value_default(d) else {
                continue;
            };
            let flags = run_flags(&[format!("--{}={value}", d.flag)]);
            let entry = match d.key.split_once('.') {
                Some((outer, inner)) => format!("{outer}:\n  {inner}: {value:?}\n"),
                None => format!("{}: {value:?}\n", d.key),
            };
            std::fs::write(
                &path,
                format!(
                    "apiVersion: {}\nkind: {}\n{entry}",
                    crate::config::REAPLET_API_VERSION,
                    crate::config::REAPLET_KIND
                ),
            )
            .unwrap();
            let file = crate::config::RawSettings::from_file(&path)
                .unwrap_or_else(|e| panic!("{entry}: {e}"));
            assert_eq!(flags.raw(), file, "--{} and {entry}", d.flag);
            checked += 1;
        }
        assert!(checked >= 25, "only {checked}");
    }

    #[test]
    fn every_file_key_is_a_key_of_the_file() {
        use crate::config::FIELDS;
        for d in FLAG_DOCS.iter().filter(|d| !d.key.is_empty()) {
            assert!(
                FIELDS.contains(&d.key),
                "--{}: {:?} is no key",
                d.flag,
                d.key
            );
        }
        // every key but the list has its flag
        let keyed: Vec<&str> = FLAG_DOCS.iter().map(|d| d.key).collect();
        let flagless = ["shutdownGracePeriodByPodPriority"];
        for k in FIELDS {
            assert!(
                keyed.contains(k) || flagless.contains(k),
                "the file key {k} has no flag in FLAG_DOCS"
            );
        }
    }

    #[test]
    fn the_topics_are_listed_in_order_and_none_is_empty() {
        let mut last = 0;
        for d in FLAG_DOCS {
            let i = Topic::ALL.iter().position(|t| *t == d.topic).unwrap();
            assert!(i >= last, "--{} is listed out of its topic's order", d.flag);
            last = i;
        }
        for t in Topic::ALL {
            assert!(FLAG_DOCS.iter().any(|d| d.topic == t), "{t:?} is empty");
        }
    }

    /// A help screen as clap renders it on a terminal `width` columns wide.
    fn help_at(width: usize, args: &[&str]) -> String {
        let mut argv = vec!["reaplet"];
        argv.extend_from_slice(args);
        match parse_with(command().term_width(width), &argv) {
            Ok(_) => panic!("{args:?} parsed"),
            Err(e) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{args:?}");
                e.render().to_string()
            }
        }
    }

    /// At the width clap caps it to (a wider terminal shows the same).
    fn help_of(args: &[&str]) -> String {
        help_at(100, args)
    }

    /// Every screen: `--help`, `-h` and `help COMMAND` print the same one, 40 lines at most
    /// on a terminal of 100 columns (or wider), 55 on one of 80, never a line past the edge;
    /// the width is the test's, not the terminal's it runs in.
    #[test]
    fn every_help_screen_fits_a_terminal_and_all_three_ways_agree() {
        let cmd = command();
        let mut screens = vec![vec!["--help"]];
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            screens.push(vec![s.get_name(), "--help"]);
        }
        for (width, most) in [(100, 40), (80, 55)] {
            for args in &screens {
                let text = help_at(width, args);
                let lines = text.lines().count();
                assert!(lines <= most, "{args:?} at {width}: {lines} lines:\n{text}");
                for l in text.lines() {
                    assert!(
                        l.chars().count() <= width,
                        "{args:?}: a line of {} columns: {l}",
                        l.chars().count()
                    );
                }
                let mut short = args.clone();
                *short.last_mut().unwrap() = "-h";
                assert_eq!(
                    help_at(width, &short),
                    text,
                    "{args:?}: -h and --help differ"
                );
                // `help run` is `run --help`; `help` alone is `--help`
                let mut help = vec!["help"];
                help.extend(&args[..args.len() - 1]);
                assert_eq!(help_at(width, &help), text, "{help:?} and {args:?} differ");
            }
        }
        let e = parse_from(["reaplet", "help", "no-such-command"])
            .err()
            .expect("an unknown command");
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
    }

    #[test]
    fn run_help_groups_its_flags_and_names_where_the_rest_are() {
        let text = help_of(&["run", "--help"]);
        let mut at = 0;
        for t in Topic::ALL {
            let shown = FLAG_DOCS.iter().any(|d| d.topic == t && d.on_screen);
            match text.find(&format!("{}:", t.heading())) {
                Some(i) => {
                    assert!(shown, "{t:?} has a heading but no flag on screen");
                    assert!(i >= at, "{t:?} out of order");
                    at = i;
                }
                None => assert!(!shown, "{t:?}'s heading is missing:\n{text}"),
            }
        }
        for d in FLAG_DOCS {
            let listed = text.contains(&format!("--{} ", d.flag));
            assert_eq!(
                listed, d.on_screen,
                "--{} on screen: {listed}\n{text}",
                d.flag
            );
        }
        assert!(text.contains("man reaplet-run"), "{text}");
        // the long help (the man page's) carries the default and the file key
        let cmd = command();
        let arg = cmd
            .find_subcommand("run")
            .unwrap()
            .get_arguments()
            .find(|a| a.get_long() == Some("root-dir"))
            .unwrap();
        let long = arg.get_long_help().unwrap().to_string();
        assert!(long.contains("Default: /var/lib/kubelet."), "{long}");
        assert!(long.contains("Config file: rootDir."), "{long}");
    }

    /// Every default the reference gives as a value ("2m (at least 1s)": the value before the
    /// words) is the one the settings resolve to: the flag set to it gives the settings no
    /// flag gives. A default in words ("detected from the runtime") is computed elsewhere.
    #[test]
    fn every_documented_default_is_the_resolved_one() {
        let resolved = |args: &[String]| {
            crate::config::resolve(run_flags(args).raw())
                .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        };
        let mut checked = Vec::new();
        for d in FLAG_DOCS {
            let Some(value) = value_default(d) else {
                continue;
            };
            // the sampling rate is one of a tracing configuration: any of its fields turns
            // tracing on (the kubelet's endpoint default), so both sides have an endpoint
            // (and merging the kubelet's defaults matters only beside an evictionHard given)
            let context: Vec<String> = match d.key.split_once('.') {
                Some(("tracing", "samplingRatePerMillion")) => {
                    vec!["--tracing-endpoint=http://127.0.0.1:4317".into()]
                }
                _ if d.flag == "merge-default-eviction-settings" => {
                    vec!["--eviction-hard=memory.available<50Mi".into()]
                }
                _ => Vec::new(),
            };
            let base = resolved(&context);
            let mut args = context.clone();
            args.push(format!("--{}={value}", d.flag));
            assert_eq!(
                resolved(&args),
                base,
                "--{}: the documented default {value:?} is not the default",
                d.flag
            );
            checked.push(d.flag);
        }
        assert!(checked.len() >= 25, "only {checked:?}");
    }

    #[test]
    fn the_reference_lists_every_flag_with_its_key() {
        let md = flag_reference();
        for d in FLAG_DOCS {
            assert!(md.contains(&format!("| `--{}` |", d.flag)), "--{}", d.flag);
        }
        assert!(
            md.contains("| `--tracing-endpoint` | `tracing: {endpoint}` |"),
            "{md}"
        );
        assert!(
            md.contains("| `--root-dir` | `rootDir` | `/var/lib/kubelet` |"),
            "{md}"
        );
    }
}
