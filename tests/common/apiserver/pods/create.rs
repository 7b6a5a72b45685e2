//! Pod create: the API's defaults (fact 11.4), the Node's topology labels (11.5), server
//! fields (uid, generation 1, creationTimestamp, status reset but for a `qosClass` sent: 5.5,
//! 5.8) and NodeRestriction's mirror-pod rules for a node (5.2–5.4).

use super::*;

fn qos_class(pod: &Value) -> &'static str {
    let containers = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let res = |c: &Value, k: &str| c["resources"][k].as_object().cloned().unwrap_or_default();
    let any = containers
        .iter()
        .any(|c| !res(c, "requests").is_empty() || !res(c, "limits").is_empty());
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let limits = res(c, "limits");
        let requests = res(c, "requests");
        ["cpu", "memory"].iter().all(|r| {
            limits.get(*r).is_some() && requests.get(*r).is_none_or(|q| Some(q) == limits.get(*r))
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The defaults and admission plugins a created pod goes through (fact 11.4, 11.5).
fn apply_defaults(s: &Store, pod: &mut Value) {
    let spec = &mut pod["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("securityContext", json!({})),
        ("terminationGracePeriodSeconds", json!(30)),
    ];
    for (k, v) in defaults {
        if spec[k].is_null() {
            spec[k] = v;
        }
    }
    for list in ["initContainers", "containers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                if c["imagePullPolicy"].is_null() {
                    let image = c["image"].as_str().unwrap_or("");
                    let tag = image.rsplit('/').next().unwrap_or("");
                    let pinned = image.contains('@')
                        || tag.split_once(':').is_some_and(|(_, t)| t != "latest");
                    c["imagePullPolicy"] = if pinned { "IfNotPresent" } else { "Always" }.into();
                }
                if c["terminationMessagePath"].is_null() {
                    c["terminationMessagePath"] = "/dev/termination-log".into();
                }
                if c["terminationMessagePolicy"].is_null() {
                    c["terminationMessagePolicy"] = "File".into();
                }
            }
        }
    }
    // DefaultTolerationSeconds: a NoExecute toleration of 300 s for each, unless one is there
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = tolerations.iter().any(|t| {
            let key_ok = t["key"] == key || (t["key"].is_null() && t["operator"] == "Exists");
            let effect_ok =
                t["effect"].is_null() || t["effect"] == "" || t["effect"] == "NoExecute";
            key_ok && effect_ok
        });
        if !tolerated {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(tolerations);
    // PodTopologyLabels: a bound pod gets its Node's zone and region, overwriting its own
    let node = str_at(pod, "/spec/nodeName").to_owned();
    if let Some(n) = s.nodes.get(&node) {
        for l in TOPOLOGY_LABELS {
            if let Some(v) = n["metadata"]["labels"][l].as_str() {
                pod["metadata"]["labels"][l] = v.into();
            }
        }
    }
    if pod["status"]["phase"].is_null() {
        pod["status"]["phase"] = "Pending".into();
    }
    if pod["status"]["qosClass"].is_null() {
        let q = qos_class(pod);
        pod["status"]["qosClass"] = q.into();
    }
}

/// A new pod as the server stores it: kind, generation 1, creationTimestamp, no deletion
/// fields, the defaults.
fn prepare_new(s: &Store, mut pod: Value) -> Value {
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    pod["metadata"]["generation"] = 1.into();
    pod["metadata"]["creationTimestamp"] = now_rfc3339().into();
    if let Some(m) = pod["metadata"].as_object_mut() {
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            m.remove(k);
        }
    }
    apply_defaults(s, &mut pod);
    pod
}

fn insert_new(state: &State, s: &mut Store, pod: Value) -> Value {
    let pod = prepare_new(s, pod);
    s.commit(&state.events_tx, Kind::Pod, None, pod)
}

/// A test's create as an admin (see [`super::ApiServer::create_pod`]): the uid and status
/// given are kept.
pub fn create_trusted(state: &Arc<State>, mut pod: Value) -> Result<Value, Reply> {
    let mut s = state.lock();
    if pod["metadata"]["namespace"]
        .as_str()
        .is_none_or(str::is_empty)
    {
        pod["metadata"]["namespace"] = "default".into();
    }
    let ns = str_at(&pod, "/metadata/namespace").to_owned();
    let name = str_at(&pod, "/metadata/name").to_owned();
    if s.pods.contains_key(&(ns, name.clone())) {
        return Err(already_exists("", "pods", &name));
    }
    if pod["metadata"]["uid"].as_str().is_none_or(str::is_empty) {
        pod["metadata"]["uid"] = s.new_uid().into();
    }
    Ok(insert_new(state, &mut s, pod))
}

/// NodeRestriction's `admitPodCreate`.
fn admit_node_create(s: &Store, node: &str, pod: &Value) -> Result<(), String> {
    if pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_null() {
        return Err(format!(
            "pod does not have \"{MIRROR_ANNOTATION}\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    if str_at(pod, "/spec/nodeName") != node {
        return Err(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if owners.len() > 1 {
        return Err(format!(
            "node \"{node}\" can only create pods with a single owner reference set to itself"
        ));
    }
    let Some(owner) = owners.first() else {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    };
    if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    }
    if owner["controller"] != true {
        return Err(format!(
            "node \"{node}\" can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner["blockOwnerDeletion"] == true {
        return Err(format!(
            "node \"{node}\" must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let node_uid = s
        .nodes
        .get(node)
        .map(|n| str_at(n, "/metadata/uid").to_owned())
        .unwrap_or_default();
    let sent = str_at(owner, "/uid");
    if sent != node_uid {
        return Err(format!(
            "node {node} UID mismatch: expected {sent} got {node_uid}"
        ));
    }
    let spec = &pod["spec"];
    if spec["serviceAccountName"]
        .as_str()
        .is_some_and(|s| !s.is_empty())
    {
        return Err(format!(
            "node \"{node}\" can not create pods that reference serviceaccounts"
        ));
    }
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let containers: Vec<Value> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|l| spec[*l].as_array().cloned().unwrap_or_default())
        .collect();
    let env_refs = |kind: &str| {
        containers.iter().any(|c| {
            c["env"].as_array().is_some_and(|env| {
                env.iter()
                    .any(|e| !e["valueFrom"][format!("{kind}KeyRef")].is_null())
            }) || c["envFrom"]
                .as_array()
                .is_some_and(|ef| ef.iter().any(|e| !e[format!("{kind}Ref")].is_null()))
        })
    };
    let projected = |kind: &str| {
        volumes.iter().any(|v| {
            v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|src| !src[kind].is_null()))
        })
    };
    let secrets = volumes.iter().any(|v| !v["secret"].is_null())
        || projected("secret")
        || env_refs("secret")
        || spec["imagePullSecrets"]
            .as_array()
            .is_some_and(|s| !s.is_empty());
    if secrets {
        return Err(format!(
            "node \"{node}\" can not create pods that reference secrets"
        ));
    }
    if volumes.iter().any(|v| !v["configMap"].is_null())
        || projected("configMap")
        || env_refs("configMap")
    {
        return Err(format!(
            "node \"{node}\" can not create pods that reference configmaps"
        ));
    }
    let uses = |k: &str| volumes.iter().any(|v| !v[k].is_null());
    if uses("persistentVolumeClaim") {
        return Err(format!(
            "node \"{node}\" can not create pods that reference persistentvolumeclaims"
        ));
    }
    if uses("ephemeral") {
        return Err(format!(
            "node \"{node}\" can not create pods that use generic ephemeral volumes"
        ));
    }
    if spec["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
    {
        return Err(format!(
            "node \"{node}\" can not create pods that reference resourceclaims"
        ));
    }
    Ok(())
}

pub(super) fn create(state: &Arc<State>, req: &Req) -> Reply {
    let ns = req.attrs.namespace.clone();
    let mut pod = req.body.clone();
    let name = str_at(&pod, "/metadata/name").to_owned();
    let mut s = state.lock();
    // NamespaceLifecycle runs before NodeRestriction
    if !s.has_namespace(&ns) {
        return not_found("", "namespaces", &ns);
    }
    if let User::Node(node) = &req.user
        && let Err(msg) = admit_node_create(&s, node, &pod)
    {
        return admission_forbidden("", "pods", &name, &msg);
    }
    if s.pods.contains_key(&(ns.clone(), name.clone())) {
        return already_exists("", "pods", &name);
    }
    pod["metadata"]["namespace"] = ns.into();
    pod["metadata"]["uid"] = s.new_uid().into();
    // the status of a create is the server's (fact 5.8), but for a `qosClass` sent, which it
    // keeps (`qos.GetPodQOS` returns a non-empty one as is; measured on the real server)
    let qos = pod["status"]["qosClass"].clone();
    pod["status"] = json!({});
    if qos.as_str().is_some_and(|q| !q.is_empty()) {
        pod["status"]["qosClass"] = qos;
    }
    touch_managed_fields(&mut pod, &manager(&req.user_agent), "Update", "");
    if req.dry_run() {
        return respond(201, &prepare_new(&s, pod));
    }
    let out = insert_new(state, &mut s, pod);
    respond(201, &out)
}
