//! Unit tests of the standby decisions (pure functions, explicit instants).
use super::*;

const T: Duration = Duration::from_secs(40);

/// The standby decision now, from [`seen`].
fn look(renewed: Instant, health: Health, active_since: Option<Instant>) -> Decision {
    let now = Instant::now();
    decide(
        Mode::Standby,
        T,
        now,
        seen(now, renewed, health),
        active_since,
    )
}

/// A look at `now`: the Lease read then, last seen renewed at `renewed`, and the endpoint's
/// `health` (failing on enough probes in a row for a takeover when it fails).
fn seen(now: Instant, renewed: Instant, health: Health) -> Signals {
    Signals {
        renewed,
        read: Some(now),
        health,
        failed_probes: match health {
            Health::Ok => 0,
            _ => FAILED_PROBES_TO_TAKE_OVER,
        },
    }
}

#[test]
fn auto_is_always_standby_passive_when_a_kubelet_holds_the_lease_active_otherwise() {
    use AuthoritySetting::*;
    // a missing Lease: the Node is missing too and nothing answers (no kubelet at all)
    let s = |setting, api, lease| {
        start_mode(
            setting,
            api,
            lease,
            NodeAtStart::Missing,
            Health::Gone,
            false,
        )
    };
    assert_eq!(s(Auto, true, LeaseAtStart::Fresh).mode, Mode::Standby);
    assert_eq!(s(Auto, true, LeaseAtStart::Fresh).role, Role::Passive);
    assert_eq!(
        s(Auto, true, LeaseAtStart::Fresh).reason,
        Reason::LeaseHeldAtStart
    );
    assert_eq!(s(Auto, true, LeaseAtStart::Unknown).mode, Mode::Standby);
    assert_eq!(
        s(Auto, true, LeaseAtStart::Unknown).reason,
        Reason::LeaseUnknownAtStart
    );
    assert_eq!(
        s(Auto, true, LeaseAtStart::Missing).reason,
        Reason::NoLeaseAtStart
    );
    assert_eq!(
        s(Auto, true, LeaseAtStart::Stale).reason,
        Reason::StaleLeaseAtStart
    );
    // a missing Lease (no kubelet registered): active at once, but standby (the loop runs, a
    // renewal hands back); a stale one (a reboot: the kubelet has not renewed yet) passive:
    // only --authority=primary or no API is primary for the life of the process
    let d = s(Auto, true, LeaseAtStart::Missing);
    assert_eq!((d.mode, d.role), (Mode::Standby, Role::Active));
    let d = s(Auto, true, LeaseAtStart::Stale);
    assert_eq!((d.mode, d.role), (Mode::Standby, Role::Passive));
    assert_eq!(s(Auto, true, LeaseAtStart::Unknown).role, Role::Passive);
    assert_eq!(s(Primary, true, LeaseAtStart::Missing).mode, Mode::Primary);
    assert_eq!(
        s(Primary, true, LeaseAtStart::Fresh).reason,
        Reason::ConfiguredPrimary
    );
    assert_eq!(s(Standby, true, LeaseAtStart::Missing).mode, Mode::Standby);
    for setting in [Primary, Standby, Auto] {
        let d = s(setting, false, LeaseAtStart::Fresh);
        assert_eq!((d.role, d.reason), (Role::Active, Reason::NoApi));
    }
}

#[tokio::test(start_paused = true)]
async fn standby_takes_over_only_when_both_signals_say_gone() {
    let renewed = Instant::now();
    tokio::time::advance(T).await;
    let at_threshold = look(renewed, Health::Gone, None);
    assert_eq!(at_threshold.role, Role::Passive, "not longer than 40 s yet");
    assert_eq!(at_threshold.reason, Reason::HealthzFailing);
    tokio::time::advance(Duration::from_millis(1)).await;
    let now = Instant::now();
    for h in [Health::Failed, Health::Gone] {
        let d = look(renewed, h, None);
        assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
    }
    // one signal alone: a warning, never a takeover
    let d = look(renewed, Health::Ok, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::LeaseStale));
    assert!(d.reason.is_warning());
    let d = look(now, Health::Failed, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::HealthzFailing));
    assert!(d.reason.is_warning());
    let d = look(now, Health::Ok, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::KubeletAlive));
    assert!(!d.reason.is_warning());
}

#[tokio::test(start_paused = true)]
async fn standby_hands_back_as_soon_as_the_lease_renews_whatever_healthz_says() {
    let renewed = Instant::now();
    tokio::time::advance(Duration::from_secs(300)).await;
    let took_over = Instant::now();
    let d = look(renewed, Health::Gone, None);
    assert_eq!(d.role, Role::Active);
    // no renewal since the takeover: still active
    tokio::time::advance(Duration::from_secs(2)).await;
    let d = look(renewed, Health::Gone, Some(took_over));
    assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
    // the renewal is seen: passive at once, even while healthz still fails
    let renewed = Instant::now();
    let d = look(renewed, Health::Gone, Some(took_over));
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::HealthzFailing));
    tokio::time::advance(Duration::from_secs(1)).await;
    let d = look(renewed, Health::Ok, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::KubeletAlive));
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_kubelet_answering_healthz_without_renewing_keeps_reaplet_active() {
    let renewed = Instant::now();
    tokio::time::advance(T + Duration::from_secs(1)).await;
    let took_over = Instant::now();
    let d = look(renewed, Health::Gone, None);
    assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
    // the kubelet comes up for a few seconds, crashes, comes up again: never renews
    for (secs, health) in [
        (2, Health::Ok),
        (2, Health::Ok),
        (2, Health::Gone),
        (2, Health::Failed),
        (2, Health::Ok),
        (60, Health::Ok),
    ] {
        tokio::time::advance(Duration::from_secs(secs)).await;
        let d = look(renewed, health, Some(took_over));
        let reason = if health == Health::Ok {
            Reason::HealthzBackNoRenewal
        } else {
            Reason::KubeletGone
        };
        assert_eq!((d.role, d.reason), (Role::Active, reason), "{health:?}");
    }
    assert!(Reason::HealthzBackNoRenewal.is_warning());
    // it finally renews: passive, and the endpoint failing right after does not take over
    let renewed = Instant::now();
    let d = look(renewed, Health::Ok, Some(took_over));
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::KubeletAlive));
    tokio::time::advance(Duration::from_secs(5)).await;
    let d = look(renewed, Health::Gone, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::HealthzFailing));
}

#[tokio::test(start_paused = true)]
async fn a_reboot_starts_passive_and_takes_over_only_by_the_rule() {
    // start: the Lease is stale (the kubelet has not renewed since before the reboot): passive,
    // the start counting as the last renewal (what `run` does)
    let first = start_mode(
        AuthoritySetting::Auto,
        true,
        LeaseAtStart::Stale,
        NodeAtStart::NotRead,
        Health::Disabled,
        false,
    );
    assert_eq!(
        (first.mode, first.role, first.reason),
        (Mode::Standby, Role::Passive, Reason::StaleLeaseAtStart)
    );
    let start = Instant::now();
    // nothing answers yet, within the threshold: passive (before: active at once, beside a
    // kubelet about to start)
    tokio::time::advance(Duration::from_secs(2)).await;
    let d = look(start, Health::Gone, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::HealthzFailing));
    let active_since: Option<Instant> = None;
    // its first renewal is seen: passive
    tokio::time::advance(Duration::from_secs(3)).await;
    let renewed = Instant::now();
    let d = look(renewed, Health::Ok, active_since);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::KubeletAlive));
    // it dies: passive while only one signal says so, and up to the threshold
    tokio::time::advance(Duration::from_secs(1)).await;
    let d = look(renewed, Health::Gone, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::HealthzFailing));
    tokio::time::advance(T - Duration::from_secs(1)).await;
    let d = look(renewed, Health::Gone, None);
    assert_eq!(d.role, Role::Passive, "not longer than the threshold yet");
    // past the threshold, the Lease unrenewed and healthz failing: active again
    tokio::time::advance(Duration::from_millis(1)).await;
    let d = look(renewed, Health::Failed, None);
    assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
}

#[tokio::test(start_paused = true)]
async fn primary_is_always_active() {
    let renewed = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    for h in [Health::Ok, Health::Failed, Health::Gone] {
        let d = {
            let now = Instant::now();
            decide(Mode::Primary, T, now, seen(now, renewed, h), None)
        };
        assert_eq!(
            (d.role, d.reason),
            (Role::Active, Reason::ConfiguredPrimary)
        );
    }
}

#[test]
fn lease_at_start_compares_renew_time_with_the_threshold() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use run::lease_at_start;
    let lease = |ago: i64| Lease {
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            renew_time: Some(MicroTime(
                jiff::Timestamp::now() - jiff::SignedDuration::from_secs(ago),
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(lease_at_start(None, T), LeaseAtStart::Missing);
    assert_eq!(lease_at_start(Some(&lease(5)), T), LeaseAtStart::Fresh);
    assert_eq!(lease_at_start(Some(&lease(-30)), T), LeaseAtStart::Fresh);
    assert_eq!(lease_at_start(Some(&lease(60)), T), LeaseAtStart::Stale);
    assert_eq!(
        lease_at_start(Some(&Lease::default()), T),
        LeaseAtStart::Stale
    );
}

#[tokio::test]
async fn probe_reads_refused_as_gone_and_errors_as_failed() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let url = format!("http://127.0.0.1:{port}/healthz");
    assert_eq!(probe(&url, Duration::from_secs(1)).await, Health::Gone);
    assert_eq!(
        probe("https://127.0.0.1:1/", Duration::from_secs(1)).await,
        Health::Failed
    );
    // a listener that never answers: the timeout
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/healthz", l.local_addr().unwrap());
    assert_eq!(
        probe(&url, Duration::from_millis(200)).await,
        Health::Failed
    );
}

/// An IPv6 endpoint (`healthzBindAddress: "::"` is probed on `[::1]`) answers as any other.
#[tokio::test]
async fn probe_reaches_an_ipv6_endpoint() {
    let Ok(l) = tokio::net::TcpListener::bind("[::1]:0").await else {
        return; // no IPv6 loopback on this machine: nothing to probe
    };
    let url = format!("http://{}/healthz", l.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
        }
    });
    assert_eq!(probe(&url, Duration::from_secs(2)).await, Health::Ok);
    assert_eq!(
        probe_endpoint(None, Duration::from_secs(1)).await,
        Health::Disabled
    );
}

/// Issue 28, item 2: the Lease last read long ago (the API down for reaplet) is not stale,
/// whatever the endpoint says: no takeover on the kubelet's health alone.
#[tokio::test(start_paused = true)]
async fn a_lease_not_read_lately_is_not_a_stale_lease() {
    let renewed = Instant::now();
    // the last read, then 60 s of failed reads; the endpoint fails for good
    tokio::time::advance(Duration::from_secs(60)).await;
    let now = Instant::now();
    let unread = Signals {
        renewed,
        read: Some(renewed),
        health: Health::Gone,
        failed_probes: 30,
    };
    let d = decide(Mode::Standby, T, now, unread, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::LeaseUnread));
    assert!(d.reason.is_warning());
    // never read at all: the same
    let never = Signals {
        read: None,
        ..unread
    };
    let d = decide(Mode::Standby, T, now, never, None);
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::LeaseUnread));
    let d = decide(
        Mode::Standby,
        T,
        now,
        Signals {
            health: Health::Ok,
            failed_probes: 0,
            ..never
        },
        None,
    );
    assert_eq!((d.role, d.reason), (Role::Passive, Reason::KubeletAlive));
    // a look a renewal period and a half old (15 s of 40) still counts; older does not
    let read = now - lease::fresh_for(T);
    let d = decide(
        Mode::Standby,
        T,
        now,
        Signals {
            read: Some(read),
            ..unread
        },
        None,
    );
    assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
    let d = decide(
        Mode::Standby,
        T,
        now + Duration::from_millis(1),
        Signals {
            read: Some(read),
            ..unread
        },
        None,
    );
    assert_eq!(d.role, Role::Passive);
}

/// One failed probe, or two (a slow answer, a kubelet restarting), with the Lease read stale:
/// a warning, never a takeover; the third in a row takes over.
#[tokio::test(start_paused = true)]
async fn a_takeover_needs_failed_probes_in_a_row() {
    let renewed = Instant::now();
    tokio::time::advance(T + Duration::from_secs(1)).await;
    let now = Instant::now();
    for failed_probes in 1..FAILED_PROBES_TO_TAKE_OVER {
        let s = Signals {
            renewed,
            read: Some(now),
            health: Health::Failed,
            failed_probes,
        };
        let d = decide(Mode::Standby, T, now, s, None);
        assert_eq!(
            (d.role, d.reason),
            (Role::Passive, Reason::KubeletMayBeGone),
            "{failed_probes} failed"
        );
    }
    let s = Signals {
        renewed,
        read: Some(now),
        health: Health::Gone,
        failed_probes: FAILED_PROBES_TO_TAKE_OVER,
    };
    let d = decide(Mode::Standby, T, now, s, None);
    assert_eq!((d.role, d.reason), (Role::Active, Reason::KubeletGone));
}

/// Issue 44, item 3: a restart of an active reaplet (this boot's marker, the Lease still
/// carrying the renewTime it saw) starts passive in auto or standby and takes over again only
/// on the takeover's proof (the loop: three failed probes, a stale read, the consistent read;
/// before: active at start on one probe). The marker counts for nothing beside any other
/// Lease, nor in primary mode.
#[test]
fn a_restart_of_the_acting_agent_starts_passive_and_resumes_only_on_the_proof() {
    use AuthoritySetting::*;
    let s = |setting, lease, resuming| {
        start_mode(
            setting,
            true,
            lease,
            NodeAtStart::NotRead,
            Health::Disabled,
            resuming,
        )
    };
    for setting in [Auto, Standby] {
        let d = s(setting, LeaseAtStart::Stale, true);
        assert_eq!(
            (d.mode, d.role, d.reason),
            (Mode::Standby, Role::Passive, Reason::ResumingAfterRestart)
        );
        for lease in [LeaseAtStart::Fresh, LeaseAtStart::Unknown] {
            assert_eq!(s(setting, lease, true).role, Role::Passive);
        }
        assert_eq!(s(setting, LeaseAtStart::Stale, false).role, Role::Passive);
    }
    assert_eq!(s(Standby, LeaseAtStart::Missing, true).role, Role::Passive);
    assert_eq!(s(Primary, LeaseAtStart::Stale, true).role, Role::Active);
    // the loop's takeover, proved, is the resumption
    let takeover = Decision {
        mode: Mode::Standby,
        role: Role::Active,
        reason: Reason::KubeletGone,
    };
    let d = proved(takeover, Proof::Holds, true);
    assert_eq!(
        (d.role, d.reason),
        (Role::Active, Reason::ActiveBeforeRestart)
    );
    assert_eq!(proved(takeover, Proof::Failed, true).role, Role::Passive);
}

/// Issue 44, item 1: a missing Lease is "no kubelet" (active at start) only when no Node
/// object exists under the name either and nothing answers on the kubelet's endpoint; a Node
/// without a Lease, a missing Node while the endpoint answers (even with an error), or a Node
/// that cannot be read, is passive with a warning that names the node-name problem.
#[test]
fn a_missing_lease_is_no_kubelet_only_when_nothing_says_there_is_one() {
    let s = |node, health| {
        start_mode(
            AuthoritySetting::Auto,
            true,
            LeaseAtStart::Missing,
            node,
            health,
            false,
        )
    };
    for health in [Health::Gone, Health::Disabled] {
        let d = s(NodeAtStart::Missing, health);
        assert_eq!((d.role, d.reason), (Role::Active, Reason::NoLeaseAtStart));
    }
    for health in [Health::Ok, Health::Failed] {
        let d = s(NodeAtStart::Missing, health);
        assert_eq!(
            (d.role, d.reason),
            (Role::Passive, Reason::NoNodeKubeletAnswers)
        );
        assert!(d.reason.is_warning());
        assert_eq!(
            d.reason.identity_problem(),
            Some(crate::metrics::IdentityProblem::NodeMissing)
        );
    }
    for health in [Health::Ok, Health::Failed, Health::Gone, Health::Disabled] {
        let d = s(NodeAtStart::Exists, health);
        assert_eq!(
            (d.role, d.reason),
            (Role::Passive, Reason::NodeWithoutLease)
        );
        assert!(d.reason.is_warning());
        assert_eq!(
            d.reason.identity_problem(),
            Some(crate::metrics::IdentityProblem::LeaseMissing)
        );
        let d = s(NodeAtStart::Unknown, health);
        assert_eq!(
            (d.role, d.reason),
            (Role::Passive, Reason::NodeUnknownAtStart)
        );
    }
}

/// Issue 44, item 2: a takeover that [`decide`] makes is carried out only on its proof: the
/// consistent read (a renewal it shows is already in the re-decision), the Lease present, the
/// Node present; anything else is passive with a warning.
#[test]
fn a_takeover_needs_its_proof() {
    let takeover = Decision {
        mode: Mode::Standby,
        role: Role::Active,
        reason: Reason::KubeletGone,
    };
    assert_eq!(proved(takeover, Proof::Holds, false), takeover);
    for (proof, reason) in [
        (Proof::Failed, Reason::TakeoverUnconfirmed),
        (Proof::LeaseMissing, Reason::LeaseMissing),
        (Proof::NodeMissing, Reason::NodeMissing),
    ] {
        let d = proved(takeover, proof, false);
        assert_eq!((d.role, d.reason), (Role::Passive, reason));
        assert!(d.reason.is_warning());
        let label = match proof {
            Proof::LeaseMissing => Some(crate::metrics::IdentityProblem::LeaseMissing),
            Proof::NodeMissing => Some(crate::metrics::IdentityProblem::NodeMissing),
            _ => None,
        };
        assert_eq!(d.reason.identity_problem(), label);
    }
    // the consistent read showed a renewal: the re-decision stands
    let renewed = Decision {
        role: Role::Passive,
        reason: Reason::HealthzFailing,
        ..takeover
    };
    assert_eq!(proved(renewed, Proof::Holds, false), renewed);
}
