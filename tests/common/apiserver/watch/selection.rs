//! Field selectors: the fields each resource indexes, `=`/`==`/`!=` terms, and what a
//! request selects (namespace and fields).

use super::super::store::{Kind, str_at};
use serde_json::{Value, json};

/// The value of a selectable field, `None` if the resource does not index it.
fn field_value(kind: Kind, o: &Value, field: &str) -> Option<String> {
    let s = |p: &str| str_at(o, p).to_owned();
    let b = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string()
    };
    Some(match (kind, field) {
        (_, "metadata.name") => s("/metadata/name"),
        (Kind::Pod | Kind::Lease | Kind::Pdb, "metadata.namespace") => s("/metadata/namespace"),
        (Kind::Pod, "spec.nodeName") => s("/spec/nodeName"),
        (Kind::Pod, "spec.restartPolicy") => s("/spec/restartPolicy"),
        (Kind::Pod, "spec.schedulerName") => s("/spec/schedulerName"),
        (Kind::Pod, "spec.serviceAccountName") => s("/spec/serviceAccountName"),
        (Kind::Pod, "spec.hostNetwork") => b("/spec/hostNetwork"),
        (Kind::Pod, "status.phase") => s("/status/phase"),
        (Kind::Pod, "status.nominatedNodeName") => s("/status/nominatedNodeName"),
        (Kind::Pod, "status.podIP") => o
            .pointer("/status/podIPs/0/ip")
            .and_then(Value::as_str)
            .unwrap_or(str_at(o, "/status/podIP"))
            .to_owned(),
        (Kind::Node, "spec.unschedulable") => b("/spec/unschedulable"),
        _ => return None,
    })
}

/// A field selector term: (field, equal (`=`/`==`) or not (`!=`), value).
pub(super) type Term = (String, bool, String);

pub(super) fn parse_fields(kind: Kind, sel: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for part in sel.split(',').filter(|p| !p.is_empty()) {
        let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            (k, true, v)
        } else {
            return Err(format!(
                "invalid selector: '{sel}'; can't understand '{part}'"
            ));
        };
        if field_value(kind, &json!({}), k).is_none() {
            return Err(format!("field label not supported: {k}"));
        }
        terms.push((k.to_owned(), eq, v.to_owned()));
    }
    Ok(terms)
}

/// What a request selects: namespace and fields.
pub(super) struct Selection {
    pub(super) kind: Kind,
    pub(super) ns: Option<String>,
    pub(super) fields: Vec<Term>,
}

impl Selection {
    pub(super) fn matches(&self, o: &Value) -> bool {
        self.ns
            .as_deref()
            .is_none_or(|n| str_at(o, "/metadata/namespace") == n)
            && self.fields.iter().all(|(k, eq, v)| {
                (field_value(self.kind, o, k).as_deref() == Some(v.as_str())) == *eq
            })
    }
}
