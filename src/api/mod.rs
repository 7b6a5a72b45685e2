//! The Kubernetes API side: kubelet's client setup (`cmd/kubelet/app/server.go`), its API pod
//! source (`pkg/kubelet/config/apiserver.go`), status manager (`pkg/kubelet/status`) and event
//! recorder.
//!
//! Invariants:
//! * reaplet only reads and writes pods bound to its node (a field selector on the watch, and a
//!   node check on every object, so a stray object from the server is ignored);
//! * writes (status, delete, events) pass one token-bucket [`RateLimiter`] whose defaults do
//!   not make 110 deletions trickle;
//! * API errors are classified by HTTP status code, never by message text;
//! * every request is bounded in time: status, delete, get and event requests by
//!   [`REQUEST_TIMEOUT`] ([`bounded`]); the pod LIST by the source's own deadline; an open watch
//!   by the server's `timeoutSeconds` plus kube-runtime's idle margin (the pod watch's is 15 s:
//!   [`source::WATCH_TIMEOUT`]), and the connection by an idle-read timeout a little longer
//!   than the longest; every connection by TCP keepalive and `TCP_USER_TIMEOUT` (a dead path
//!   found in 20 s, [`client`]);
//! * every request carries a `User-Agent` naming reaplet and its version ([`user_agent`]), so
//!   the server's audit log and managedFields tell it from the kubelet acting as the same node.

pub mod client;
pub mod events;
pub mod health;
pub mod source;
pub mod status_manager;

use crate::backoff::Failure;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error("no API credentials: no --kubeconfig given and not running in a cluster ({0})")]
    NoCredentials(kube::config::InClusterError),
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
}

/// How long a status, delete, get or event request may take before it is abandoned (and
/// retried by its owner, as for any other failure).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a new connection may take, TCP and TLS handshake (kube's connector bounds both):
/// shorter than [`REQUEST_TIMEOUT`], so that a request timing out had a connection, and is a
/// slow answer ([`Failure::Slow`]) rather than none.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(CONNECT_TIMEOUT.as_nanos() < REQUEST_TIMEOUT.as_nanos());

/// The connection's idle-read limit: longer than a watch may stay silent (the server ends it
/// after `timeoutSeconds`, 290 s from kube-runtime, whose own idle check fires 5 s later).
const READ_TIMEOUT: Duration = Duration::from_secs(320);

/// A request that failed, or got no answer in time.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// Sent on a connection, not answered in time.
    #[error("no answer from the API server within {0:?}")]
    Timeout(Duration),
}

impl RequestError {
    /// The HTTP status of an API error answer, if it was one.
    pub fn code(&self) -> Option<u16> {
        match self {
            RequestError::Api(e) => status_code(e),
            RequestError::Timeout(_) => None,
        }
    }

    /// The credentials were refused: a 401, or reaplet's credential plugin failed.
    pub fn credentials_refused(&self) -> bool {
        self.code() == Some(401) || self.api().is_some_and(auth_failed)
    }

    /// The API error, if the server answered.
    pub fn api(&self) -> Option<&kube::Error> {
        match self {
            RequestError::Api(e) => Some(e),
            RequestError::Timeout(_) => None,
        }
    }

    /// A 403 of the Node authorizer to a node identity for an object it has no relationship
    /// with: a pod that is gone, or no longer bound to the node (a node cannot tell which;
    /// apiserver facts 3.2, 3.5). The authorizer gives its cause only in the Status message
    /// (`... User "system:node:<n>" cannot get ...: no relationship found between node '<n>'
    /// and this object`), so this is the one place that reads it: any other 403 (RBAC, a
    /// webhook, another identity) is a permission problem, never a pod that is gone.
    pub fn forbidden_no_relationship(&self) -> bool {
        let Some(kube::Error::Api(s)) = self.api() else {
            return false;
        };
        if s.code != 403 || s.reason != "Forbidden" {
            return false;
        }
        let Some(user) = s
            .message
            .split_once("User \"system:node:")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(node, _)| node)
        else {
            return false;
        };
        !user.is_empty()
            && s.message.ends_with(&format!(
                ": no relationship found between node '{user}' and this object"
            ))
    }

    /// The server's `retryAfterSeconds` (sent with 429 and some 5xx answers).
    pub fn retry_after(&self) -> Option<Duration> {
        self.api().and_then(retry_after)
    }

    /// What the failure tells a backoff: a request that timed out had a connection (the
    /// connect timeout is shorter) and is slow, not unanswered (the health prober then tries a
    /// new connection: [`health`]; a connection whose path died fails before this timeout, by
    /// its user timeout, as unanswered: [`client::USER_TIMEOUT`]).
    pub fn failure(&self) -> Failure {
        match self {
            RequestError::Api(e) => failure_of(e),
            RequestError::Timeout(_) => Failure::Slow,
        }
    }
}

/// What a failed list or watch tells the backoff: whether the server answered, and its
/// `Retry-After`.
pub fn watch_failure(e: &kube::runtime::watcher::Error) -> Failure {
    match e {
        kube::runtime::watcher::Error::InitialListFailed(e)
        | kube::runtime::watcher::Error::WatchStartFailed(e)
        | kube::runtime::watcher::Error::WatchFailed(e) => failure_of(e),
        kube::runtime::watcher::Error::WatchError(s) => Failure::Answered {
            retry_after: status_retry_after(s),
        },
        kube::runtime::watcher::Error::NoResourceVersion => Failure::Answered { retry_after: None },
    }
}

/// Whether reaplet's own credentials failed before the request went out: an exec plugin
/// that fails, a token that cannot be refreshed. At run time kube's auth layer reports these
/// inside a `Service` error; they are a rejection of the credentials (as a 401 is), never a
/// server that does not answer.
pub fn auth_failed(e: &kube::Error) -> bool {
    match e {
        kube::Error::Auth(_) => true,
        kube::Error::Service(b) => {
            let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(b.as_ref());
            while let Some(err) = cur {
                if err.is::<kube::client::AuthError>() {
                    return true;
                }
                cur = err.source();
            }
            false
        }
        _ => false,
    }
}

/// Whether the server answered a failed request (an error code, a body reaplet could not
/// read) or not (refused, reset, timed out, TLS or transport broken), and what it asked for.
/// A failure of reaplet's own credentials ([`auth_failed`]) counts as answered: retrying
/// when the server is reachable would wait for ever.
pub fn failure_of(e: &kube::Error) -> Failure {
    if auth_failed(e) {
        return Failure::Answered { retry_after: None };
    }
    match e {
        kube::Error::Api(s) => Failure::Answered {
            retry_after: status_retry_after(s),
        },
        kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_)
        | kube::Error::LinesCodecMaxLineLengthExceeded => Failure::Answered { retry_after: None },
        _ => Failure::NoAnswer,
    }
}

/// Runs one API request with [`REQUEST_TIMEOUT`]: a hung server costs its caller that long,
/// never more (the request is dropped, and with it the connection).
pub async fn bounded<T>(
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, RequestError> {
    bounded_by(REQUEST_TIMEOUT, request).await
}

/// Runs one API request with `limit` (longer than [`CONNECT_TIMEOUT`]).
pub async fn bounded_by<T>(
    limit: Duration,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(limit, request).await {
        Ok(r) => r.map_err(RequestError::Api),
        Err(_) => Err(RequestError::Timeout(limit)),
    }
}

/// `reaplet/<version> (<os>/<arch>)`, the form of the kubelet's own `kubelet/v1.36.0 (linux/amd64)`.
pub fn user_agent() -> String {
    format!(
        "reaplet/{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// Evicts `name` (`policy/v1` Eviction), bounded by [`REQUEST_TIMEOUT`]. A `Failure` Status in
/// a 2xx answer (how an apiserver may carry "more than one PodDisruptionBudget") is that
/// failure.
pub async fn evict(
    api: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    ep: &kube::api::EvictParams,
) -> Result<kube::core::Status, RequestError> {
    bounded(api.evict(name, ep)).await.and_then(|st| {
        if st.is_failure() {
            Err(RequestError::Api(kube::Error::Api(Box::new(st))))
        } else {
            Ok(st)
        }
    })
}

impl RequestError {
    /// What the server said: its first cause's message (a budget's "needs 1 healthy pods"),
    /// else its message, else the error itself.
    pub fn detail(&self) -> String {
        match self.api() {
            Some(kube::Error::Api(s)) => s
                .details
                .as_ref()
                .and_then(|d| d.causes.first())
                .map_or_else(|| s.message.clone(), |c| c.message.clone()),
            _ => self.to_string(),
        }
    }
}

/// The server's `retryAfterSeconds` in an error answer's details (kube-apiserver sets it, with
/// the `Retry-After` header, on 429s and on 5xx answers that invite a retry).
pub fn retry_after(e: &kube::Error) -> Option<Duration> {
    match e {
        kube::Error::Api(s) => status_retry_after(s),
        _ => None,
    }
}

/// A Status answer's `retryAfterSeconds`, when it asks for one.
pub fn status_retry_after(s: &kube::core::Status) -> Option<Duration> {
    s.details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(u64::from(s)))
}

/// The kubelet's order: an explicit kubeconfig, else the in-cluster service account.
///
/// kube-rs's built-in retry of 429/503/504 (up to 15 attempts, backing off to minutes) is
/// switched off: the status manager and the watcher retry with their own bounded backoff, and
/// an eviction's 429 must reach its caller.
pub async fn client_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ApiError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let err = |source| ApiError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::incluster().map_err(ApiError::NoCredentials)?,
    };
    config.default_retry = false;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    // the read timeout counts from the request, not from when a pooled connection went idle
    config.reset_reader_on_write = true;
    config.write_timeout = Some(REQUEST_TIMEOUT);
    if let Ok(ua) = http::HeaderValue::from_str(&user_agent()) {
        config.headers.push((http::header::USER_AGENT, ua));
    }
    Ok(config)
}

/// The HTTP status of an API error answer, if it was one.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The object the request named is not the one stored under its name: a status write whose
/// `metadata.uid` differs is refused with 422 and a cause on field `metadata.uid` (the pod was
/// deleted and recreated under the same name; the real server does not answer 409 here).
pub fn uid_mismatch(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code == 422
                && s.details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
        }
        _ => false,
    }
}

/// A delete precondition that no longer holds: 409 whose details name the Kind (`Pod`), as
/// the server answers a UID precondition for an object deleted and recreated under the same
/// name. Any other 409 (the object changed under a write) is a conflict to retry.
pub fn precondition_failed(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 409 && s.details.as_ref().is_some_and(|d| d.kind == "Pod"),
        _ => false,
    }
}

/// A token bucket: `qps` tokens a second, at most `burst` banked.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: tokio::sync::Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(0.001),
            burst,
            state: tokio::sync::Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for a token. Callers queue in order (the mutex is fair).
    pub async fn acquire(&self) {
        let mut st = self.state.lock().await;
        let now = Instant::now();
        let (tokens, last) = *st;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
        if tokens >= 1.0 {
            *st = (tokens - 1.0, now);
            return;
        }
        let wait = Duration::from_secs_f64((1.0 - tokens) / self.qps);
        tokio::time::sleep(wait).await;
        *st = (0.0, now + wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38, item 5: a credential plugin that fails (kube reports it inside a `Service`
    /// error at run time, `Auth` when the client is built) is a refusal of the credentials, not
    /// a server that does not answer (before: `NoAnswer`, so the server was marked unreachable
    /// and every request waited for a prober that failed the same way, for ever).
    #[test]
    fn a_failing_credential_plugin_is_a_refusal_not_an_outage() {
        let plugin = || kube::client::AuthError::ExecPluginFailed;
        for e in [
            kube::Error::Service(Box::new(plugin())),
            kube::Error::Auth(plugin()),
        ] {
            assert!(auth_failed(&e), "{e}");
            assert_eq!(failure_of(&e), Failure::Answered { retry_after: None });
        }
        let refused = kube::Error::Service(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(!auth_failed(&refused));
        assert_eq!(failure_of(&refused), Failure::NoAnswer);
    }

    /// Issue 28, item 9: only the Node authorizer's own cause, to a node identity, is a pod
    /// that is gone (the message of apiserver facts 3.2); RBAC's answer to a service account,
    /// another cause, or a mismatched node are permission problems.
    #[test]
    fn only_the_node_authorizers_no_relationship_is_gone() {
        let forbidden = |message: &str| {
            let s = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "reason": "Forbidden", "code": 403});
            RequestError::Api(kube::Error::Api(serde_json::from_value(s).unwrap()))
        };
        let node = r#"pods "r0" is forbidden: User "system:node:node-a" cannot get resource "pods" in API group "" in the namespace "default": no relationship found between node 'node-a' and this object"#;
        assert!(forbidden(node).forbidden_no_relationship());
        for other in [
            r#"pods "r0" is forbidden: User "system:serviceaccount:kube-system:reaplet" cannot get resource "pods" in API group "" in the namespace "default""#,
            r#"pods "r0" is forbidden: User "system:node:node-a" cannot get resource "pods" in API group "" in the namespace "default""#,
            r#"pods "r0" is forbidden: User "system:node:node-a" cannot get resource "pods" in API group "" in the namespace "default": no relationship found between node 'node-b' and this object"#,
            r#"pods "r0" is forbidden: User "alice" cannot get resource "pods": no relationship found between node '' and this object"#,
        ] {
            assert!(!forbidden(other).forbidden_no_relationship(), "{other}");
        }
        assert!(!RequestError::Timeout(Duration::from_secs(1)).forbidden_no_relationship());
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_allows_burst_then_qps() {
        let l = RateLimiter::new(10.0, 5);
        let t0 = Instant::now();
        for _ in 0..5 {
            l.acquire().await;
        }
        assert_eq!(Instant::now(), t0, "the burst is free");
        for _ in 0..10 {
            l.acquire().await;
        }
        let took = Instant::now() - t0;
        assert!(
            took >= Duration::from_millis(990) && took <= Duration::from_millis(1010),
            "{took:?}"
        );
    }
}
