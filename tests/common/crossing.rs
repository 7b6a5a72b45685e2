//! When a node's signal crosses a threshold, seen from the test with reaplet's own signal
//! reader (the same readings as `allocatableMemory.available` and `pid.available`), every
//! 50 ms.

use reaplet::pressure::signals::{Observations, SignalReader};
use std::time::Duration;

/// Which of the reader's observations a crossing is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `allocatableMemory.available`, bytes.
    AllocatableMemory,
    /// `pid.available`, tasks.
    Pid,
}

impl Signal {
    /// The signal's available figure in `o`, if it was read.
    pub fn available(self, o: &Observations) -> Option<i64> {
        match self {
            Signal::AllocatableMemory => o.allocatable_memory.map(|x| x.available),
            Signal::Pid => o.pid.map(|x| x.available),
        }
    }
}

/// The wall-clock time (ns) at which `reader` first shows less than `below` available of
/// `signal`.
pub fn below(reader: SignalReader, signal: Signal, below: i64) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        loop {
            if signal
                .available(&reader.observe())
                .is_some_and(|a| a < below)
            {
                return reaplet::wall_ns();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// The node's signals as reaplet reads them, for a test bed whose pods go below
/// `cgroup_root` (cgroupfs driver): the host's hierarchies from `/proc/self/mountinfo`.
pub fn host_reader(cgroup_root: &str) -> SignalReader {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let hierarchies = reaplet::cgroups::hierarchies(&reaplet::volumes::parse_mountinfo(&mounts));
    let naming =
        reaplet::cgroups::CgroupNaming::new(reaplet::cgroups::CgroupDriver::Cgroupfs, cgroup_root)
            .unwrap();
    SignalReader::host(&hierarchies, &naming).unwrap()
}
