//! Authentication and authorization: kube-apiserver's token authenticator, the Node
//! authorizer (`plugin/pkg/auth/authorizer/node`) with the `system:node` rules, and RBAC for an
//! admin. Admission (NodeRestriction) lives with each resource, since it needs the object.
//!
//! Identities are bearer tokens, as a static token file gives them: `admin` is a member of
//! `system:masters` (everything allowed); `node:<name>` is `system:node:<name>` in
//! `system:nodes`. Any other token answers 401.
//!
//! Facts implemented here (node identity `node-a`):
//! * 3.2, 3.3, 3.5: a pod GET is allowed only when the pod exists and is bound to the node;
//!   otherwise 403 `no relationship found between node 'node-a' and this object` (a node
//!   cannot tell gone from not mine);
//! * 5.6: no PATCH/PUT of pod objects (only `pods/status`);
//! * 7.7: pod LIST/WATCH only with a `spec.nodeName=<self>` field selector (an HTTP 403, not
//!   an ERROR event);
//! * 8.4, 8.5: leases only in `kube-node-lease`, only the node's own name, no LIST/WATCH;
//! * 9 (GET node-b, LIST nodes, DELETE nodes): only its own Node is readable; no node deletes;
//! * 10.3: events may be created and patched, never read or deleted.
//!
//! Inferred, not measured: a node's LIST/WATCH of nodes with `metadata.name=<self>` is allowed
//! (the kubelet's own node informer does it, Node authorizer with selectors, v1.32+).

use super::reply::{Reply, qualified, respond, status_body};
use super::store::{Store, str_at};
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    Admin,
    Node(String),
}

impl User {
    /// The user name the server reports.
    pub fn name(&self) -> String {
        match self {
            User::Admin => "kubernetes-admin".into(),
            User::Node(n) => format!("system:node:{n}"),
        }
    }

    pub fn node(&self) -> Option<&str> {
        match self {
            User::Admin => None,
            User::Node(n) => Some(n),
        }
    }

    /// The bearer token that authenticates as this user.
    pub fn token(&self) -> String {
        match self {
            User::Admin => "admin".into(),
            User::Node(n) => format!("node:{n}"),
        }
    }
}

/// The user of an `Authorization` header; 401 for a missing or unknown token.
pub fn authenticate(header: Option<&str>) -> Result<User, Reply> {
    let token = header.and_then(|h| h.strip_prefix("Bearer ")).unwrap_or("");
    if token == "admin" {
        return Ok(User::Admin);
    }
    if let Some(n) = token.strip_prefix("node:").filter(|n| !n.is_empty()) {
        return Ok(User::Node(n.to_owned()));
    }
    Err(respond(
        401,
        &status_body(401, "Unauthorized", "Unauthorized", json!({})),
    ))
}

/// A request's authorization attributes (`authorizer.Attributes`).
#[derive(Debug, Clone, Default)]
pub struct Attrs {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub field_selector: Option<String>,
}

/// One term of the selector is `field=value` (`==` too); other terms, `!=` included, may
/// narrow it further (the Node authorizer checks for the one requirement it needs).
fn selects(sel: Option<&str>, field: &str, value: &str) -> bool {
    sel.is_some_and(|s| {
        s.split(',').any(|t| {
            !t.contains("!=")
                && t.split_once("==").or_else(|| t.split_once('=')) == Some((field, value))
        })
    })
}

/// The authorizer's 403: `{res} "{name}" is forbidden: User "{user}" cannot {verb} resource
/// "{resource}" in API group "{group}" in the namespace "{ns}"[: {reason}]`.
pub fn denied(user: &User, a: &Attrs, reason: &str) -> Reply {
    let res = qualified(&a.group, &a.resource);
    let subject = if a.name.is_empty() {
        res.clone()
    } else {
        format!("{res} \"{}\"", a.name)
    };
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    let mut message = format!(
        "{subject} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name(),
        a.verb,
        a.group
    );
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    let mut details = json!({"kind": a.resource});
    if !a.name.is_empty() {
        details["name"] = a.name.clone().into();
    }
    if !a.group.is_empty() {
        details["group"] = a.group.clone().into();
    }
    respond(403, &status_body(403, "Forbidden", &message, details))
}

/// Allows or refuses a request as the Node authorizer and RBAC would.
pub fn authorize(user: &User, a: &Attrs, store: &Store) -> Result<(), Reply> {
    let Some(node) = user.node() else {
        return Ok(());
    };
    let verb = a.verb.as_str();
    let deny = |reason: &str| Err(denied(user, a, reason));
    let sel = a.field_selector.as_deref();
    match (
        a.group.as_str(),
        a.resource.as_str(),
        a.subresource.as_str(),
    ) {
        ("", "pods", "" | "status") => match verb {
            "get" if store.pod_gets_forbidden => deny(""),
            "get" => {
                let bound = store
                    .pods
                    .get(&(a.namespace.clone(), a.name.clone()))
                    .is_some_and(|p| str_at(p, "/spec/nodeName") == node);
                if bound {
                    Ok(())
                } else {
                    deny(&format!(
                        "no relationship found between node '{node}' and this object"
                    ))
                }
            }
            "list" | "watch" if a.subresource.is_empty() => {
                if selects(sel, "spec.nodeName", node) {
                    Ok(())
                } else {
                    deny("can only list/watch pods with spec.nodeName field selector")
                }
            }
            "create" | "delete" if a.subresource.is_empty() => Ok(()),
            "update" | "patch" if a.subresource == "status" => Ok(()),
            _ => deny(""),
        },
        ("", "pods", "eviction") if verb == "create" => Ok(()),
        ("", "nodes", "" | "status") => match verb {
            "get" if a.name == node => Ok(()),
            "get" => deny(&format!(
                "node '{node}' cannot read '{}', only its own Node object",
                a.name
            )),
            "list" | "watch" if a.subresource.is_empty() => {
                if selects(sel, "metadata.name", node) {
                    Ok(())
                } else {
                    deny(&format!(
                        "node '{node}' cannot read all nodes, only its own Node object"
                    ))
                }
            }
            "create" | "update" | "patch" => Ok(()),
            _ => deny(""),
        },
        ("coordination.k8s.io", "leases", "") => {
            if a.namespace != "kube-node-lease" {
                return deny("can only access leases in the \"kube-node-lease\" system namespace");
            }
            match verb {
                "create" => Ok(()),
                "get" | "update" | "patch" | "delete" if a.name == node => Ok(()),
                "get" | "update" | "patch" | "delete" => {
                    deny("can only access node lease with the same name as the requesting node")
                }
                _ => deny("can only get, create, update, patch, or delete a node lease"),
            }
        }
        ("" | "events.k8s.io", "events", "") => match verb {
            "create" | "update" | "patch" => Ok(()),
            _ => deny(""),
        },
        ("authorization.k8s.io", "selfsubjectaccessreviews", "") if verb == "create" => Ok(()),
        _ => deny(""),
    }
}

/// `SelfSubjectAccessReview`: a node's review is answered by the Node authorizer's rules above
/// (as the real server does, measured in `tests/daemonset.rs`: a node's `list`/`watch` pods
/// review is allowed only with its `spec.nodeName` field selector, a `get` only with the name of
/// a pod bound to it); the field selector comes from `fieldSelector.rawSelector`. A verb and
/// resource a test denied ([`super::ApiServer::deny`]) is denied for anyone.
pub fn access_review(state: &super::store::State, req: &super::http::Req) -> Reply {
    let a = &req.body["spec"]["resourceAttributes"];
    let text = |k: &str| a[k].as_str().unwrap_or("").to_owned();
    let attrs = Attrs {
        verb: text("verb"),
        group: text("group"),
        resource: text("resource"),
        subresource: text("subresource"),
        namespace: text("namespace"),
        name: text("name"),
        field_selector: a["fieldSelector"]["rawSelector"]
            .as_str()
            .map(str::to_owned),
    };
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let st = state.lock();
    let denied = st
        .denied
        .iter()
        .any(|(v, r)| *v == attrs.verb && *r == resource);
    let by_node = authorize(&req.user, &attrs, &st).is_err();
    drop(st);
    let mut out = req.body.clone();
    out["status"] = if denied {
        json!({"allowed": false, "reason": "denied by the test server"})
    } else if by_node {
        json!({"allowed": false})
    } else {
        json!({"allowed": true})
    };
    respond(201, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert_eq!(authenticate(Some("Bearer admin")).unwrap(), User::Admin);
        assert_eq!(
            authenticate(Some("Bearer node:node-a")).unwrap(),
            User::Node("node-a".into())
        );
        assert_eq!(authenticate(Some("Bearer x")).unwrap_err().status(), 401);
        assert_eq!(authenticate(None).unwrap_err().status(), 401);
    }
}
