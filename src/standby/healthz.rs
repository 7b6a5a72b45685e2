//! The kubelet's health endpoint, the standby's local signal (kubelet: its healthz server,
//! `healthzBindAddress`:`healthzPort`, `GET /healthz`; port 0 disables it).
//!
//! Invariants: one probe is bounded by its timeout, whatever it tries; it costs the control
//! plane nothing (a loopback connection); a disabled endpoint is [`Health::Disabled`], never a
//! failure; [`Health::Gone`] only when nothing listens where the kubelet would.
//!
//! The kubelet listening on an unspecified address (`healthzBindAddress: "::"`, the URL host
//! `[::]`) answers on whichever loopback the host has: its wildcard socket is dual-stack where
//! IPv6 exists (Go listens so on a wildcard), IPv4 alone where it does not, and on a host
//! whose loopback has no IPv6 `::1` does not exist at all (the connect fails at once with
//! `EADDRNOTAVAIL`, no refusal). So such a URL is probed on `::1`, then, when nothing listens
//! there, on `127.0.0.1`: one probe, one timeout for both (a connect on the loopback that finds
//! no listener fails at once, so the second address costs no time; a socket that is there and
//! does not answer is the kubelet's, judged at the one timeout, never two). `0.0.0.0` is
//! probed on `127.0.0.1` by configuration ([`crate::config`]'s healthz URL).

use super::Health;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Probes the kubelet's health endpoint once (`None`: the kubelet serves none, so nothing is
/// probed: [`Health::Disabled`]).
pub async fn probe_endpoint(url: Option<&str>, timeout: Duration) -> Health {
    match url {
        Some(u) => probe(u, timeout).await,
        None => Health::Disabled,
    }
}

/// Probes the kubelet's health endpoint once: `2xx` is [`Health::Ok`], nothing listening
/// (connection refused; on an unspecified host, on every loopback) [`Health::Gone`], anything
/// else (other statuses, a timeout, a bad URL) [`Health::Failed`]. The whole probe, every
/// address it tries included, is bounded by `timeout`.
pub async fn probe(url: &str, timeout: Duration) -> Health {
    match tokio::time::timeout(timeout, probe_once(url)).await {
        Ok(h) => h,
        Err(_) => Health::Failed,
    }
}

/// Where to connect for the URL's host, in order: an unspecified IPv6 address on the loopbacks
/// that answer for it (`::1`, then `127.0.0.1`), any other address as it is (Linux connects
/// `0.0.0.0` to the local host itself; configuration already probes it on `127.0.0.1`), a name
/// as the system resolves it. `None`: a name that does not resolve.
async fn targets(host: &str, port: u16) -> Option<Vec<std::net::SocketAddr>> {
    // an IPv6 host comes bracketed in a URI (`[::1]`); the socket address wants it bare
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ips = match bare.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) if a.is_unspecified() => vec![
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ],
        Ok(a) => vec![a],
        Err(_) => {
            return tokio::net::lookup_host((bare, port))
                .await
                .ok()
                .map(Iterator::collect);
        }
    };
    Some(ips.into_iter().map(|ip| (ip, port).into()).collect())
}

/// A failed connect that says nothing listens at `addr`: refused, or, for the IPv6 loopback
/// tried before the IPv4 one, an address this host does not have (its loopback without IPv6,
/// IPv6 off altogether).
fn nothing_listens(e: &std::io::Error, addr: IpAddr, more_to_try: bool) -> bool {
    use rustix::io::Errno;
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        return true;
    }
    more_to_try
        && addr == IpAddr::V6(Ipv6Addr::LOCALHOST)
        && matches!(
            Errno::from_io_error(e),
            Some(Errno::ADDRNOTAVAIL | Errno::NETUNREACH | Errno::AFNOSUPPORT)
        )
}

async fn probe_once(url: &str) -> Health {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return Health::Failed;
    };
    let (Some(host), Some("http")) = (uri.host(), uri.scheme_str()) else {
        return Health::Failed;
    };
    let port = uri.port_u16().unwrap_or(80);
    let Some(addresses) = targets(host, port).await else {
        return Health::Failed;
    };
    // Gone only when every address says nothing listens there
    let mut gone = true;
    for (i, addr) in addresses.iter().enumerate() {
        match tokio::net::TcpStream::connect(addr).await {
            // whatever listens answers for the kubelet: no other address is tried
            Ok(s) => return exchange(s, &uri, host).await,
            Err(e) => gone &= nothing_listens(&e, addr.ip(), i + 1 < addresses.len()),
        }
    }
    // a name that resolved to nothing: nowhere to probe
    gone &= !addresses.is_empty();
    if gone { Health::Gone } else { Health::Failed }
}

/// `GET` the URL's path on a connected stream: `2xx` is [`Health::Ok`], anything else
/// [`Health::Failed`].
async fn exchange(stream: tokio::net::TcpStream, uri: &hyper::Uri, host: &str) -> Health {
    use http_body_util::Empty;
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
    else {
        return Health::Failed;
    };
    let conn = tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<hyper::body::Bytes>::new());
    let health = match req {
        Ok(req) => match sender.send_request(req).await {
            Ok(resp) if resp.status().is_success() => Health::Ok,
            _ => Health::Failed,
        },
        Err(_) => Health::Failed,
    };
    conn.abort();
    health
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawSettings;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The probe's timeout in these tests: the verdict on a listener that never answers comes
    /// at this bound, never at twice it (one timeout per address tried would double it). Real
    /// time (real sockets): long enough that a refused connect, or the slack between one
    /// timeout and two, holds on a loaded 2-core machine (the scheduler may well lose a few
    /// hundred milliseconds there, which made 500 ms flaky).
    const TIMEOUT: Duration = Duration::from_millis(2500);

    /// The URL standby probes for the kubelet's `healthzBindAddress` and `healthzPort`, made
    /// by the configuration as from an operator's settings.
    fn url_for(address: &str, port: u16) -> String {
        let s = crate::config::resolve(RawSettings {
            healthz_port: Some(port.to_string()),
            healthz_bind_address: Some(address.into()),
            ..RawSettings::default()
        })
        .unwrap();
        s.kubelet_healthz_url.unwrap()
    }

    /// A kubelet's health endpoint on `l`: `200 ok` to every request.
    fn serve_ok(l: TcpListener) {
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                });
            }
        });
    }

    /// A wedged kubelet on `l`: connections accepted and held, never answered.
    fn serve_silent(l: TcpListener) {
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
    }

    /// A port free on both loopbacks (nothing listens on it on either).
    async fn free_port() -> u16 {
        loop {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            // where ::1 exists, the same port free there too
            match std::net::TcpListener::bind(("::1", port)) {
                Ok(_) => return port,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(_) => return port,
            }
        }
    }

    async fn timed(url: &str) -> (Health, Duration) {
        let t0 = Instant::now();
        let h = probe(url, TIMEOUT).await;
        (h, t0.elapsed())
    }

    /// Issue 44, item 5: `healthzBindAddress: "::"` and a kubelet that answers on 127.0.0.1
    /// only (nothing on ::1): the kubelet answers, so the probe says Ok (before: `[::1]` alone
    /// was probed, refused, and the live kubelet read as gone).
    #[tokio::test]
    async fn an_unspecified_v6_address_is_ok_when_only_127_0_0_1_answers() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        if let Err(e) = std::net::TcpListener::bind(("::1", port)) {
            assert_ne!(
                e.kind(),
                std::io::ErrorKind::AddrInUse,
                "port {port} on ::1"
            );
        }
        serve_ok(l);
        let url = url_for("::", port);
        let (h, took) = timed(&url).await;
        assert_eq!(h, Health::Ok, "{url} after {took:?}");
        // and the IPv4 wildcard, probed on 127.0.0.1 as before
        assert_eq!(timed(&url_for("0.0.0.0", port)).await.0, Health::Ok);
    }

    /// Nothing on either loopback: the kubelet is gone (nothing listens), at once; a kubelet
    /// whose socket is there but never answers is failed, at one timeout: never twice, and
    /// never "gone".
    #[tokio::test]
    async fn the_unspecified_address_is_gone_only_when_no_loopback_listens() {
        // nothing anywhere: gone, well before the timeout
        let port = free_port().await;
        let (h, took) = timed(&url_for("::", port)).await;
        assert_eq!(h, Health::Gone, "after {took:?}");
        assert!(took < TIMEOUT, "{took:?}");
        // ::1 refuses, 127.0.0.1 holds the connection unanswered: failed, within one timeout
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        serve_silent(l);
        let (h, took) = timed(&url_for("::", port)).await;
        assert_eq!(h, Health::Failed, "after {took:?}");
        assert!(took >= TIMEOUT && took < TIMEOUT * 2, "{took:?}");
        // the kubelet's dual-stack socket on `::` (where IPv6 exists), wedged: failed, one
        // timeout
        if let Ok(l) = TcpListener::bind("[::]:0").await {
            let port = l.local_addr().unwrap().port();
            serve_silent(l);
            let (h, took) = timed(&url_for("::", port)).await;
            assert_eq!(h, Health::Failed, "after {took:?}");
            assert!(took >= TIMEOUT && took < TIMEOUT * 2, "{took:?}");
        }
    }

    /// The addresses tried for each kind of host: only the unspecified IPv6 one fans out.
    #[tokio::test]
    async fn only_an_unspecified_host_is_probed_on_the_loopbacks() {
        let at = |ip: IpAddr| std::net::SocketAddr::from((ip, 10248));
        let (v6, v4) = (
            at(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            at(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        );
        assert_eq!(targets("[::]", 10248).await, Some(vec![v6, v4]));
        // an explicit address is where the kubelet listens, and only there
        assert_eq!(targets("[::1]", 10248).await, Some(vec![v6]));
        assert_eq!(targets("127.0.0.1", 10248).await, Some(vec![v4]));
        let ula = at("fd00::12".parse().unwrap());
        assert_eq!(targets("[fd00::12]", 10248).await, Some(vec![ula]));
        // a name as the system resolves it
        assert!(
            targets("localhost", 10248)
                .await
                .is_some_and(|a| a.contains(&v4))
        );
    }

    /// A probe that timed out leaves no connection behind: the wedged kubelet sees it closed
    /// (probed every poll for as long as it is wedged, one left open per probe would pile up).
    #[tokio::test]
    async fn a_timed_out_probe_closes_its_connection() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/healthz", l.local_addr().unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    // read the request, never answer, until the probe closes
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 {
                            let _ = tx.send(());
                            return;
                        }
                    }
                });
            }
        });
        assert_eq!(probe(&url, TIMEOUT).await, Health::Failed);
        let closed = tokio::time::timeout(TIMEOUT, rx.recv()).await;
        assert!(closed.is_ok(), "the probe's connection is still open");
    }

    /// Set in the copy of the test binary that runs inside the network namespace.
    const IN_NETNS: &str = "REAPLET_TEST_IN_NETNS_WITHOUT_IPV6";

    /// Issue 44, item 5, on a host without IPv6 on its loopback (a network namespace whose
    /// `lo` has `disable_ipv6`; root): the kubelet's socket on `::` is dual-stack and answers
    /// on 127.0.0.1 while `::1` does not exist (the connect fails with EADDRNOTAVAIL, not a
    /// refusal). A live kubelet is Ok (before: failed for ever), a dead one gone (before:
    /// failed, which at start reads as "something answers").
    #[test]
    fn on_a_host_without_ipv6_loopback_the_kubelet_is_probed_on_127_0_0_1() {
        if std::env::var_os(IN_NETNS).is_none() {
            let me = std::env::current_exe().unwrap();
            let name = "standby::healthz::tests::\
                        on_a_host_without_ipv6_loopback_the_kubelet_is_probed_on_127_0_0_1";
            let out = std::process::Command::new("unshare")
                .args([
                    "--net",
                    "sh",
                    "-ec",
                    "ip link set lo up; sysctl -qw net.ipv6.conf.lo.disable_ipv6=1; exec \"$@\"",
                    "sh",
                ])
                .arg(&me)
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(IN_NETNS, "1")
                .output()
                .expect("unshare");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "in the namespace: {text}");
            assert!(text.contains("1 passed"), "the test did not run: {text}");
            println!("{text}");
            return;
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                // the host as the issue has it: no ::1 to reach
                let e = std::net::TcpStream::connect(("::1", 1)).unwrap_err();
                assert_ne!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                println!("connect to [::1]: {e}");
                // the live kubelet on `::` (dual-stack, as Go listens on a wildcard)
                let l = TcpListener::bind("[::]:0").await.unwrap();
                let port = l.local_addr().unwrap().port();
                serve_ok(l);
                let url = url_for("::", port);
                let (h, took) = timed(&url).await;
                assert_eq!(h, Health::Ok, "{url} after {took:?}");
                assert_eq!(timed(&url_for("0.0.0.0", port)).await.0, Health::Ok);
                // the kubelet dead: nothing listens
                let port = free_port().await;
                let url = url_for("::", port);
                let (h, took) = timed(&url).await;
                assert_eq!(h, Health::Gone, "{url} after {took:?}");
                assert!(took < TIMEOUT, "{took:?}");
            });
    }
}
