//! /proc/self/mountinfo text -> mounts (procfs, line by line) -> cgroup hierarchies.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mounts = reaplet::volumes::parse_mountinfo(&text);
    let _ = reaplet::cgroups::hierarchies(&mounts);
});
