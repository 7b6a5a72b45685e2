//! systemd-logind over the system bus: the kubelet's `nodeshutdown/systemd` package
//! (`inhibit_linux.go`). A `delay` inhibitor lock on `shutdown`, logind's
//! `InhibitDelayMaxUSec`, the logind drop-in that raises it (and the reload that applies it),
//! and the `PrepareForShutdown` signal.
//!
//! Invariants:
//! * the inhibitor is a file descriptor held by [`InhibitLock`]: dropping the lock closes it,
//!   which is the release (logind then stops waiting for this process); it is never closed
//!   twice (the kubelet's stored-fd close after a cancellation can hit a reused descriptor);
//! * the drop-in is written only when the delay logind reports is shorter than needed, in a
//!   file of reaplet's own that sorts before the kubelet's, atomically (write, then rename);
//! * every call is bounded ([`CALL_TIMEOUT`]): a stuck logind never holds reaplet up;
//! * errors carry the method or path and are classified by type (a D-Bus error name), never by
//!   message text.

use futures_util::{Stream, StreamExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zbus::zvariant::{OwnedFd, OwnedValue};

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
/// What the lock is taken for, as `systemd-inhibit --list` shows it.
pub const WHO: &str = "reaplet";
pub const WHY: &str = "reaplet ends this node's pods before it shuts down";
/// logind's drop-in directory, and reaplet's file in it (the kubelet's is `99-kubelet.conf`).
pub const DROP_IN_DIR: &str = "/etc/systemd/logind.conf.d";
/// It sorts before the kubelet's (`99-kubelet.conf`): on a node where both run, the kubelet's
/// own setting wins, and reaplet never cuts the kubelet's shutdown short.
pub const DROP_IN_FILE: &str = "98-reaplet.conf";

/// How long any call on the bus may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("system bus {path}: {source}")]
    Bus {
        path: PathBuf,
        #[source]
        source: Box<zbus::Error>,
    },
    /// A call failed on the way (no answer, a broken connection, a reply of another shape).
    #[error("{method}: {source}")]
    Call {
        method: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
    /// The peer answered with a D-Bus error (logind absent: `ServiceUnknown`; refused:
    /// `AccessDenied`, ...).
    #[error("{method}: refused with {name}: {message}")]
    Refused {
        method: &'static str,
        name: String,
        message: String,
    },
    #[error("logind drop-in {path}: {source}")]
    DropIn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "logind's InhibitDelayMaxSec is {got:?} after {drop_in} was written and logind reloaded, less than the {wanted:?} the shutdown needs: another logind.conf drop-in sorting after it overrides it"
    )]
    DelayTooShort {
        wanted: Duration,
        got: Duration,
        drop_in: PathBuf,
    },
}

impl LogindError {
    fn call(method: &'static str, e: zbus::Error) -> Self {
        match e {
            zbus::Error::MethodError(name, message, _) => Self::Refused {
                method,
                name: name.to_string(),
                message: message.unwrap_or_default(),
            },
            source => Self::Call {
                method,
                source: Box::new(source),
            },
        }
    }
}

/// A held `delay` inhibitor lock; dropping it releases the lock.
#[derive(Debug)]
pub struct InhibitLock(#[allow(dead_code)] OwnedFd);

/// One inhibitor as logind lists it (`ListInhibitors`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, zbus::zvariant::Type)]
pub struct Inhibitor {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

/// A connection to the system bus for logind (and systemd's manager, for the reload).
#[derive(Debug, Clone)]
pub struct Logind {
    conn: zbus::Connection,
}

impl Logind {
    pub async fn connect(socket: &Path) -> Result<Self, LogindError> {
        let bus = |source| LogindError::Bus {
            path: socket.to_path_buf(),
            source: Box::new(source),
        };
        let conn = crate::systemd::bus_builder(socket)
            .map_err(bus)?
            .method_timeout(CALL_TIMEOUT)
            .build()
            .await
            .map_err(bus)?;
        Ok(Self { conn })
    }

    async fn logind_call<B>(
        &self,
        method: &'static str,
        body: &B,
    ) -> Result<zbus::Message, LogindError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(LOGIND_MANAGER),
                method,
                body,
            )
            .await
            .map_err(|e| LogindError::call(method, e))
    }

    /// A property of logind's manager, as `T`; `method` names the read in errors.
    async fn property<T>(&self, name: &str, method: &'static str) -> Result<T, LogindError>
    where
        T: TryFrom<OwnedValue, Error = zbus::zvariant::Error>,
    {
        let reply = self
            .conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(PROPERTIES),
                "Get",
                &(LOGIND_MANAGER, name),
            )
            .await
            .map_err(|e| LogindError::call(method, e))?;
        let v: OwnedValue = reply
            .body()
            .deserialize()
            .map_err(|e| LogindError::call(method, e))?;
        T::try_from(v).map_err(|e| LogindError::call(method, e.into()))
    }

    /// logind's `InhibitDelayMaxUSec`: how long it waits for delay locks.
    pub async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        let usec: u64 = self
            .property("InhibitDelayMaxUSec", "Get InhibitDelayMaxUSec")
            .await?;
        Ok(Duration::from_micros(usec))
    }

    /// Takes a `delay` lock on `shutdown`.
    pub async fn inhibit(&self) -> Result<InhibitLock, LogindError> {
        const M: &str = "Inhibit";
        let reply = self
            .logind_call(M, &("shutdown", WHO, WHY, "delay"))
            .await?;
        let fd: OwnedFd = reply
            .body()
            .deserialize()
            .map_err(|e| LogindError::call(M, e))?;
        Ok(InhibitLock(fd))
    }

    /// Every inhibitor logind holds now.
    pub async fn inhibitors(&self) -> Result<Vec<Inhibitor>, LogindError> {
        const M: &str = "ListInhibitors";
        let reply = self.logind_call(M, &()).await?;
        reply
            .body()
            .deserialize()
            .map_err(|e| LogindError::call(M, e))
    }

    /// Makes logind read its configuration again: SIGHUP to `systemd-logind.service` through
    /// systemd (the kubelet's `ReloadLogindConf`).
    pub async fn reload(&self) -> Result<(), LogindError> {
        const M: &str = "KillUnit systemd-logind.service";
        self.conn
            .call_method(
                Some(SYSTEMD),
                SYSTEMD_PATH,
                Some(SYSTEMD_MANAGER),
                "KillUnit",
                &("systemd-logind.service", "all", 1i32),
            )
            .await
            .map_err(|e| LogindError::call(M, e))?;
        Ok(())
    }

    /// logind's `PreparingForShutdown`: a shutdown announced and not cancelled.
    pub async fn preparing_for_shutdown(&self) -> Result<bool, LogindError> {
        self.property("PreparingForShutdown", "Get PreparingForShutdown")
            .await
    }

    /// `PrepareForShutdown` as it comes: `true` a shutdown begins, `false` it was cancelled.
    ///
    /// Only logind's own signals count. The unique name that owns `org.freedesktop.login1` is
    /// asked of the bus (`GetNameOwner`) and every signal's sender is compared with it: neither
    /// a match rule's well-known sender (not checked locally) nor a proxy's owner tracking (it
    /// believes a `NameOwnerChanged` from anyone) stops a local process that sends signals to
    /// reaplet's connection directly. A change of logind's owner, as only the bus itself
    /// (`org.freedesktop.DBus`) says it, ends the stream: the caller connects again and asks
    /// anew. The stream also ends when the connection does.
    pub async fn shutdown_signals(
        &self,
    ) -> Result<impl Stream<Item = bool> + Unpin + use<>, LogindError> {
        const M: &str = "AddMatch PrepareForShutdown";
        const BUS: &str = "org.freedesktop.DBus";
        let call = |e| LogindError::call(M, e);
        let shutdown = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(LOGIND)
            .and_then(|b| b.path(LOGIND_PATH))
            .and_then(|b| b.interface(LOGIND_MANAGER))
            .and_then(|b| b.member("PrepareForShutdown"))
            .map(|b| b.build())
            .map_err(call)?;
        let owners = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS)
            .and_then(|b| b.interface(BUS))
            .and_then(|b| b.member("NameOwnerChanged"))
            .and_then(|b| b.arg(0, LOGIND))
            .map(|b| b.build())
            .map_err(call)?;
        // subscribed before the owner is asked: a change in between ends the stream
        let owners = zbus::MessageStream::for_match_rule(owners, &self.conn, Some(4))
            .await
            .map_err(call)?;
        let shutdown = zbus::MessageStream::for_match_rule(shutdown, &self.conn, Some(8))
            .await
            .map_err(call)?;
        let reply = self
            .conn
            .call_method(
                Some(BUS),
                "/org/freedesktop/DBus",
                Some(BUS),
                "GetNameOwner",
                &(LOGIND,),
            )
            .await
            .map_err(|e| LogindError::call("GetNameOwner", e))?;
        let owner: String = reply
            .body()
            .deserialize()
            .map_err(|e| LogindError::call("GetNameOwner", e))?;
        let sender = |m: &zbus::Message| m.header().sender().map(|s| s.to_string());
        // Some(Some(b)): logind said b; Some(None): logind's owner changed; None: not ours
        let owners = owners.filter_map(move |m| {
            std::future::ready(
                m.ok()
                    .filter(|m| sender(m).as_deref() == Some(BUS))
                    .map(|_| None),
            )
        });
        let signals = shutdown.filter_map(move |m| {
            let b = m
                .ok()
                .filter(|m| sender(m).as_deref() == Some(owner.as_str()))
                .and_then(|m| match m.body().deserialize::<bool>() {
                    Ok(b) => Some(Some(b)),
                    Err(e) => {
                        tracing::warn!(err = %e, "PrepareForShutdown without a boolean; ignored");
                        None
                    }
                });
            std::future::ready(b)
        });
        Ok(Box::pin(
            futures_util::stream::select(owners, signals)
                .take_while(|x| std::future::ready(x.is_some()))
                .filter_map(std::future::ready),
        ))
    }
}

/// The drop-in's text.
pub fn drop_in_text(delay: Duration) -> String {
    format!(
        "# reaplet's graceful node shutdown: logind waits this long for its delay inhibitor.\n\
         [Login]\nInhibitDelayMaxSec={}\n",
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
    )
}

/// Writes reaplet's logind drop-in into `dir` (atomically); returns its path.
pub fn write_drop_in(dir: &Path, delay: Duration) -> Result<PathBuf, LogindError> {
    let path = dir.join(DROP_IN_FILE);
    let io = |source| LogindError::DropIn {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = dir.join(format!(".{DROP_IN_FILE}.tmp"));
    std::fs::write(&tmp, drop_in_text(delay)).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_rounds_up_to_whole_seconds() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_drop_in(
            &dir.path().join("logind.conf.d"),
            Duration::from_millis(35_200),
        )
        .unwrap();
        assert_eq!(p.file_name().unwrap(), "98-reaplet.conf");
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("[Login]\nInhibitDelayMaxSec=36\n"), "{text}");
        // rewritten in place, no temporary left
        write_drop_in(&dir.path().join("logind.conf.d"), Duration::from_secs(20)).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path().join("logind.conf.d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("98-reaplet.conf")]);
        assert!(
            std::fs::read_to_string(&p)
                .unwrap()
                .contains("InhibitDelayMaxSec=20\n")
        );
    }

    #[test]
    fn a_refusal_is_classified_by_its_error_name() {
        let e = LogindError::call(
            "Inhibit",
            zbus::Error::MethodError(
                zbus::names::OwnedErrorName::try_from("org.freedesktop.DBus.Error.AccessDenied")
                    .unwrap(),
                Some("Permission denied".into()),
                zbus::message::Message::method_call("/", "x")
                    .unwrap()
                    .build(&())
                    .unwrap(),
            ),
        );
        assert!(
            matches!(&e, LogindError::Refused { name, .. } if name == "org.freedesktop.DBus.Error.AccessDenied"),
            "{e:?}"
        );
    }
}
