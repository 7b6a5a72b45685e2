//! The API permissions `reaplet run` uses, per configured mode, and their review by
//! `reaplet check` (SelfSubjectAccessReviews). Counterpart: the kubelet's `system:node`
//! permissions as the Node authorizer grants them (`plugin/pkg/auth/authorizer/node`); a
//! ServiceAccount gets the same list from `deploy/rbac.yaml` or the Helm chart.
//!
//! Invariants:
//! * [`needed`] is exactly what the code sends for the configured modes, no more: a verb a
//!   mode never uses is never asked for, so an identity without it passes;
//! * every review is asked as the request is sent: a list or watch of pods with the node's
//!   `spec.nodeName` field selector, this node's Node and Lease by name (or by a
//!   `metadata.name` field selector and that name for a list/watch, as the server derives it),
//!   a GET of a pod naming one bound here;
//! * a denied need fails the line and names the verb, the resource and what needs it.

use super::{Line, Outcome, line};
use crate::config::Settings;
use crate::standby::AuthoritySetting;
use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, ResourceAttributes, SelfSubjectAccessReview,
    SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;

/// What a request names, so that its review is asked the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// No namespace, no name.
    Any,
    /// This node's pods: a field selector `spec.nodeName=<node>`.
    NodePods,
    /// One pod bound to this node, by namespace and name.
    PodOnNode,
    /// This node's Node object by name.
    OwnNode,
    /// This node's Node object by a `metadata.name=<node>` field selector (list, watch).
    OwnNodeSelected,
    /// This node's Lease in `kube-node-lease` by name.
    OwnLease,
    /// This node's Lease by a `metadata.name=<node>` field selector (list, watch).
    OwnLeaseSelected,
}

/// One permission: a verb on a resource, and what in reaplet needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub verb: &'static str,
    /// The API group (`""`: core).
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    pub target: Target,
    /// The mode or feature that uses it.
    pub used_by: &'static str,
    /// What reaplet does without it (`None`: it is required; a denial fails the check).
    pub fallback: Option<&'static str>,
}

impl Need {
    /// `verb resource[/subresource]`, with the group when it is not core.
    pub fn name(&self) -> String {
        let mut r = self.resource.to_owned();
        if !self.group.is_empty() {
            r = format!("{r}.{}", self.group);
        }
        if !self.subresource.is_empty() {
            r = format!("{r}/{}", self.subresource);
        }
        format!("{} {r}", self.verb)
    }
}

const fn need(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    target: Target,
    used_by: &'static str,
) -> Need {
    Need {
        verb,
        group,
        resource,
        subresource,
        target,
        used_by,
        fallback: None,
    }
}

/// The namespace of node Leases.
const LEASES: &str = crate::standby::LEASE_NAMESPACE;

/// Every mode: the pod source (list and watch this node's pods), a pod's read before a
/// `DisruptionTarget` status, the terminal status, the final delete, the events.
const PODS: &[Need] = &[
    need("list", "", "pods", "", Target::NodePods, "pods"),
    need("watch", "", "pods", "", Target::NodePods, "pods"),
    need("get", "", "pods", "", Target::PodOnNode, "pods"),
    need("delete", "", "pods", "", Target::Any, "pods"),
    need("patch", "", "pods", "status", Target::Any, "pods"),
    need("create", "", "events", "", Target::Any, "pods"),
];
/// Without the Lease watch: reads on demand (`standby::lease`; a node identity may not watch).
const ON_DEMAND: Option<&str> = Some("the Lease is read on demand, not watched");
/// `--authority standby` or `auto`: the kubelet's Lease, watched where the identity may (a list
/// and watches on that one object), else read; this node's Node, read before acting (at start
/// when the Lease is missing, and in every takeover's proof).
const STANDBY: &[Need] = &[
    need("get", "", "nodes", "", Target::OwnNode, "standby"),
    need(
        "get",
        COORDINATION,
        "leases",
        "",
        Target::OwnLease,
        "standby",
    ),
    Need {
        fallback: ON_DEMAND,
        ..need(
            "list",
            COORDINATION,
            "leases",
            "",
            Target::OwnLeaseSelected,
            "standby",
        )
    },
    Need {
        fallback: ON_DEMAND,
        ..need(
            "watch",
            COORDINATION,
            "leases",
            "",
            Target::OwnLeaseSelected,
            "standby",
        )
    },
];
const COORDINATION: &str = "coordination.k8s.io";
/// Either eviction source: the watch on this node's Node object.
const NODE_WATCH: &[Need] = &[
    need(
        "list",
        "",
        "nodes",
        "",
        Target::OwnNodeSelected,
        "evictions",
    ),
    need(
        "watch",
        "",
        "nodes",
        "",
        Target::OwnNodeSelected,
        "evictions",
    ),
];
/// `--enforce-node-affinity` (not a dry run): the Eviction API.
const AFFINITY: &[Need] = &[need(
    "create",
    "",
    "pods",
    "eviction",
    Target::Any,
    "node affinity",
)];
/// Graceful node shutdown configured: the node's `Ready` condition, read then patched.
const SHUTDOWN: &[Need] = &[
    need("get", "", "nodes", "", Target::OwnNode, "node shutdown"),
    need(
        "patch",
        "",
        "nodes",
        "status",
        Target::OwnNode,
        "node shutdown",
    ),
];

/// What `reaplet run` with these settings sends to the API server (see the module's
/// invariants); the taint manager's writes (the `DisruptionTarget` status, the delete, the
/// event) are among the pods' own.
pub fn needed(s: &Settings) -> Vec<Need> {
    let mut out = PODS.to_vec();
    if s.authority != AuthoritySetting::Primary {
        out.extend_from_slice(STANDBY);
    }
    let affinity = s.enforce_node_affinity;
    if s.taint_manager() || affinity {
        out.extend_from_slice(NODE_WATCH);
    }
    if affinity && !s.eviction_dry_run {
        out.extend_from_slice(AFFINITY);
    }
    if !crate::shutdown::groups(&s.shutdown).is_empty() {
        out.extend_from_slice(SHUTDOWN);
    }
    // one line per permission: standby and node shutdown both read the Node (the first keeps it)
    let mut seen = std::collections::HashSet::new();
    out.retain(|n| seen.insert(n.name()));
    out
}

/// The review of `n` for node `node`; `None` when it names a pod and there is none here.
fn review(n: &Need, node: &str, sample: Option<&(String, String)>) -> Option<ResourceAttributes> {
    let field = |raw: String| FieldSelectorAttributes {
        raw_selector: Some(raw),
        requirements: None,
    };
    let mut a = ResourceAttributes {
        verb: Some(n.verb.into()),
        group: (!n.group.is_empty()).then(|| n.group.into()),
        resource: Some(n.resource.into()),
        subresource: (!n.subresource.is_empty()).then(|| n.subresource.into()),
        ..ResourceAttributes::default()
    };
    match n.target {
        Target::Any => {}
        Target::NodePods => a.field_selector = Some(field(format!("spec.nodeName={node}"))),
        Target::PodOnNode => {
            let (ns, name) = sample?;
            a.namespace = Some(ns.clone());
            a.name = Some(name.clone());
        }
        Target::OwnNode => a.name = Some(node.into()),
        // the server takes a list's or watch's name from its `metadata.name` field selector
        // (its request info), and authorizers see it as the name: the review names it too
        Target::OwnNodeSelected => {
            a.name = Some(node.into());
            a.field_selector = Some(field(format!("metadata.name={node}")));
        }
        Target::OwnLease => {
            a.namespace = Some(LEASES.into());
            a.name = Some(node.into());
        }
        Target::OwnLeaseSelected => {
            a.namespace = Some(LEASES.into());
            a.name = Some(node.into());
            a.field_selector = Some(field(format!("metadata.name={node}")));
        }
    }
    Some(a)
}

/// The modes the list serves, in order, once each.
fn uses(needs: &[Need]) -> String {
    let mut v: Vec<&str> = Vec::new();
    for n in needs {
        if !v.contains(&n.used_by) {
            v.push(n.used_by);
        }
    }
    v.join(", ")
}

/// The `kubeconfig` line: the server reachable, and every need permitted.
pub async fn check(cfg: kube::Config, node: &str, needs: &[Need]) -> Line {
    let url = cfg.cluster_url.to_string();
    let client = match crate::api::client::client(cfg) {
        Ok(c) => c,
        Err(e) => return line("kubeconfig", Outcome::Fail, format!("{url}: {e}")),
    };
    // a node may GET only pods bound to it: the review names one of this node's pods
    let on_node = format!("spec.nodeName={node}");
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client.clone());
    let sample = match pods
        .list(&kube::api::ListParams::default().fields(&on_node).limit(1))
        .await
    {
        Ok(l) => l.items.into_iter().next().map(|p| {
            (
                p.metadata.namespace.unwrap_or_default(),
                p.metadata.name.unwrap_or_default(),
            )
        }),
        Err(e) => {
            return line(
                "kubeconfig",
                Outcome::Fail,
                format!("{url}: listing this node's pods ({on_node}): {e}"),
            );
        }
    };
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client);
    let (mut denied, mut unasked) = (Vec::new(), Vec::new());
    // optional needs refused: (what, what reaplet does instead)
    let mut without: Vec<(String, &str)> = Vec::new();
    for n in needs {
        let Some(attrs) = review(n, node, sample.as_ref()) else {
            unasked.push(n.name());
            continue;
        };
        let r = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(attrs),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        match api.create(&PostParams::default(), &r).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => match n.fallback {
                Some(instead) => without.push((n.name(), instead)),
                None => denied.push(format!("{} (for {})", n.name(), n.used_by)),
            },
            Err(e) => return line("kubeconfig", Outcome::Fail, format!("{url}: {e}")),
        }
    }
    let total = needs.iter().filter(|n| n.fallback.is_none()).count();
    let modes = uses(needs);
    // the optional ones refused, grouped by what reaplet does instead
    let mut instead = String::new();
    for (i, (_, then)) in without.iter().enumerate() {
        if without[..i].iter().any(|(_, t)| t == then) {
            continue;
        }
        let what: Vec<&str> = without
            .iter()
            .filter(|(_, t)| t == then)
            .map(|(w, _)| w.as_str())
            .collect();
        instead.push_str(&format!("; not permitted to {}: {then}", what.join(", ")));
    }
    if !denied.is_empty() {
        return line(
            "kubeconfig",
            Outcome::Fail,
            format!("{url}: not permitted: {}", denied.join(", ")),
        );
    }
    if !unasked.is_empty() {
        return line(
            "kubeconfig",
            Outcome::Warn,
            format!(
                "{url}: permitted to {} of {total} needed verbs (node {node}; for {modes}); not \
                 asked: {} (no pod on this node to name){instead}",
                total - unasked.len(),
                unasked.join(", ")
            ),
        );
    }
    line(
        "kubeconfig",
        Outcome::Pass,
        format!("{url}: permitted to {total} needed verbs (node {node}; for {modes}){instead}"),
    )
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
