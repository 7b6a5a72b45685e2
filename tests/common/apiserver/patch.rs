//! The three patch types kube-apiserver takes on update (fact 4.1): JSON merge patch
//! (RFC 7386: lists are replaced whole, fact 4.9), strategic merge patch (lists with a merge
//! key merge by it: conditions by `type`, container statuses by `name`, fact 4.9, in
//! apimachinery's order: the patch's items first where the server had no opinion) and JSON
//! patch (RFC 6902). Any other content type on PATCH is 415 (fact 11.6).

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies `patch` of type `t` to `target`; `Err` carries a message for a 400/422.
pub fn apply(t: PatchType, target: &mut Value, patch: &Value) -> Result<(), String> {
    match t {
        PatchType::Merge => {
            merge_patch(target, patch);
            Ok(())
        }
        // server-side apply is approximated by a strategic merge of the applied fields
        PatchType::Strategic | PatchType::Apply => {
            strategic_merge(target, patch);
            Ok(())
        }
        PatchType::Json => json_patch(target, patch),
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "containers"
        | "initContainers" => Some("name"),
        "podIPs" | "hostIPs" => Some("ip"),
        "addresses" => Some("type"),
        "taints" => Some("key"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Strategic merge patch with the pod and node merge keys (`$patch`/`$retainKeys` directives
/// are not implemented: nothing reaplet sends uses them).
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (merge_key(k), v, t.get_mut(k)) {
            (Some(key), Value::Array(items), Some(Value::Array(existing))) => {
                let server_order: Vec<Value> = existing.iter().map(|e| e[key].clone()).collect();
                for item in items {
                    let id = &item[key];
                    match existing.iter_mut().find(|e| &e[key] == id) {
                        Some(e) => strategic_merge(e, item),
                        None => existing.push(item.clone()),
                    }
                }
                let patch_order: Vec<&Value> = items.iter().map(|i| &i[key]).collect();
                *existing = element_order(existing, &patch_order, &server_order, key);
            }
            (_, Value::Object(_), Some(existing @ Value::Object(_))) => {
                strategic_merge(existing, v)
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `normalizeElementOrder`: the merged list's items the patch names, in the patch's order,
/// interleaved with the server's other items, in the server's order: a server item goes
/// before a patch item only when both were on the server and it came first there. So an item
/// the patch adds comes before the server's own (measured: a strategic patch adding a
/// condition to `[Ready]` gives `[added, Ready]`).
fn element_order(
    merged: &[Value],
    patch_order: &[&Value],
    server_order: &[Value],
    key: &str,
) -> Vec<Value> {
    let at = |order: &[&Value], item: &Value| order.iter().position(|k| **k == item[key]);
    let server_at = |item: &Value| server_order.iter().position(|k| *k == item[key]);
    let (mut patched, server_only): (Vec<Value>, Vec<Value>) = merged
        .iter()
        .cloned()
        .partition(|i| at(patch_order, i).is_some());
    patched.sort_by_key(|i| at(patch_order, i));
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patched.into_iter().peekable(),
    );
    let mut out = Vec::with_capacity(merged.len());
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return out,
            (Some(l), Some(r)) => {
                matches!((server_at(l), server_at(r)), (Some(a), Some(b)) if a < b)
            }
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `test`, `copy`, `move`.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch
        .as_array()
        .ok_or("the JSON patch is not a list of operations")?;
    for op in ops {
        let path = op["path"].as_str().ok_or("an operation without a path")?;
        match op["op"].as_str().unwrap_or("") {
            "add" => put(target, path, op["value"].clone(), true)?,
            "replace" => put(target, path, op["value"].clone(), false)?,
            "remove" => {
                take(target, path)?;
            }
            "test" => {
                if target.pointer(path) != Some(&op["value"]) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            "copy" | "move" => {
                let from = op["from"].as_str().ok_or("an operation without from")?;
                let v = if op["op"] == "move" {
                    take(target, from)?
                } else {
                    target
                        .pointer(from)
                        .cloned()
                        .ok_or_else(|| format!("missing value at {from}"))?
                };
                put(target, path, v, true)?;
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(())
}

fn split(path: &str) -> Result<(String, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| format!("bad path {path:?}"))?;
    Ok((parent.to_owned(), unescape(last)))
}

fn put(target: &mut Value, path: &str, v: Value, add: bool) -> Result<(), String> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    let p = target
        .pointer_mut(&parent)
        .ok_or_else(|| format!("missing path {parent:?}"))?;
    match p {
        Value::Object(m) => {
            if !add && !m.contains_key(&last) {
                return Err(format!(
                    "replace operation does not apply: doc is missing key: {path}"
                ));
            }
            m.insert(last, v);
        }
        Value::Array(a) => {
            if last == "-" {
                a.push(v);
            } else {
                let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
                if add && i <= a.len() {
                    a.insert(i, v);
                } else if !add && i < a.len() {
                    a[i] = v;
                } else {
                    return Err(format!("index {i} out of range"));
                }
            }
        }
        _ => return Err(format!("{parent:?} is not a container")),
    }
    Ok(())
}

fn take(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split(path)?;
    let p = target
        .pointer_mut(&parent)
        .ok_or_else(|| format!("missing path {parent:?}"))?;
    match p {
        Value::Object(m) => m
            .remove(&last)
            .ok_or_else(|| format!("remove operation does not apply: doc is missing key: {path}")),
        Value::Array(a) => {
            let i: usize = last.parse().map_err(|_| format!("bad index {last:?}"))?;
            (i < a.len())
                .then(|| a.remove(i))
                .ok_or_else(|| format!("index {i} out of range"))
        }
        _ => Err(format!("{parent:?} is not a container")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_merge_keys() {
        let mut st = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                            "containerStatuses": [{"name": "a", "image": "busybox", "ready": true}]});
        strategic_merge(
            &mut st,
            &json!({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}, {"type": "DisruptionTarget", "status": "True"}],
                                         "containerStatuses": [{"name": "a", "ready": false}]}),
        );
        assert_eq!(st["phase"], "Failed");
        assert_eq!(st["conditions"].as_array().unwrap().len(), 3);
        assert_eq!(st["conditions"][0]["status"], "False");
        assert_eq!(st["containerStatuses"][0]["image"], "busybox");
        assert_eq!(st["containerStatuses"][0]["ready"], false);
    }

    #[test]
    fn strategic_merge_orders_patch_items_before_new_server_ones() {
        let conds = |v: &Value| -> Vec<String> {
            v["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap().to_owned())
                .collect()
        };
        let c = |t: &str| json!({"type": t, "status": "True"});
        // an added item goes first; items both have keep the server's order
        let mut st = json!({"conditions": [c("Ready")]});
        strategic_merge(&mut st, &json!({"conditions": [c("X")]}));
        assert_eq!(conds(&st), ["X", "Ready"]);
        let mut st = json!({"conditions": [c("A"), c("B"), c("C")]});
        strategic_merge(&mut st, &json!({"conditions": [c("C"), c("N"), c("A")]}));
        assert_eq!(conds(&st), ["B", "C", "N", "A"]);
    }

    #[test]
    fn json_patch_ops() {
        let mut v = json!({"status": {"phase": "Running", "conditions": []}});
        json_patch(
            &mut v,
            &json!([{"op": "replace", "path": "/status/phase", "value": "Failed"},
                    {"op": "add", "path": "/status/conditions/-", "value": {"type": "X"}}]),
        )
        .unwrap();
        assert_eq!(v["status"]["phase"], "Failed");
        assert_eq!(v["status"]["conditions"][0]["type"], "X");
        assert!(
            json_patch(
                &mut v,
                &json!([{"op": "replace", "path": "/status/nope", "value": 1}])
            )
            .is_err()
        );
    }
}
