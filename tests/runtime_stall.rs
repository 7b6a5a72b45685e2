//! A stalled runtime (issue 15 §2): a frozen shim and a SIGSTOPped containerd are not a reason
//! for the watchdog to restart reaplet, and no termination is lost when the runtime answers
//! again.

mod common;
