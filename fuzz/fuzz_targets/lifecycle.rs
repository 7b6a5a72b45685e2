//! Bytes -> a sequence of lifecycle inputs with hostile graces -> `lifecycle::step` and the
//! kill deadline of every state: never a panic, the grace held only ever decreases.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaplet::lifecycle::{CleanupStage, Input, KillReason, PodMachine, step};

fn grace(b: &[u8]) -> Option<i64> {
    match b.first().copied().unwrap_or(0) % 4 {
        0 => None,
        1 => Some(i64::MAX),
        2 => Some(i64::from(b.get(1).copied().unwrap_or(0) as i8)),
        _ => Some(i64::from_le_bytes(
            b.get(1..9)
                .and_then(|s| s.try_into().ok())
                .unwrap_or([0; 8]),
        )),
    }
}

fuzz_target!(|data: &[u8]| {
    {
        let mut m = PodMachine::new(grace(data));
        let now = tokio::time::Instant::now();
        let mut held: Option<i64> = None;
        for chunk in data.chunks(10) {
            let g = grace(&chunk[1..]);
            let input = match chunk[0] % 5 {
                0 => Input::Update {
                    deletion_requested: chunk[0] & 8 != 0,
                    deletion_grace: g,
                    terminal_phase: chunk[0] & 16 != 0,
                    spec_grace: g,
                },
                1 => Input::Kill {
                    grace_override: g,
                    reason: KillReason::Orphan,
                },
                2 => Input::KillDone {
                    generation: u64::from(chunk[0] >> 4),
                    ok: chunk[0] & 8 != 0,
                },
                3 => Input::CleanupDone {
                    stage: if chunk[0] & 8 != 0 {
                        CleanupStage::Volumes
                    } else {
                        CleanupStage::Cgroup
                    },
                    ok: chunk[0] & 16 != 0,
                },
                _ => Input::RetryDue,
            };
            let _ = step(&mut m, input, now);
            let _ = m.kill_deadline();
            if let Some(g) = m.grace {
                assert!(g >= 1 && held.is_none_or(|h| g <= h));
                held = Some(g);
            }
        }
    }
});
