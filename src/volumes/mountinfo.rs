//! mountinfo, as `k8s.io/mount-utils` reads it: parsed by the `procfs` crate line by line,
//! the kernel's escapes undone. Read through a path (procfs in production, a fixture in tests).

use std::path::{Path, PathBuf};

/// One entry of `/proc/self/mountinfo`, as `procfs` parses it; [`parse_mountinfo`] undoes
/// the kernel's escapes in `root` and `mount_point`.
pub use procfs::process::MountInfo;

/// Parses mountinfo text with `procfs`, line by line: a malformed line is skipped (never a
/// panic, and one bad line does not hide the others).
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| MountInfo::from_line(line).ok())
        .map(|mut m| {
            m.root = unescape(&m.root);
            m.mount_point = PathBuf::from(unescape(&m.mount_point.to_string_lossy()));
            m
        })
        .collect()
}

/// Reads and parses a mountinfo file (`/proc/self/mountinfo` in production, a fixture in
/// tests).
pub fn read_mountinfo(path: &Path) -> std::io::Result<Vec<MountInfo>> {
    // bytes, not a string: one mount point that is not UTF-8 anywhere on the node must not
    // make the whole table unreadable
    Ok(parse_mountinfo(&String::from_utf8_lossy(&std::fs::read(
        path,
    )?)))
}

/// Undoes the kernel's escapes in mountinfo paths (`seq_file`'s `mangle`: `\040` space,
/// `\011` tab, `\012` newline, `\134` backslash; no other character is escaped).
pub(super) fn unescape(s: &str) -> String {
    // every backslash the kernel writes starts an escape, so split on the escaped backslash
    s.split("\\134")
        .map(|p| {
            p.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
        })
        .collect::<Vec<_>>()
        .join("\\")
}
