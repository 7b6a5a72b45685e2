//! Whose credentials the fleet's reaplets use (`--identity=`):
//!
//! * `node` (the default): each reaplet has its node's own client certificate, the same as its
//!   hollow kubelet's (`system:node:<node>`, group `system:nodes`). The Node authorizer lets it
//!   get its Lease but not list or watch it: reaplet reads the Lease on demand (from the watch
//!   cache, only while the kubelet's health endpoint fails), so beside a live kubelet it sends
//!   nothing.
//! * `service-account`: `deploy/rbac.yaml`'s objects created as an admin (ServiceAccount
//!   `kube-system/reaplet`, its ClusterRole, and the Role in `kube-node-lease` that may get,
//!   list and watch the node Leases), and one token of that account (a TokenRequest, as
//!   `kubectl create token reaplet` makes it; it carries no node, so each reaplet is told its
//!   node by `--hostname-override`) in one kubeconfig all reaplets share. reaplet then follows
//!   its Lease with one watch (`fieldSelector=metadata.name=<node>`): the watch path.
//!
//! Invariant: the shipped `deploy/rbac.yaml` is what is applied, unchanged (no rule of the
//! bench's own).

use super::R;
use super::k8s::Cluster;
use serde_json::{Value, json};
use std::path::PathBuf;

/// The reaplets' identity.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Identity {
    Node,
    ServiceAccount,
}

impl Identity {
    pub fn parse(v: &str) -> R<Identity> {
        match v {
            "node" => Ok(Identity::Node),
            "service-account" => Ok(Identity::ServiceAccount),
            _ => Err(format!(
                "--identity: {v:?} is neither node nor service-account"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Identity::Node => "node",
            Identity::ServiceAccount => "service-account",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Identity::Node => {
                "the node's own (system:node:<node>: may get its Lease, not watch it)"
            }
            Identity::ServiceAccount => {
                "the service account of deploy/rbac.yaml (kube-system/reaplet: may list and \
                 watch the node Leases)"
            }
        }
    }
}

/// The API path that creates `v` (one object of `deploy/rbac.yaml`).
fn create_path(v: &Value) -> R<String> {
    let ns = v["metadata"]["namespace"].as_str();
    let kind = v["kind"].as_str().unwrap_or("");
    Ok(match (kind, ns) {
        ("ServiceAccount", Some(ns)) => format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        ("ClusterRole", None) => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
        ("ClusterRoleBinding", None) => {
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into()
        }
        ("Role", Some(ns)) => format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
        ("RoleBinding", Some(ns)) => {
            format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings")
        }
        _ => {
            return Err(format!(
                "deploy/rbac.yaml: unexpected {kind} (namespace {ns:?})"
            ));
        }
    })
}

/// Creates `deploy/rbac.yaml`'s objects and returns a kubeconfig with a token of its service
/// account, valid for `valid_secs`.
pub async fn service_account_kubeconfig(cluster: &Cluster, valid_secs: u64) -> R<PathBuf> {
    let path = super::repo().join("deploy/rbac.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| format!("deploy/rbac.yaml does not parse: {e}"))?;
    for v in docs.into_iter().filter(|v| !v.is_null()) {
        let p = create_path(&v)?;
        let (code, body) = cluster.raw("POST", &p, None, Some(&v)).await;
        if code != 201 {
            return Err(format!("POST {p}: {code} {body}"));
        }
    }
    let p = "/api/v1/namespaces/kube-system/serviceaccounts/reaplet/token";
    let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": valid_secs}});
    let (code, body) = cluster.raw("POST", p, None, Some(&req)).await;
    let token = match (code, body["status"]["token"].as_str()) {
        (201, Some(t)) => t.to_owned(),
        _ => return Err(format!("POST {p}: {code} {body}")),
    };
    let kc = cluster.dir.path().join("reaplet-sa.kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fleet\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: reaplet\n  user:\n    token: {token}\ncontexts:\n- name: fleet\n  context: {{cluster: fleet, user: reaplet}}\ncurrent-context: fleet\n",
            cluster.url(),
            cluster.pki.ca.display()
        ),
    )
    .map_err(|e| format!("{}: {e}", kc.display()))?;
    Ok(kc)
}
