//! Equality-based label selectors, as `kubectl -l` reads them (`k=v`, `k==v`, `k!=v`, `k`,
//! `!k`, joined by commas; `apimachinery/pkg/labels.Parse` without the set forms).

use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid label selector {selector:?}: {why}")]
pub struct SelectorError {
    pub selector: String,
    pub why: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector; the empty one selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let err = |why: &str| SelectorError {
            selector: s.to_owned(),
            why: why.to_owned(),
        };
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Req::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some(k) = part.strip_prefix('!') {
                Req::DoesNotExist(k.trim().to_owned())
            } else {
                Req::Exists(part.to_owned())
            };
            let (key, value) = match &req {
                Req::Equals(k, v) | Req::NotEquals(k, v) => (k, Some(v)),
                Req::Exists(k) | Req::DoesNotExist(k) => (k, None),
            };
            if !valid_key(key) {
                return Err(err(&format!("bad key {key:?}")));
            }
            if value.is_some_and(|v| !valid_value(v)) {
                return Err(err(&format!("bad value for {key:?}")));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Equals(k, v) => labels.get(k) == Some(v),
            Req::NotEquals(k, v) => labels.get(k) != Some(v),
            Req::Exists(k) => labels.contains_key(k),
            Req::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}
