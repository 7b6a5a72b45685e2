//! systemd units over D-Bus: the part of libcontainer's systemd cgroup manager the kubelet uses
//! when it destroys a pod cgroup with the systemd driver (`cgroupManagerImpl.Destroy` →
//! `manager.Destroy` → `stopUnit`). Removing a slice's directory is not enough under systemd:
//! the slice unit stays loaded and `active`, one per pod, for as long as systemd runs.
//!
//! Invariants:
//! * only `*.slice` units whose names reaplet built from a validated pod UID are stopped;
//! * a unit systemd does not know (`NoSuchUnit`) or that is already inactive is done, so
//!   stopping is idempotent;
//! * the bus connection is made lazily and dropped on any transport error, so a restarted
//!   dbus-daemon or systemd is reconnected to on the next call; errors are classified by the
//!   D-Bus error name, never by message text.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

const SYSTEMD: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// The system bus socket on every systemd host.
pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("unit {unit}: not a pod slice name")]
    BadUnit { unit: String },
    #[error("system bus {path}: {source}")]
    Bus {
        path: PathBuf,
        #[source]
        source: zbus::Error,
    },
    #[error("unit {unit}: {method} failed: {source}")]
    Call {
        unit: String,
        method: &'static str,
        #[source]
        source: zbus::Error,
    },
    #[error("unit {unit} still {state} {waited:?} after StopUnit")]
    StillActive {
        unit: String,
        state: String,
        waited: Duration,
    },
}

/// A connection to the bus listening on `socket` (the system bus: [`SYSTEM_BUS`]), to be
/// built; shared by systemd's manager here and logind ([`crate::shutdown::logind`]).
pub fn bus_builder(socket: &Path) -> zbus::Result<zbus::connection::Builder<'static>> {
    zbus::connection::Builder::address(format!("unix:path={}", socket.display()).as_str())
}

/// A lazily connected client for systemd's manager on the system bus.
#[derive(Debug)]
pub struct Systemd {
    socket: PathBuf,
    conn: Mutex<Option<zbus::Connection>>,
    /// How long to wait for a stop job to finish.
    stop_timeout: Duration,
}

fn method_error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

impl Systemd {
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
            conn: Mutex::new(None),
            stop_timeout: Duration::from_secs(10),
        }
    }

    async fn connection(&self) -> Result<zbus::Connection, SystemdError> {
        if let Some(c) = self.conn.lock().ok().and_then(|g| g.clone()) {
            return Ok(c);
        }
        let bus = |source| SystemdError::Bus {
            path: self.socket.clone(),
            source,
        };
        // connected without the lock held: two racing callers make two connections and the
        // last one is kept, which is harmless
        let c = bus_builder(&self.socket)
            .map_err(bus)?
            .build()
            .await
            .map_err(bus)?;
        if let Ok(mut g) = self.conn.lock() {
            *g = Some(c.clone());
        }
        Ok(c)
    }

    fn forget_connection(&self) {
        if let Ok(mut g) = self.conn.lock() {
            *g = None;
        }
    }

    /// Calls a manager method about `unit`; `None` when systemd does not know the unit. A
    /// transport error drops the connection so the next call reconnects.
    async fn manager_call<B>(
        &self,
        unit: &str,
        method: &'static str,
        body: &B,
    ) -> Result<Option<zbus::Message>, SystemdError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let conn = self.connection().await?;
        match conn
            .call_method(Some(SYSTEMD), MANAGER_PATH, Some(MANAGER), method, body)
            .await
        {
            Ok(reply) => Ok(Some(reply)),
            Err(e) if method_error_name(&e) == Some(NO_SUCH_UNIT) => Ok(None),
            Err(source) => {
                if method_error_name(&source).is_none() {
                    self.forget_connection();
                }
                Err(SystemdError::Call {
                    unit: unit.into(),
                    method,
                    source,
                })
            }
        }
    }

    /// `GetUnit`: the unit's object path, or `None` when systemd has not loaded it.
    async fn unit_path(&self, unit: &str) -> Result<Option<OwnedObjectPath>, SystemdError> {
        let Some(reply) = self.manager_call(unit, "GetUnit", &(unit,)).await? else {
            return Ok(None);
        };
        reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map(Some)
            .map_err(|source| SystemdError::Call {
                unit: unit.into(),
                method: "GetUnit",
                source,
            })
    }

    async fn active_state(
        &self,
        unit: &str,
        path: &OwnedObjectPath,
    ) -> Result<String, SystemdError> {
        let conn = self.connection().await?;
        let call = |source| SystemdError::Call {
            unit: unit.into(),
            method: "Get ActiveState",
            source,
        };
        let reply = match conn
            .call_method(
                Some(SYSTEMD),
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &("org.freedesktop.systemd1.Unit", "ActiveState"),
            )
            .await
        {
            Ok(r) => r,
            // unloaded between GetUnit and now
            Err(e) if method_error_name(&e).is_some() => return Ok("inactive".into()),
            Err(e) => {
                self.forget_connection();
                return Err(call(e));
            }
        };
        let v: OwnedValue = reply.body().deserialize().map_err(call)?;
        String::try_from(v).map_err(|e| call(e.into()))
    }

    /// The names of every loaded pod slice unit (`kubepods*.slice` with a `pod` component),
    /// whatever its state (`ListUnitsByPatterns`).
    pub async fn list_pod_slices(&self) -> Result<Vec<String>, SystemdError> {
        const WHAT: &str = "kubepods*-pod*.slice";
        let Some(reply) = self
            .manager_call(
                WHAT,
                "ListUnitsByPatterns",
                &(Vec::<&str>::new(), vec![WHAT]),
            )
            .await?
        else {
            return Ok(Vec::new());
        };
        type Unit = (
            String,
            String,
            String,
            String,
            String,
            String,
            OwnedObjectPath,
            u32,
            String,
            OwnedObjectPath,
        );
        let units: Vec<Unit> = reply
            .body()
            .deserialize()
            .map_err(|source| SystemdError::Call {
                unit: WHAT.into(),
                method: "ListUnitsByPatterns",
                source,
            })?;
        Ok(units
            .into_iter()
            .map(|u| u.0)
            .filter(|n| is_pod_slice(n))
            .collect())
    }

    /// Stops the pod slice `unit` (and with it every scope inside) and waits until systemd
    /// reports it inactive. Returns whether a stop was needed.
    pub async fn stop_slice(&self, unit: &str) -> Result<bool, SystemdError> {
        if !is_pod_slice(unit) {
            return Err(SystemdError::BadUnit { unit: unit.into() });
        }
        let Some(path) = self.unit_path(unit).await? else {
            return Ok(false);
        };
        let state = self.active_state(unit, &path).await?;
        if state == "inactive" {
            return Ok(false);
        }
        if self
            .manager_call(unit, "StopUnit", &(unit, "replace"))
            .await?
            .is_none()
        {
            return Ok(false);
        }
        let start = tokio::time::Instant::now();
        let mut state;
        loop {
            state = match self.unit_path(unit).await? {
                None => return Ok(true),
                Some(p) => self.active_state(unit, &p).await?,
            };
            if state == "inactive" || state == "failed" {
                return Ok(true);
            }
            if start.elapsed() >= self.stop_timeout {
                return Err(SystemdError::StillActive {
                    unit: unit.into(),
                    state,
                    waited: self.stop_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A name reaplet may stop: a `kubepods*.slice` of checked characters.
fn is_pod_slice(unit: &str) -> bool {
    unit.ends_with(".slice")
        && unit.starts_with("kubepods")
        && unit
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@:".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_pod_slices_are_stopped() {
        let s = Systemd::new(Path::new("/nonexistent/bus"));
        for bad in [
            "sshd.service",
            "kubepods.scope",
            "system.slice",
            "kubepods-pod1.slice; rm",
            "kubepods/../x.slice",
        ] {
            assert!(
                matches!(s.stop_slice(bad).await, Err(SystemdError::BadUnit { .. })),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn no_bus_is_a_bus_error_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bus");
        let s = Systemd::new(&sock);
        match s.stop_slice("kubepods-besteffort-pod1.slice").await {
            Err(SystemdError::Bus { path, .. }) => assert_eq!(path, sock),
            other => panic!("expected a bus error, got {other:?}"),
        }
    }
}
