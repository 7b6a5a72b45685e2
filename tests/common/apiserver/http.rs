//! The HTTP front: real HTTP/1.1 on loopback, so reaplet's real client stack (kube-rs, hyper,
//! rustls off) is exercised. A request goes through kube-apiserver's handler chain in its
//! order: authentication (401), the fault layer (tests only), request-info parsing, the
//! authorizer (403), then the resource's handler (admission, validation, storage).

use super::authorization::{self, Attrs, User};
use super::faults::{self, Verdict};
use super::patch::PatchType;
use super::reply::{self, Reply};
use super::store::State;
use super::{Recorded, events, eviction, leases, nodes, pdbs, pods, status, watch};
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One parsed request.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub user_agent: String,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
    /// The body was present but not JSON.
    pub body_malformed: bool,
    pub user: User,
    pub attrs: Attrs,
}

impl Req {
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    pub fn is_watch(&self) -> bool {
        matches!(self.q("watch"), Some("true" | "1"))
    }

    pub fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// `RequestInfo`: group, resource, namespace, name, subresource and verb of a path.
pub fn request_info(method: &str, path: &str, query: &HashMap<String, String>) -> Option<Attrs> {
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    // the one non-resource URL a node agent asks (`system:public-info-viewer`: every identity
    // may read it): verb `get`, no resource, so that fault rules match it as they match the rest
    if seg == ["version"] && method == "GET" {
        return Some(Attrs {
            verb: "get".into(),
            group: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            field_selector: None,
        });
    }
    let (group, rest) = match seg.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, rest @ ..] => (*ns, [&[*resource][..], rest].concat()),
        _ => ("", rest.to_vec()),
    };
    let (resource, name, subresource) = match rest.as_slice() {
        [r] => (*r, "", ""),
        [r, n] => (*r, *n, ""),
        [r, n, s] => (*r, *n, *s),
        _ => return None,
    };
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    // `watch` makes a watch of a collection only: `…/NAME?watch=1` is a GET (fact 8.5)
    let verb = match (method, name.is_empty()) {
        ("GET", true) if watch => "watch",
        ("GET", true) => "list",
        ("GET", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => return None,
    };
    Some(Attrs {
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: percent_decode(namespace),
        name: percent_decode(name),
        field_selector: query.get("fieldSelector").cloned(),
    })
}

pub async fn accept_loop(first: tokio::net::TcpListener, addr: SocketAddr, state: Arc<State>) {
    let mut listener = Some(first);
    loop {
        let l = match listener.take() {
            Some(l) => l,
            None => {
                let until = state.faults.lock().unwrap().refuse_until;
                if let Some(t) = until {
                    tokio::time::sleep_until(t.into()).await;
                }
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
            }
        };
        loop {
            tokio::select! {
                _ = state.refuse.notified() => break,
                acc = l.accept() => {
                    let Ok((stream, _)) = acc else { continue };
                    // a connection that raced with refuse_connections_for is refused too
                    if faults::refusing(&state) || faults::closing(&state) {
                        drop(stream);
                        continue;
                    }
                    let state = state.clone();
                    let mut generation = state.generation.subscribe();
                    tokio::spawn(async move {
                        let svc_state = state.clone();
                        let svc = hyper::service::service_fn(move |req| {
                            let st = svc_state.clone();
                            async move { handle(st, req).await }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc);
                        tokio::select! {
                            _ = conn => {}
                            _ = generation.changed() => {}
                        }
                    });
                }
            }
        }
        drop(l);
    }
}

/// An error from the service closes the connection without an answer (a reset).
#[derive(Debug)]
pub struct ConnectionReset;

impl std::fmt::Display for ConnectionReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected connection reset")
    }
}

impl std::error::Error for ConnectionReset {}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Reply, ConnectionReset> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type").unwrap_or_default();
    let user_agent = header("user-agent").unwrap_or_default();
    let auth = header("authorization");
    // `as=PartialObjectMetadata` (kube's `get_metadata`): the object's metadata alone
    let metadata_only = header("accept").is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let parsed = if bytes.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::from_slice::<Value>(&bytes)
    };
    let body_malformed = parsed.is_err();
    let body = parsed.unwrap_or(Value::Null);
    let record = |user: String, status: u16| Recorded {
        at: Instant::now(),
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        user_agent: user_agent.clone(),
        body: body.clone(),
        user,
        status,
    };
    let user = match authorization::authenticate(auth.as_deref()) {
        Ok(u) => u,
        Err(r) => {
            state.log.push(record(String::new(), 401));
            return Ok(r);
        }
    };
    let Some(attrs) = request_info(&method, &path, &query) else {
        let r = reply::no_route(&method, &path);
        state.log.push(record(user.name(), 404));
        return Ok(r);
    };
    let req = Req {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        user_agent: user_agent.clone(),
        body: body.clone(),
        body_malformed,
        user: user.clone(),
        attrs,
    };
    let verdict = faults::before(&state, &req).await;
    // from here the handler may change the store: in flight until logged (a watch lasts, and
    // is never waited for)
    let _in_flight = (req.attrs.verb != "watch").then(|| state.log.begin());
    let resp = match verdict {
        Verdict::Reset => {
            state.log.push(record(user.name(), 0));
            return Err(ConnectionReset);
        }
        Verdict::Answer(r) => r,
        Verdict::Pass => route(&state, &req).await,
    };
    let resp = match metadata_only && req.attrs.verb == "get" && resp.status() == 200 {
        true => reply::metadata_only(resp).await,
        false => resp,
    };
    let resp = faults::after(&state, &req, resp);
    state.log.push(record(user.name(), resp.status().as_u16()));
    Ok(resp)
}

async fn route(state: &Arc<State>, req: &Req) -> Reply {
    let a = &req.attrs;
    if req.path == "/version" {
        return reply::version();
    }
    if let Err(r) = authorization::authorize(&req.user, a, &state.lock()) {
        return r;
    }
    if let Some(r) = check_content_type(req) {
        return r;
    }
    match (
        a.group.as_str(),
        a.resource.as_str(),
        a.subresource.as_str(),
    ) {
        ("", "pods", "") if matches!(a.verb.as_str(), "list" | "watch") => {
            watch::list_or_watch(state, req, super::store::Kind::Pod).await
        }
        ("", "pods", "") => pods::handle(state, req),
        ("", "pods", "status") => status::handle(state, req),
        ("", "pods", "eviction") => eviction::evict(state, req),
        ("policy", "poddisruptionbudgets", "") if matches!(a.verb.as_str(), "list" | "watch") => {
            watch::list_or_watch(state, req, super::store::Kind::Pdb).await
        }
        ("policy", "poddisruptionbudgets", "" | "status") => pdbs::pdbs(state, req),
        ("", "nodes", "") if matches!(a.verb.as_str(), "list" | "watch") => {
            watch::list_or_watch(state, req, super::store::Kind::Node).await
        }
        ("", "nodes", "" | "status") => nodes::handle(state, req),
        ("coordination.k8s.io", "leases", "") if matches!(a.verb.as_str(), "list" | "watch") => {
            watch::list_or_watch(state, req, super::store::Kind::Lease).await
        }
        ("coordination.k8s.io", "leases", "") => leases::handle(state, req),
        ("" | "events.k8s.io", "events", "") => events::handle(state, req),
        ("apps", "replicasets", "") | ("scheduling.k8s.io", "priorityclasses", "") => {
            super::readonly::handle(state, req)
        }
        ("authorization.k8s.io", "selfsubjectaccessreviews", "") => {
            authorization::access_review(state, req)
        }
        _ => reply::no_route(&req.method, &req.path),
    }
}

/// The handlers' decoding of a body by its content type (fact 11.6): a PATCH must name a patch
/// type, an apply patch needs a `fieldManager`, and a POST or PUT body must be an object
/// encoding, not a patch.
fn check_content_type(req: &Req) -> Option<Reply> {
    let base = req.content_type.split(';').next().unwrap_or("").trim();
    match req.method.as_str() {
        "PATCH" => match PatchType::from_content_type(base) {
            None => Some(reply::unsupported_media_type(true)),
            Some(PatchType::Apply) if req.q("fieldManager").is_none_or(str::is_empty) => {
                Some(reply::respond(
                    422,
                    &reply::status_body(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                        serde_json::json!({"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [{"reason": "FieldValueRequired", "message": "Required value: is required for apply patch", "field": "fieldManager"}]}),
                    ),
                ))
            }
            Some(_) => None,
        },
        "POST" | "PUT" => {
            let accepted = base.is_empty()
                || matches!(
                    base,
                    "application/json" | "application/yaml" | "application/vnd.kubernetes.protobuf"
                );
            (!accepted).then(|| reply::unsupported_media_type(false))
        }
        _ => None,
    }
}
