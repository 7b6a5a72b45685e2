//! The documentation's own checks: every relative link in the README, the guide (`docs/`) and
//! BENCHMARKS.md resolves (the file exists; an anchor names a heading of it, as GitHub makes
//! anchors), the README stays a front page, and the configuration guide names every flag of
//! `reaplet run`, so that a flag added to the CLI without its documentation fails here.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files the checks read: README.md, BENCHMARKS.md and every `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The lines of `text` outside fenced code blocks, with their line numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((n + 1, line));
        }
    }
    out
}

/// `line` without its inline code spans (a link inside backticks is no link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut code = false;
    for c in line.chars() {
        if c == '`' {
            code = !code;
        } else if !code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links (`[text](target)`) on `line`.
fn links(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else { break };
        // a title after the target (`(path "title")`) is not part of it
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor of a heading's text: lower case, inline links read as their text, every
/// character but letters, digits, spaces, `-` and `_` dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) -> text
    while let Some(i) = rest.find('[') {
        text.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated heading gets `-1`, `-2`, ...).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose(text) {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let heading = t.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading.trim());
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (n, line) in prose(&text) {
            for target in links(line) {
                let external = ["http://", "https://", "mailto:"]
                    .iter()
                    .any(|s| target.starts_with(s));
                if external || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                let name = page.strip_prefix(root()).unwrap().display().to_string();
                if !file.exists() {
                    broken.push(format!("{name}:{n}: {target}: no such file"));
                    continue;
                }
                if let Some(a) = anchor
                    && file.extension().is_some_and(|x| x == "md")
                {
                    let there = std::fs::read_to_string(&file).unwrap();
                    if !anchors(&there).contains(a) {
                        broken.push(format!("{name}:{n}: {target}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(checked > 0, "no relative link found: the parser is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: the front page stays at about 200, the rest goes to docs/"
    );
}

const REFERENCE_BEGIN: &str =
    "<!-- BEGIN flag reference (generated: edit src/config/flags.rs) -->\n";
const REFERENCE_END: &str = "<!-- END flag reference -->\n";

/// `docs/configure.md`'s flag tables are what the code renders from the flags' definitions
/// (`reaplet::cli::flag_reference`); `REAPLET_BLESS=1` writes them into the page instead.
#[test]
fn the_configuration_guide_has_the_flag_reference_the_code_renders() {
    let path = root().join("docs/configure.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let begin = page
        .find(REFERENCE_BEGIN)
        .expect("the reference's BEGIN marker")
        + REFERENCE_BEGIN.len();
    let end = page
        .find(REFERENCE_END)
        .expect("the reference's END marker");
    assert!(begin <= end, "the reference's markers are out of order");
    let want = reaplet::cli::flag_reference();
    if page[begin..end] == want {
        return;
    }
    if std::env::var_os("REAPLET_BLESS").is_some() {
        let new = format!("{}{want}{}", &page[..begin], &page[end..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    let line = page[..begin].lines().count() + 1;
    let first = page[begin..end]
        .lines()
        .zip(want.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| page[begin..end].lines().count().min(want.lines().count()));
    panic!(
        "docs/configure.md's flag reference (line {line}) is not what the flags' definitions \
         render; first difference at its line {}: {:?} where the code renders {:?}. Run \
         `REAPLET_BLESS=1 cargo test --test docs` to write it",
        first + 1,
        page[begin..end].lines().nth(first),
        want.lines().nth(first)
    );
}

/// The guide's table of the kubelet's fields reaplet reads names exactly the fields it reads
/// (`config::kubelet::HONOURED`): its first column, each field in backticks.
#[test]
fn the_kubelet_fields_table_names_every_field_read_and_no_other() {
    let page = std::fs::read_to_string(root().join("docs/configure.md")).unwrap();
    let table = page
        .split("| kubelet field | reaplet setting | notes |")
        .nth(1)
        .expect("docs/configure.md has the kubelet fields table");
    let mut named = Vec::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or_default();
        named.extend(first.split('`').skip(1).step_by(2).map(str::to_owned));
    }
    let read = reaplet::config::kubelet::HONOURED;
    let missing: Vec<&&str> = read
        .iter()
        .filter(|f| !named.iter().any(|n| n == *f))
        .collect();
    let extra: Vec<&String> = named
        .iter()
        .filter(|n| !read.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "read but not in the table: {missing:?}; in the table but not read: {extra:?}"
    );
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("Emptying or relieving a node: `reaplet drain` and `reaplet make-room`"),
        "emptying-or-relieving-a-node-reaplet-drain-and-reaplet-make-room"
    );
    assert_eq!(
        slug("1. One pod, 20 times (`single`)"),
        "1-one-pod-20-times-single"
    );
    assert_eq!(slug("See [the guide](docs/x.md) now"), "see-the-guide-now");
    let a = anchors("# A\n## A\n```\n# not a heading\n```\n#nospace\n");
    assert_eq!(a, HashSet::from(["a".to_owned(), "a-1".to_owned()]));
    assert_eq!(
        links("see [a](docs/a.md#x) and `[b](nope.md)` and [c](https://e.org)"),
        ["docs/a.md#x", "https://e.org"]
    );
}
