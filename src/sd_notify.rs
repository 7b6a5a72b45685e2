//! systemd's notify protocol (`sd_notify(3)`): `READY=1`, `WATCHDOG=1`, `STATUS=...` datagrams
//! to `$NOTIFY_SOCKET` (kubelet: none; it is `Type=simple`).
//!
//! Invariants: the socket path is given by the caller (library code never reads the
//! environment); a missing socket makes every call a no-op; a send failure is logged, never
//! fatal.

use std::os::unix::net::UnixDatagram;

#[derive(Debug, Clone, Default)]
pub struct Notifier {
    socket: Option<String>,
}

impl Notifier {
    /// `socket`: the value of `$NOTIFY_SOCKET` (a path, or `@name` for the abstract namespace).
    pub fn new(socket: Option<String>) -> Self {
        Self {
            socket: socket.filter(|s| !s.is_empty()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends `state` (e.g. `READY=1\nSTATUS=...`).
    pub fn notify(&self, state: &str) {
        let Some(path) = &self.socket else { return };
        let r = (|| -> std::io::Result<()> {
            let sock = UnixDatagram::unbound()?;
            if let Some(name) = path.strip_prefix('@') {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                sock.send_to_addr(state.as_bytes(), &addr)?;
            } else {
                sock.send_to(state.as_bytes(), path)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!(err = %e, "sd_notify failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(Some(path.display().to_string()));
        n.notify("READY=1\nSTATUS=ok");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=ok");
        Notifier::new(None).notify("READY=1"); // no-op
    }
}
