//! `reaplet check`'s `node name` line: the name reaplet acts for, where it came from
//! ([`crate::config::identity`]), and whether a kubelet is registered under it: its Node
//! object and its Lease (`kube-node-lease/<name>`) must both exist. No kubelet counterpart (the
//! kubelet registers the Node itself); what `reaplet run` would otherwise get wrong beside a
//! kubelet registered under another name than the host's.
//!
//! Invariants:
//! * two reads (the Node, the Lease), each bounded by [`crate::api::REQUEST_TIMEOUT`]; nothing
//!   is written;
//! * the line fails when the Node does not exist, or exists with no Lease; a read the identity
//!   may not make, or that gets no answer, is a warning naming it (the `kubeconfig` line says
//!   what the identity lacks).

use super::{Line, Outcome, line};
use crate::config::Settings;
use crate::config::identity::NameFrom;

pub const CHECK: &str = "node name";

/// What one read found.
#[derive(Debug)]
pub enum Found {
    Present,
    Missing,
    /// Refused or unanswered.
    Unknown(crate::api::RequestError),
}

impl Found {
    fn of<T>(r: Result<Option<T>, crate::api::RequestError>) -> Self {
        match r {
            Ok(Some(_)) => Found::Present,
            Ok(None) => Found::Missing,
            Err(e) => Found::Unknown(e),
        }
    }
}

/// What the API holds under the node's name.
#[derive(Debug)]
pub struct Registration {
    pub node: Found,
    pub lease: Found,
}

/// Reads the Node and the Lease named `node`, at once, as standby's start reads them (the
/// Node's metadata only, never its status and image list).
pub async fn registration(client: &kube::Client, node: &str) -> Registration {
    let leases = crate::standby::lease::LeaseApi::new(client.clone(), node);
    let nodes = crate::standby::NodeApi::new(client.clone(), node);
    let (n, l) = tokio::join!(nodes.exists_latest(), leases.read_latest());
    Registration {
        node: Found::of(n.map(|exists| exists.then_some(()))),
        lease: Found::of(l),
    }
}

/// The line: the name, where it came from, and what the API holds under it (`None`: no API
/// client, static manifests only).
pub fn judge(
    settings: &Settings,
    node: &str,
    from: NameFrom,
    registration: Option<&Registration>,
) -> Line {
    let detail = settings
        .node_from_credentials
        .name
        .as_ref()
        .map_or(String::new(), |c| format!(": {c}"));
    let mut named = format!("{node} (from the {}{detail})", from.as_str());
    if let Some(note) = &settings.node_from_credentials.problem {
        named.push_str(&format!("; not read from the credentials: {note}"));
    }
    let Some(r) = registration else {
        return line(CHECK, Outcome::Pass, format!("{named}; no API"));
    };
    let lease = format!("{}/{node}", crate::standby::LEASE_NAMESPACE);
    match (&r.node, &r.lease) {
        (Found::Missing, _) => line(
            CHECK,
            Outcome::Fail,
            format!(
                "{named}: no Node {node} in the API: the kubelet is registered under another \
                 name, or not at all; give its name (the node's own kubeconfig, or \
                 --hostname-override)"
            ),
        ),
        (Found::Present, Found::Missing) => line(
            CHECK,
            Outcome::Fail,
            format!(
                "{named}: Node {node} exists but no Lease {lease}: no kubelet renews it under \
                 this name (registered under another name, or not registered)"
            ),
        ),
        (Found::Present, Found::Present) => line(
            CHECK,
            Outcome::Pass,
            format!("{named}: Node and Lease {lease} present"),
        ),
        (Found::Unknown(why), _) => line(
            CHECK,
            Outcome::Warn,
            format!("{named}: the Node could not be read: {why}"),
        ),
        (Found::Present, Found::Unknown(why)) => line(
            CHECK,
            Outcome::Warn,
            format!("{named}: Node present; the Lease could not be read: {why}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::identity::{CredentialsName, Found as Creds};

    fn settings() -> Settings {
        crate::config::resolve(Default::default()).unwrap()
    }

    #[test]
    fn the_line_names_the_source_and_fails_without_node_or_lease() {
        let mut s = settings();
        s.node_from_credentials = Creds {
            name: Some(CredentialsName {
                name: "foo".into(),
                from: NameFrom::Certificate,
                detail: "CN=system:node:foo of client-certificate-data".into(),
            }),
            problem: None,
        };
        let reg = |node, lease| Registration { node, lease };
        let l = judge(
            &s,
            "foo",
            NameFrom::Certificate,
            Some(&reg(Found::Present, Found::Present)),
        );
        assert_eq!(l.outcome, Outcome::Pass);
        assert_eq!(
            l.detail,
            "foo (from the credentials certificate: CN=system:node:foo of \
             client-certificate-data): Node and Lease kube-node-lease/foo present"
        );
        let l = judge(
            &s,
            "foo",
            NameFrom::Certificate,
            Some(&reg(Found::Missing, Found::Missing)),
        );
        assert_eq!(l.outcome, Outcome::Fail);
        assert!(l.detail.contains("no Node foo in the API"), "{}", l.detail);
        let l = judge(
            &s,
            "foo",
            NameFrom::Certificate,
            Some(&reg(Found::Present, Found::Missing)),
        );
        assert_eq!(l.outcome, Outcome::Fail);
        assert!(
            l.detail.contains("exists but no Lease kube-node-lease/foo"),
            "{}",
            l.detail
        );
        let l = judge(
            &s,
            "foo",
            NameFrom::Certificate,
            Some(&reg(
                Found::Unknown(crate::api::RequestError::Timeout(
                    std::time::Duration::from_secs(30),
                )),
                Found::Missing,
            )),
        );
        assert_eq!(l.outcome, Outcome::Warn);
        let plain = settings();
        let l = judge(&plain, "vm", NameFrom::HostName, None);
        assert_eq!(
            (l.outcome, l.detail.as_str()),
            (Outcome::Pass, "vm (from the host name); no API")
        );
    }
}
