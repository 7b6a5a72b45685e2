//! The Kubernetes API side: kubelet's client setup (`cmd/kubelet/app/server.go`), its API pod
//! source (`pkg/kubelet/config/apiserver.go`), status manager (`pkg/kubelet/status`) and event
//! recorder.
//!
//! Invariants:
//! * reaplet only reads and writes pods bound to its node (a field selector on the watch, and a
//!   node check on every object, so a stray object from the server is ignored);
//! * writes (status, delete, events) pass one token-bucket [`RateLimiter`] whose defaults do
//!   not make 110 deletions trickle;
//! * API errors are classified by HTTP status code, never by message text.

pub mod events;
pub mod source;
pub mod status_manager;

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
