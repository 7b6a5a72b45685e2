//! When a node's allocatable memory crosses a threshold, seen from the test with reaplet's own
//! signal reader (the same reading as `allocatableMemory.available`), every 50 ms.

use reaplet::pressure::signals::SignalReader;
use std::time::Duration;

/// The wall-clock time (ns) at which `reader` first shows less than `below` bytes available.
pub fn allocatable_below(reader: SignalReader, below: i64) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        loop {
            if reader
                .observe()
                .allocatable_memory
                .is_some_and(|o| o.available < below)
            {
                return reaplet::wall_ns();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}
