//! The answers kube-apiserver gives: `metav1.Status` bodies with the code, reason, message and
//! details it sends (fact 11.8: `details.kind` is the resource in 403/404/409-modified answers,
//! the Kind in precondition conflicts and 422s).

use super::Body;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use hyper::body::Bytes;
use serde_json::{Value, json};

/// A handler's answer.
pub type Reply = Response<Body>;

pub fn status_body(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code,
    });
    if !reason.is_empty() {
        v["reason"] = reason.into();
    }
    if !details.as_object().is_some_and(|d| d.is_empty()) && !details.is_null() {
        v["details"] = details;
    }
    v
}

pub fn respond(code: u16, v: &Value) -> Reply {
    respond_with(code, v, &[])
}

pub fn respond_with(code: u16, v: &Value, headers: &[(&str, String)]) -> Reply {
    let mut b = Response::builder()
        .status(code)
        .header("content-type", "application/json");
    for (k, val) in headers {
        b = b.header(*k, val);
    }
    b.body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("valid response")
}

/// `{resource}` or `{resource}.{group}` as messages name it (`leases.coordination.k8s.io`).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind});
    if !group.is_empty() {
        d["group"] = group.into();
    }
    d
}

/// An answer about one named object: `{resource} "{name}" {what}`.
fn about(code: u16, reason: &str, group: &str, resource: &str, name: &str, what: &str) -> Reply {
    respond(
        code,
        &status_body(
            code,
            reason,
            &format!("{} \"{name}\" {what}", qualified(group, resource)),
            details(name, group, resource),
        ),
    )
}

/// 404 `{resource} "{name}" not found`.
pub fn not_found(group: &str, resource: &str, name: &str) -> Reply {
    about(404, "NotFound", group, resource, name, "not found")
}

/// 409 AlreadyExists.
pub fn already_exists(group: &str, resource: &str, name: &str) -> Reply {
    about(
        409,
        "AlreadyExists",
        group,
        resource,
        name,
        "already exists",
    )
}

/// 409 for a stale resourceVersion on an update (fact 4.2, 8.3).
pub fn conflict_modified(group: &str, resource: &str, name: &str) -> Reply {
    respond(
        409,
        &status_body(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, resource)
            ),
            details(name, group, resource),
        ),
    )
}

/// 409 for a failed delete precondition (facts 2.2, 2.3, 6.8): Kind in the message and details.
pub fn conflict_precondition(kind: &str, name: &str, what: &str, want: &str, have: &str) -> Reply {
    let tail = if what == "UID" {
        "The object might have been deleted and then recreated"
    } else {
        "The object might have been modified"
    };
    respond(
        409,
        &status_body(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {kind} \"{name}\": the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}"
            ),
            json!({"name": name, "kind": kind}),
        ),
    )
}

/// 403 from an admission plugin (NodeRestriction): `{resource} "{name}" is forbidden: {msg}`.
pub fn admission_forbidden(group: &str, resource: &str, name: &str, msg: &str) -> Reply {
    about(
        403,
        "Forbidden",
        group,
        resource,
        name,
        &format!("is forbidden: {msg}"),
    )
}

/// 422 Invalid: `{Kind} "{name}" is invalid: {field}: {detail}`, one cause per error.
pub fn invalid(kind: &str, group: &str, name: &str, errors: &[(&str, &str, String)]) -> Reply {
    let qualified_kind = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    // the aggregate message lists each distinct error once; causes keep them all
    let mut text: Vec<String> = Vec::new();
    for (field, _, detail) in errors {
        let t = format!("{field}: {detail}");
        if !text.contains(&t) {
            text.push(t);
        }
    }
    let message = if text.len() == 1 {
        format!("{qualified_kind} \"{name}\" is invalid: {}", text[0])
    } else {
        format!(
            "{qualified_kind} \"{name}\" is invalid: [{}]",
            text.join(", ")
        )
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|(field, reason, detail)| json!({"reason": reason, "message": detail, "field": field}))
        .collect();
    let mut d = json!({"name": name, "kind": kind, "causes": causes});
    if !group.is_empty() {
        d["group"] = group.into();
    }
    respond(422, &status_body(422, "Invalid", &message, d))
}

/// 400 BadRequest.
pub fn bad_request(message: &str) -> Reply {
    respond(400, &status_body(400, "BadRequest", message, json!({})))
}

/// 415 for a body or patch type the endpoint does not take (fact 11.6).
pub fn unsupported_media_type(patch: bool) -> Reply {
    let message = if patch {
        "415: Unsupported Media Type"
    } else {
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
    };
    respond(
        415,
        &status_body(415, "UnsupportedMediaType", message, json!({})),
    )
}

/// `GET /version`: `200` with the server's version, as kube-apiserver answers every
/// authenticated identity (credentials it refuses get the `401` of authentication first).
pub fn version() -> Reply {
    respond(
        200,
        &json!({
            "major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
            "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
            "gitVersion": "v1.36.5", "gitTreeState": "clean", "compiler": "gc",
            "platform": "linux/amd64",
        }),
    )
}

/// A GET's answer as kube-apiserver gives it to `Accept: application/json;as=PartialObjectMetadata;
/// g=meta.k8s.io;v=v1`: `kind: PartialObjectMetadata` with the object's `metadata` alone (no
/// spec, no status).
pub async fn metadata_only(full: Reply) -> Reply {
    let bytes = full.into_body().collect().await.map(|b| b.to_bytes());
    let object: Value = bytes
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    respond(
        200,
        &json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object["metadata"],
        }),
    )
}

/// 404 for a path the server does not serve.
pub fn no_route(method: &str, path: &str) -> Reply {
    respond(
        404,
        &status_body(
            404,
            "NotFound",
            &format!("the server could not find the requested resource ({method} {path})"),
            json!({}),
        ),
    )
}

/// `{"kind":"Status",...,"status":"Success"}` as DELETE of a lease and evictions answer.
pub fn success(code: u16, details: Option<Value>) -> Reply {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"});
    if let Some(d) = details {
        v["details"] = d;
    }
    if code != 200 {
        v["code"] = code.into();
    }
    respond(code, &v)
}

/// 422 for unknown fields under `fieldValidation=Strict`: the message ends
/// `strict decoding error: unknown field "status.bogusField"`.
pub fn bad_request_strict(unknown: &[String]) -> Reply {
    respond(
        422,
        &status_body(
            422,
            "Invalid",
            &format!(".status: strict decoding error: {}", unknown.join(", ")),
            json!({}),
        ),
    )
}
