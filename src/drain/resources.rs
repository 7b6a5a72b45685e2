//! The scheduler's view of a resource list (`framework.Resource`, `Resource.Add` in
//! `pkg/scheduler/framework/types.go`) and which names it reads (`IsScalarResourceName`).
//!
//! Invariants: CPU is read with `MilliValue`, everything else with `Value` (both round up);
//! a name the scheduler does not read is ignored; sums wrap as Go's int64 additions do.

use super::quantity::ResourceList;
use std::collections::BTreeMap;

/// `IsScalarResourceName`: extended resources (a domain-prefixed name outside
/// `kubernetes.io/`), `hugepages-*`, names containing `kubernetes.io/` and
/// `attachable-volumes-*`.
pub fn is_scalar_resource_name(name: &str) -> bool {
    let prefixed_native = name.contains("kubernetes.io/");
    let native = !name.contains('/') || prefixed_native;
    let extended =
        !native && !name.starts_with("requests.") && is_qualified_name(&format!("requests.{name}"));
    extended
        || name.starts_with("hugepages-")
        || prefixed_native
        || name.starts_with("attachable-volumes-")
}

/// `validation.IsQualifiedName`: `[prefix/]name`, the prefix a DNS subdomain, the name 1–63
/// characters of `[A-Za-z0-9_.-]` starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if name.contains('/') {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && alnum(name.as_bytes()[0])
        && alnum(name.as_bytes()[name.len() - 1])
        && name
            .bytes()
            .all(|c| alnum(c) || c == b'-' || c == b'_' || c == b'.');
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                let l = label.as_bytes();
                !l.is_empty()
                    && l.iter()
                        .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && l[0] != b'-'
                    && l[l.len() - 1] != b'-'
            })
    });
    name_ok && prefix_ok
}

/// What the scheduler reads of a resource list (`framework.Resource`): CPU in millicores
/// (`MilliValue`), memory, ephemeral storage, pods and scalar resources in whole units
/// (`Value`); other names ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// Allocatable: how many pods (`AllowedPodNumber`); a request: unused.
    pub pods: i64,
    pub scalar: BTreeMap<String, i64>,
}

impl Resources {
    /// `Resource.Add` of `list` into nothing.
    pub fn from_list(list: &ResourceList) -> Resources {
        let mut r = Resources::default();
        for (name, q) in list {
            match name.as_str() {
                "cpu" => r.milli_cpu = r.milli_cpu.wrapping_add(q.milli_value()),
                "memory" => r.memory = r.memory.wrapping_add(q.value()),
                "pods" => r.pods = r.pods.wrapping_add(q.value()),
                "ephemeral-storage" => {
                    r.ephemeral_storage = r.ephemeral_storage.wrapping_add(q.value())
                }
                n if is_scalar_resource_name(n) => {
                    let e = r.scalar.entry(n.to_string()).or_default();
                    *e = e.wrapping_add(q.value());
                }
                _ => {}
            }
        }
        r
    }

    /// The sum (Go's int64 addition, wrapping).
    pub fn plus(&self, o: &Resources) -> Resources {
        let mut scalar = self.scalar.clone();
        for (k, v) in &o.scalar {
            let e = scalar.entry(k.clone()).or_default();
            *e = e.wrapping_add(*v);
        }
        Resources {
            milli_cpu: self.milli_cpu.wrapping_add(o.milli_cpu),
            memory: self.memory.wrapping_add(o.memory),
            ephemeral_storage: self.ephemeral_storage.wrapping_add(o.ephemeral_storage),
            pods: self.pods.wrapping_add(o.pods),
            scalar,
        }
    }

    /// Requests nothing `fitsRequest` checks beyond the pod count.
    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.scalar.is_empty()
    }

    /// As `name: amount` pairs for messages and JSON (CPU as `<n>m`), what is set only.
    pub fn named(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        if self.milli_cpu != 0 {
            v.push(("cpu".to_string(), format!("{}m", self.milli_cpu)));
        }
        for (n, x) in [
            ("memory", self.memory),
            ("ephemeral-storage", self.ephemeral_storage),
        ] {
            if x != 0 {
                v.push((n.to_string(), x.to_string()));
            }
        }
        for (n, x) in &self.scalar {
            v.push((n.clone(), x.to_string()));
        }
        v
    }
}
