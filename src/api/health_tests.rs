//! Tests of the API server's health view and its prober (`super`).

use super::*;
use tokio::time::Instant;

/// Issue 38, item 1: a request that timed out on a connection leaves the server reachable
/// (before, any timeout marked it unreachable and held every caller behind the prober),
/// and a probe that timed out that way brings it back.
#[tokio::test(start_paused = true)]
async fn a_slow_answer_is_not_an_outage() {
    let h = ApiHealth::new();
    let slow = super::super::RequestError::Timeout(super::super::REQUEST_TIMEOUT);
    assert_eq!(slow.failure(), Failure::Slow);
    h.failed(slow.failure());
    assert!(h.is_reachable());
    let cancel = CancellationToken::new();
    let t0 = Instant::now();
    assert!(
        h.wait_to_retry(Failure::Slow, Duration::from_secs(2), &cancel)
            .await
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    h.no_answer();
    h.failed(Failure::Slow);
    assert!(!h.is_reachable(), "a slow answer says nothing of an outage");
    assert!(reached::<()>(Err(super::super::RequestError::Timeout(
        PROBE_TIMEOUT
    ))));
    let refused = kube::Error::Service("connection refused".into());
    assert!(!reached::<()>(Err(super::super::RequestError::Api(
        refused
    ))));
}

/// A server on loopback that answers every request with `/version`'s 200, on as many
/// connections as come.
async fn versioned() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let mut chunk = [0u8; 1024];
                    match conn.read(&mut chunk).await {
                        Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                let body = r#"{"major":"1","minor":"36"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

fn client_of(addr: std::net::SocketAddr) -> kube::Client {
    let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    config.connect_timeout = Some(super::super::CONNECT_TIMEOUT);
    kube::Client::try_from(config).unwrap()
}

/// Waits up to `limit` (real time) for `cond`.
async fn within(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while !cond() {
        if t0.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Issue 44 item 4: a request that timed out on a connection makes the prober try a new
/// connection at once; when none can be made (here: refused) the server is unreachable
/// (before: a timeout was `Slow` and changed nothing, so every caller kept retrying on its
/// own backoff as if the server were there).
#[tokio::test]
async fn a_timed_out_request_with_no_new_connection_possible_is_an_outage() {
    // a port that refuses: bound, then closed
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let h = ApiHealth::new();
    let cancel = CancellationToken::new();
    tokio::spawn(probe(h.clone(), client_of(addr), cancel.clone()));
    h.failed(Failure::Slow);
    let out = within(Duration::from_secs(5), || !h.is_reachable()).await;
    cancel.cancel();
    assert!(
        out,
        "still reachable 5 s after a timeout with the server refusing"
    );
}

/// Issue 44 item 5: one refused credential check, and the server accepts them when asked
/// again: the latch is cleared at once (before: it stayed, and 300 s later the agent
/// exited `CredentialsRejected` though nothing was refused any more).
#[tokio::test]
async fn one_refusal_accepted_when_asked_again_is_not_latched() {
    let h = ApiHealth::new();
    let cancel = CancellationToken::new();
    tokio::spawn(probe(
        h.clone(),
        client_of(versioned().await),
        cancel.clone(),
    ));
    h.credentials(true);
    let cleared = within(Duration::from_secs(5), || h.refused_for().is_none()).await;
    cancel.cancel();
    assert!(cleared, "still latched: refused for {:?}", h.refused_for());
}

/// Runs [`probe_with`] answering `p`, counting the asks.
fn prober(h: &ApiHealth, p: Probed) -> (Arc<std::sync::atomic::AtomicU32>, CancellationToken) {
    let asks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let cancel = CancellationToken::new();
    let n = asks.clone();
    tokio::spawn(probe_with(
        h.clone(),
        move || {
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { p }
        },
        cancel.clone(),
    ));
    (asks, cancel)
}

fn count(a: &std::sync::atomic::AtomicU32) -> u32 {
    a.load(std::sync::atomic::Ordering::SeqCst)
}

/// Issue 44 item 5: credentials still refused every time they are asked again: the latch
/// grows from the first refusal (asked again at once, then every CREDENTIALS_RECHECK), so
/// the agent's grace (300 s) still ends it, within one recheck of the grace.
#[tokio::test(start_paused = true)]
async fn credentials_refused_whenever_asked_grow_to_the_grace() {
    let h = ApiHealth::new();
    let (asks, cancel) = prober(&h, Probed::Refused);
    tokio::task::yield_now().await;
    h.credentials(true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(count(&asks), 1, "asked again at once");
    let grace = Duration::from_secs(300);
    tokio::time::sleep(grace + CREDENTIALS_RECHECK).await;
    let d = h.refused_for().unwrap();
    assert!(d >= grace, "{d:?}");
    assert_eq!(
        count(&asks),
        32,
        "once at the refusal, then every 10 s for 310 s"
    );
    assert!(h.is_reachable(), "a refusal is an answer");
    cancel.cancel();
}

/// A refusal the prober's asks say nothing about (a server that answers `/version` 404,
/// say): the spell stays as long as its one refusal, and is over after SPELL_GAP; a
/// refusal after that starts a new spell (before: one refusal counted from then on, and a
/// second one days later ended the agent at once).
#[tokio::test(start_paused = true)]
async fn a_spell_is_as_long_as_its_refusals_and_ends_after_the_gap() {
    let h = ApiHealth::new();
    let (asks, cancel) = prober(&h, Probed::Answered);
    tokio::task::yield_now().await;
    h.credentials(true);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.refused_for(), Some(Duration::ZERO));
    tokio::time::sleep(SPELL_GAP).await;
    assert_eq!(h.refused_for(), None);
    let asked = count(&asks);
    assert!((4..=8).contains(&asked), "{asked} asks in 90 s");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(count(&asks), asked, "no asks once the spell is over");
    h.credentials(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    h.credentials(true);
    assert_eq!(h.refused_for(), Some(Duration::from_secs(20)));
    cancel.cancel();
}

/// Nothing latched, nothing slow: the prober asks nothing while the server is reachable
/// (the fleet's idle cost); a slow failure with a server that connects (its probe slow
/// too) leaves it reachable, and slow failures reported together cost one or two asks.
#[tokio::test(start_paused = true)]
async fn the_prober_asks_only_after_a_slow_failure_and_a_slow_server_stays_reachable() {
    let h = ApiHealth::new();
    let (asks, cancel) = prober(&h, Probed::Slow);
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(count(&asks), 0);
    for _ in 0..5 {
        h.failed(Failure::Slow);
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!((1..=2).contains(&count(&asks)), "{} asks", count(&asks));
    assert!(h.is_reachable());
    assert_eq!(h.refused_for(), None);
    cancel.cancel();
}

/// A brownout: requests time out all along (a slow failure every 5 s for two minutes). The
/// prober tries a new connection at most once per [`SLOW_PROBE_GAP`]: a server that connects
/// and is slow is not handshaken with again for every request it was slow on. Before: one new
/// connection for every slow failure (24 in the two minutes).
#[tokio::test(start_paused = true)]
async fn a_brownout_costs_one_new_connection_per_gap_not_one_per_slow_request() {
    let h = ApiHealth::new();
    let (asks, cancel) = prober(&h, Probed::Slow);
    for _ in 0..24 {
        h.failed(Failure::Slow);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let bound = (120 / SLOW_PROBE_GAP.as_secs() + 1) as u32;
    assert!(
        (1..=bound).contains(&count(&asks)),
        "{} new connections for 24 slow requests in 120 s (at most {bound})",
        count(&asks)
    );
    assert!(h.is_reachable());
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn waiters_wake_at_once_on_the_first_answer() {
    let h = ApiHealth::new();
    h.no_answer();
    assert!(!h.is_reachable());
    let t0 = Instant::now();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                h.reachable().await;
                Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(7)).await;
    h.failed(Failure::Answered { retry_after: None });
    for w in waiters {
        assert_eq!(w.await.unwrap() - t0, Duration::from_secs(7));
    }
}

#[tokio::test(start_paused = true)]
async fn an_answered_failure_waits_its_delay_and_no_answer_waits_for_reachability() {
    let h = ApiHealth::new();
    let cancel = CancellationToken::new();
    let t0 = Instant::now();
    let answered = Failure::Answered { retry_after: None };
    assert!(
        h.wait_to_retry(answered, Duration::from_secs(3), &cancel)
            .await
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(3));
    let h2 = h.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        h2.answered();
    });
    let t1 = Instant::now();
    assert!(
        h.wait_to_retry(Failure::NoAnswer, Duration::from_secs(1), &cancel)
            .await
    );
    assert_eq!(Instant::now() - t1, Duration::from_secs(10));
    cancel.cancel();
    assert!(
        !h.wait_to_retry(Failure::NoAnswer, Duration::ZERO, &cancel)
            .await
    );
}
