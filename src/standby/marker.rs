//! The standby's memory of its own role across its restarts: a small file saying "reaplet was
//! this node's acting agent, in this boot, and this is the Lease it saw". No kubelet
//! counterpart (the kubelet is always its node's agent); the durable termination records
//! ([`crate::terminating::records`]) are its sibling.
//!
//! Without it a restart of an active reaplet (a package upgrade's `try-restart`, a crash, the
//! watchdog) starts passive and counts its start as a Lease renewal: with the kubelet still
//! dead, every kill under way is held for one more `takeoverAfter`, past its grace.
//!
//! Invariants:
//! * written (atomically: a temporary file renamed over it) when reaplet becomes active in
//!   standby: before a takeover's role change (a crash right after it finds it); at an active
//!   start, just after the start's decision (no Lease seen then: it carries no `renewTime`);
//!   removed once it is passive again; nothing in primary mode;
//! * it counts only in the boot that wrote it (a [`Stamp`] with the boot ID): after a reboot the
//!   kubelet may simply not have renewed yet, and the ordinary start rule applies;
//! * it keeps the Lease's `renewTime` reaplet last saw and when it saw it change, on
//!   `CLOCK_BOOTTIME`: the Lease's age carries over the restart only while the Lease still
//!   carries that `renewTime` ([`carried_age`]), never from the wall clock;
//! * it is evidence, never a decision on its own: a restart starts passive and takes over again
//!   only on the takeover's own proof ([`super::start_mode`], [`super::proved`]); a kubelet that
//!   came back meanwhile has renewed (another `renewTime`) or answers, and reaplet stays
//!   passive;
//! * read and written off the async runtime (tokio's blocking pool), one write or removal at
//!   a time; a takeover waits for the write at most [`WRITE_LIMIT`] (a hung disk never holds
//!   it back); a failure is logged and costs only the faster resumption. A marker of an older
//!   version (a bare [`Stamp`]) carries no Lease: its restart counts the start as a renewal.

use crate::deadline::Stamp;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The marker's file name in the root directory.
pub const FILE: &str = "reaplet-active.json";

/// The marker of the root directory `root_dir`.
pub fn path_in(root_dir: &Path) -> PathBuf {
    root_dir.join(FILE)
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// When it was written (its boot is the one it counts in).
    #[serde(flatten)]
    pub written: Stamp,
    /// The Lease's `renewTime` reaplet last saw (`None`: no Lease, or unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<String>,
    /// When reaplet last saw the Lease renewed (its start counting as one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed: Option<Stamp>,
}

/// What an active reaplet knows of the Lease, for the marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSeen {
    pub renew_time: Option<String>,
    /// How long ago reaplet saw it renewed.
    pub renewed_ago: Duration,
}

/// The marker at `path` when it was written in this boot.
pub async fn read_this_boot(path: &Path) -> Option<Marker> {
    let bytes = tokio::fs::read(path).await.ok()?;
    match serde_json::from_slice::<Marker>(&bytes) {
        Ok(m) if !m.written.boot.is_empty() && m.written.boot == crate::deadline::boot_id() => {
            Some(m)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), err = %e, "unreadable standby marker ignored");
            None
        }
    }
}

/// Whether the marker at `path` says reaplet was the acting agent in this boot.
pub async fn active_this_boot(path: &Path) -> bool {
    read_this_boot(path).await.is_some()
}

/// How long ago the Lease was last renewed, carried over a restart: known only when the marker
/// saw the Lease with the `renewTime` it still carries (`renew_time`, read now), and on this
/// boot's monotonic clock (`now`).
pub fn carried_age(m: &Marker, renew_time: Option<&str>, now: &Stamp) -> Option<Duration> {
    let (seen, renewed) = (m.renew_time.as_deref()?, m.renewed.as_ref()?);
    if Some(seen) != renew_time || renewed.boot.is_empty() || renewed.boot != now.boot {
        return None;
    }
    let ms = now.boottime_ms.checked_sub(renewed.boottime_ms)?;
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// The longest a takeover waits for its marker to be written (a hung disk must not hold it
/// back): past it, reaplet acts without the marker and says so.
pub const WRITE_LIMIT: Duration = Duration::from_secs(1);

/// Marker writes and removals run one at a time: one that outlived its caller's wait finishes
/// before the next starts, so two never share the temporary file. Held only off the async
/// runtime, inside one blocking task.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Records the role: active (with what reaplet knows of the Lease) writes the marker, passive
/// (`None`) removes it. Waits at most [`WRITE_LIMIT`]; an operation still under way then
/// finishes on its own (the write and its rename are one blocking task).
pub async fn record(path: &Path, active: Option<LeaseSeen>) {
    let op = if active.is_some() { "write" } else { "remove" };
    let body = active.map(|seen| {
        let now = Stamp::now();
        let ago = i64::try_from(seen.renewed_ago.as_millis()).unwrap_or(i64::MAX);
        let m = Marker {
            renewed: Some(now.plus_ms(-ago)),
            renew_time: seen.renew_time,
            written: now,
        };
        serde_json::to_vec(&m).unwrap_or_default()
    });
    let target = path.to_owned();
    let job = tokio::task::spawn_blocking(move || {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        apply(&target, body.as_deref())
    });
    let err = match tokio::time::timeout(WRITE_LIMIT, job).await {
        Ok(Ok(Ok(()))) => return,
        Ok(Ok(Err(e))) => e.to_string(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("not done in {WRITE_LIMIT:?}; going on, it finishes on its own"),
    };
    tracing::warn!(path = %path.display(), op, err = %err, "standby marker not recorded");
}

/// Writes `body` as the marker (atomically: a temporary file renamed over it), or removes the
/// marker (`None`; already gone is done).
fn apply(path: &Path, body: Option<&[u8]>) -> std::io::Result<()> {
    match body {
        Some(body) => {
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, body)?;
            std::fs::rename(&tmp, path)
        }
        None => match std::fs::remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(t: &str, ago: u64) -> Option<LeaseSeen> {
        Some(LeaseSeen {
            renew_time: Some(t.into()),
            renewed_ago: Duration::from_secs(ago),
        })
    }

    #[tokio::test]
    async fn a_marker_counts_in_its_own_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_in(dir.path());
        assert!(!active_this_boot(&p).await, "none");
        record(&p, seen("a", 50)).await;
        assert!(active_this_boot(&p).await);
        record(&p, None).await;
        assert!(!active_this_boot(&p).await, "removed");
        record(&p, None).await; // removing none is done
        let other_boot = Stamp {
            boot: "another-boot".into(),
            ..Stamp::now()
        };
        std::fs::write(&p, serde_json::to_vec(&other_boot).unwrap()).unwrap();
        assert!(!active_this_boot(&p).await, "another boot's");
        std::fs::write(&p, b"{broken").unwrap();
        assert!(!active_this_boot(&p).await, "unreadable");
    }

    #[tokio::test]
    async fn the_leases_age_carries_over_only_while_it_carries_the_renew_time_seen() {
        let dir = tempfile::tempdir().unwrap();
        let p = path_in(dir.path());
        record(&p, seen("2026-12-04T10:00:00.000000Z", 50)).await;
        let m = read_this_boot(&p).await.expect("this boot's");
        let now = Stamp::now();
        let age = carried_age(&m, Some("2026-12-04T10:00:00.000000Z"), &now).unwrap();
        assert!(
            (Duration::from_secs(50)..Duration::from_secs(52)).contains(&age),
            "{age:?}"
        );
        // renewed since (the kubelet is back), or gone: nothing carries over
        assert_eq!(
            carried_age(&m, Some("2026-12-04T10:00:30.000000Z"), &now),
            None
        );
        assert_eq!(carried_age(&m, None, &now), None);
        // a wall-clock step changes nothing: the age is on CLOCK_BOOTTIME
        let stepped = Stamp {
            wall_ms: now.wall_ms + 3_600_000,
            ..now.clone()
        };
        assert_eq!(
            carried_age(&m, Some("2026-12-04T10:00:00.000000Z"), &stepped),
            Some(age)
        );
        // an older version's marker (a bare stamp) counts as active but carries no age
        std::fs::write(&p, serde_json::to_vec(&Stamp::now()).unwrap()).unwrap();
        let old = read_this_boot(&p).await.expect("an old marker still reads");
        assert_eq!(carried_age(&old, Some("x"), &now), None);
    }
}
