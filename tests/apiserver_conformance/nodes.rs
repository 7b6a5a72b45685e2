//! Facts of sections 8 (node leases), 9 (Node objects: `fact_9_<n>` is the table's n-th row,
//! `fact_9_14` the sentence after it) and 10 (events).

use super::*;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
const NODES: &str = "/api/v1/nodes";
const EVENTS: &str = "/api/v1/namespaces/default/events";
const NEW_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// `want!(request => code[, message])`: awaits the request, asserts its code and (when given)
/// its exact message, and evaluates to the answer.
macro_rules! want {
    ($req:expr => $code:expr) => {
        want!($req => $code, "")
    };
    ($req:expr => $code:expr, $msg:expr) => {{
        let r = $req.await;
        let msg: &str = &$msg;
        r.expect($code, (!msg.is_empty()).then_some(msg));
        r
    }};
}

fn lease(name: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": name, "namespace": "kube-node-lease"},
           "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}})
}

fn lease_path(name: &str) -> String {
    format!("{LEASES}/{name}")
}

fn node_path(name: &str, sub: &str) -> String {
    format!(
        "{NODES}/{name}{}{sub}",
        if sub.is_empty() { "" } else { "/" }
    )
}

fn node_body(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
}

/// The Node as stored (read by the admin).
async fn node(bed: &Bed, name: &str) -> Value {
    want!(bed.admin.get(&node_path(name, "")) => 200).body
}

fn forbidden(node: &str, msg: &str) -> String {
    format!("nodes \"{node}\" is forbidden: {msg}")
}

/// `v` without `key` at the JSON pointer `at`.
fn without(mut v: Value, at: &str, key: &str) -> Value {
    v.pointer_mut(at)
        .and_then(Value::as_object_mut)
        .map(|m| m.remove(key));
    v
}

// ---- 8: node leases ----

both!(fact_8_1_no_lease_until_a_node_creates_one);
async fn fact_8_1_no_lease_until_a_node_creates_one(b: Backend) {
    let bed = Bed::new(b).await;
    let msg = "leases.coordination.k8s.io \"node-a\" not found";
    let r = want!(bed.node_a.get(&lease_path("node-a")) => 404, msg);
    assert_eq!(r.reason(), "NotFound");
    // kube-node-lease exists: not `namespaces "kube-node-lease" not found`
    want!(bed.node_a.post(LEASES, &lease("node-a")) => 201);
}

both!(fact_8_2_node_creates_reads_updates_patches_deletes_its_lease);
async fn fact_8_2_node_creates_reads_updates_patches_deletes_its_lease(b: Backend) {
    let bed = Bed::new(b).await;
    let (a, path) = (&bed.node_a, lease_path("node-a"));
    let created = want!(a.post(LEASES, &lease("node-a")) => 201);
    let uid = created.body["metadata"]["uid"].as_str().unwrap().to_owned();
    let d = want!(a.delete(&path, None) => 200).body;
    assert_eq!(d["kind"], "Status", "{d:#}");
    assert_eq!(d["status"], "Success", "{d:#}");
    assert_eq!(d["details"]["uid"], uid.as_str(), "{d:#}");
    assert!(d["spec"].is_null(), "a Status, not the object");
    want!(a.get(&path) => 404);
    // again, with an owner reference to its Node
    let node_uid = node(&bed, "node-a").await["metadata"]["uid"].clone();
    let mut l = lease("node-a");
    l["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": node_uid}]);
    want!(a.post(LEASES, &l) => 201);
    let got = want!(a.get(&path) => 200);
    assert_eq!(got.body["metadata"]["ownerReferences"][0]["uid"], node_uid);
    let mut body = got.body.clone();
    body["spec"]["renewTime"] = "2026-11-23T12:00:00.000000Z".into();
    let put = want!(a.put(&path, &body) => 200);
    assert_eq!(put.rv(), got.rv() + 1);
    assert_eq!(put.body["spec"]["renewTime"], "2026-11-23T12:00:00.000000Z");
    let patch = json!({"spec": {"renewTime": "2026-11-23T12:00:10.000000Z"}});
    let p = want!(a.patch(&path, MERGE, &patch) => 200);
    assert_eq!(p.rv(), put.rv() + 1);
    assert_eq!(p.body["spec"]["renewTime"], "2026-11-23T12:00:10.000000Z");
    // the same patch again changes nothing: same resourceVersion
    assert_eq!(want!(a.patch(&path, MERGE, &patch) => 200).rv(), p.rv());
    let d = want!(a.delete(&path, None) => 200).body;
    assert_eq!(d["status"], "Success");
    let new_uid = d["details"]["uid"].as_str().unwrap_or("");
    assert!(!new_uid.is_empty() && new_uid != uid, "{d:#}");
}

both!(fact_8_3_lease_put_stale_rv_409_without_rv_422);
async fn fact_8_3_lease_put_stale_rv_409_without_rv_422(b: Backend) {
    let bed = Bed::new(b).await;
    let (a, path) = (&bed.node_a, lease_path("node-a"));
    let created = want!(a.post(LEASES, &lease("node-a")) => 201);
    let mut body = created.body.clone();
    body["spec"]["holderIdentity"] = "changed".into();
    body["metadata"]["resourceVersion"] = "1".into();
    let msg = "Operation cannot be fulfilled on leases.coordination.k8s.io \"node-a\": the object has been modified; please apply your changes to the latest version and try again";
    assert_eq!(want!(a.put(&path, &body) => 409, msg).reason(), "Conflict");
    let body = without(body, "/metadata", "resourceVersion");
    let msg = "leases.coordination.k8s.io \"node-a\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update";
    assert_eq!(want!(a.put(&path, &body) => 422, msg).reason(), "Invalid");
    let now = want!(a.get(&path) => 200);
    assert_eq!(now.rv(), created.rv());
    assert_eq!(now.body["spec"]["holderIdentity"], "node-a");
}

both!(fact_8_4_node_cannot_create_read_or_update_another_nodes_lease);
async fn fact_8_4_node_cannot_create_read_or_update_another_nodes_lease(b: Backend) {
    let bed = Bed::new(b).await;
    let a = &bed.node_a;
    let why = "can only access node lease with the same name as the requesting node";
    let head = "leases.coordination.k8s.io \"node-b\" is forbidden:";
    want!(a.post(LEASES, &lease("node-b")) => 403, format!("{head} {why}"));
    let theirs = want!(bed.admin.post(LEASES, &lease("node-b")) => 201);
    let msg = |verb: &str| {
        format!(
            "{head} User \"system:node:node-a\" cannot {verb} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": {why}"
        )
    };
    want!(a.get(&lease_path("node-b")) => 403, msg("get"));
    want!(a.put(&lease_path("node-b"), &theirs.body) => 403, msg("update"));
    let now = want!(bed.admin.get(&lease_path("node-b")) => 200);
    assert_eq!(now.rv(), theirs.rv());
}

both!(fact_8_5_node_cannot_list_watch_or_use_other_namespaces);
async fn fact_8_5_node_cannot_list_watch_or_use_other_namespaces(b: Backend) {
    let bed = Bed::new(b).await;
    let a = &bed.node_a;
    let msg = |verb: &str| {
        format!(
            "leases.coordination.k8s.io is forbidden: User \"system:node:node-a\" cannot {verb} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-node-lease\": can only get, create, update, patch, or delete a node lease"
        )
    };
    want!(a.get(LEASES) => 403, msg("list"));
    for w in [
        format!("{LEASES}?watch=1"),
        format!("{LEASES}?watch=1&fieldSelector=metadata.name%3Dnode-a"),
    ] {
        let r = a.watch(&w).await.err().expect("a 403, not a watch");
        assert_eq!(r.code, 403, "{w}: {:#}", r.body);
        assert!(
            r.message().contains("cannot watch resource"),
            "{:#}",
            r.body
        );
    }
    // `watch=1` on the object's own path is a GET (the verb comes from the path): allowed
    let by_name = format!("{}?watch=1", lease_path("node-a"));
    let msg = "leases.coordination.k8s.io \"node-a\" not found";
    want!(a.get(&by_name) => 404, msg);
    want!(a.post(LEASES, &lease("node-a")) => 201);
    let r = want!(a.get(&by_name) => 200);
    assert_eq!(r.body["kind"], "Lease", "{:#}", r.body);
    let l = json!({"metadata": {"name": "node-a", "namespace": "default"}});
    let r = a
        .post(&LEASES.replace("kube-node-lease", "default"), &l)
        .await;
    assert_eq!(r.code, 403, "{:#}", r.body);
    assert!(r.message().ends_with("cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\": can only access leases in the \"kube-node-lease\" system namespace"), "{:#}", r.body);
}

// ---- 9: Node objects ----

both!(fact_9_1_own_status_writes_timestamps_as_sent_spec_dropped);
async fn fact_9_1_own_status_writes_timestamps_as_sent_spec_dropped(b: Backend) {
    let bed = Bed::new(b).await;
    let (a, status) = (&bed.node_a, node_path("node-a", "status"));
    let t = "2020-01-02T03:04:05Z";
    let ready = json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok",
                       "lastHeartbeatTime": t, "lastTransitionTime": t});
    let cond = json!({"status": {"conditions": [ready]}});
    want!(a.patch(&status, STRATEGIC, &cond) => 200);
    want!(a.patch(&status, MERGE, &cond) => 200);
    let res =
        json!({"status": {"capacity": {"cpu": "4", "pods": "110"}, "allocatable": {"cpu": "3"}}});
    want!(a.patch(&status, MERGE, &res) => 200);
    let n = node(&bed, "node-a").await;
    assert_eq!(n["status"]["conditions"], json!([ready]));
    assert_eq!(n["status"]["allocatable"], json!({"cpu": "3"}));
    // PUT nodes/status (with and without resourceVersion), a spec change inside it dropped
    let mut body = want!(a.get(&node_path("node-a", "")) => 200).body;
    body["status"]["capacity"]["pods"] = "99".into();
    body["spec"]["unschedulable"] = true.into();
    want!(a.put(&status, &body) => 200);
    let mut body = without(body, "/metadata", "resourceVersion");
    body["status"]["capacity"]["cpu"] = "8".into();
    want!(a.put(&status, &body) => 200);
    let n = node(&bed, "node-a").await;
    assert_eq!(n["status"]["capacity"], json!({"cpu": "8", "pods": "99"}));
    assert!(n["spec"]["unschedulable"].is_null(), "{:#}", n["spec"]);
    assert_eq!(n["status"]["conditions"][0]["lastHeartbeatTime"], t);
}

both!(fact_9_2_node_cannot_modify_or_create_another_node);
async fn fact_9_2_node_cannot_modify_or_create_another_node(b: Backend) {
    let bed = Bed::new(b).await;
    let a = &bed.node_a;
    let before = node(&bed, "node-b").await;
    let why = |n: &str| format!("node \"node-a\" is not allowed to modify node \"{n}\"");
    let msg = |n: &str| forbidden(n, &why(n));
    let cond = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    want!(a.patch(&node_path("node-b", "status"), MERGE, &cond) => 403, msg("node-b"));
    let spec = json!({"spec": {"unschedulable": true}});
    want!(a.patch(&node_path("node-b", ""), MERGE, &spec) => 403, msg("node-b"));
    want!(a.post(NODES, &node_body("node-c")) => 403, msg("node-c"));
    assert_eq!(node(&bed, "node-b").await, before);
    want!(bed.admin.get(&node_path("node-c", "")) => 404);
}

both!(fact_9_3_own_unschedulable_pod_cidr_provider_id_annotations);
async fn fact_9_3_own_unschedulable_pod_cidr_provider_id_annotations(b: Backend) {
    let bed = Bed::new(b).await;
    for patch in [
        json!({"spec": {"unschedulable": true}}),
        json!({"spec": {"podCIDR": "10.244.1.0/24"}}),
        json!({"spec": {"providerID": "kind://docker/kind/node-a"}}),
        json!({"metadata": {"annotations": {"example.com/a": "b"}}}),
    ] {
        want!(bed.node_a.patch(&node_path("node-a", ""), MERGE, &patch) => 200);
    }
    let n = node(&bed, "node-a").await;
    assert_eq!(n["spec"]["unschedulable"], true);
    assert_eq!(n["spec"]["podCIDRs"], json!(["10.244.1.0/24"]));
    assert_eq!(n["spec"]["providerID"], "kind://docker/kind/node-a");
    assert_eq!(n["metadata"]["annotations"]["example.com/a"], "b");
    // and by PUT without a resourceVersion (fact 4.2: nodes take unconditional updates)
    let mut body = without(n, "/metadata", "resourceVersion");
    body["metadata"]["annotations"]["example.com/a"] = "c".into();
    want!(bed.node_a.put(&node_path("node-a", ""), &body) => 200);
    assert_eq!(
        node(&bed, "node-a").await["metadata"]["annotations"]["example.com/a"],
        "c"
    );
}

/// Each `(subresource, merge patch)` by node-a answers 403 with `msg` and leaves node-a as it
/// was.
async fn refused(bed: &Bed, cases: &[(&str, Value)], msg: &str) {
    let before = node(bed, "node-a").await;
    for (sub, patch) in cases {
        want!(bed.node_a.patch(&node_path("node-a", sub), MERGE, patch) => 403, msg);
    }
    assert_eq!(node(bed, "node-a").await, before);
}

both!(fact_9_4_own_taints_cannot_be_added_or_removed);
async fn fact_9_4_own_taints_cannot_be_added_or_removed(b: Backend) {
    let bed = Bed::new(b).await;
    let mine = json!({"key": "example.com/t", "effect": "NoSchedule"});
    let add = json!({"spec": {"taints": [{"key": NOT_READY, "effect": "NoSchedule"}, mine]}});
    let msg = forbidden("node-a", "node \"node-a\" is not allowed to modify taints");
    let remove = json!({"spec": {"taints": null}});
    let cases = [("", add.clone()), ("", remove), ("status", add)];
    refused(&bed, &cases, &msg).await;
}

both!(fact_9_5_own_config_source_forbidden);
async fn fact_9_5_own_config_source_forbidden(b: Backend) {
    let bed = Bed::new(b).await;
    let src = json!({"configMap": {"name": "c", "namespace": "kube-system", "kubeletConfigKey": "kubelet"}});
    let msg = "node \"node-a\" is not allowed to update configSource to a new non-nil configSource";
    let case = [("", json!({"spec": {"configSource": src}}))];
    refused(&bed, &case, &forbidden("node-a", msg)).await;
}

both!(fact_9_6_own_owner_references_forbidden);
async fn fact_9_6_own_owner_references_forbidden(b: Backend) {
    let bed = Bed::new(b).await;
    let uid = node(&bed, "node-b").await["metadata"]["uid"].clone();
    let owners = json!([{"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": uid}]);
    let msg = "node \"node-a\" is not allowed to modify ownerReferences";
    let case = [("", json!({"metadata": {"ownerReferences": owners}}))];
    refused(&bed, &case, &forbidden("node-a", msg)).await;
}

both!(fact_9_7_allowed_labels);
async fn fact_9_7_allowed_labels(b: Backend) {
    let bed = Bed::new(b).await;
    let path = node_path("node-a", "");
    for key in [
        "example.com/foo",
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "topology.kubernetes.io/zone",
        "node.kubernetes.io/instance-type",
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "kubelet.kubernetes.io/x",
    ] {
        let set = json!({"metadata": {"labels": {key: "v"}}});
        want!(bed.node_a.patch(&path, MERGE, &set) => 200);
        let n = node(&bed, "node-a").await;
        assert_eq!(n["metadata"]["labels"][key], "v", "{key}");
    }
    let remove = json!({"metadata": {"labels": {"kubernetes.io/hostname": null}}});
    want!(bed.node_a.patch(&path, MERGE, &remove) => 200);
    assert!(node(&bed, "node-a").await["metadata"]["labels"]["kubernetes.io/hostname"].is_null());
}

both!(fact_9_8_restricted_labels_added_or_removed);
async fn fact_9_8_restricted_labels_added_or_removed(b: Backend) {
    let bed = Bed::new(b).await;
    let (a, path) = (&bed.node_a, node_path("node-a", ""));
    for key in [
        "node-role.kubernetes.io/worker",
        "node-restriction.kubernetes.io/foo",
        "foo.node-restriction.kubernetes.io/bar",
        "foo.kubernetes.io/x",
        "k8s.io/x",
    ] {
        let msg = forbidden("node-a", &format!("is not allowed to modify labels: {key}"));
        let set = |v: &str| json!({"metadata": {"labels": {key: v}}});
        // adding, by PATCH, through /status and by PUT
        refused(&bed, &[("", set("v")), ("status", set("v"))], &msg).await;
        let mut body = want!(a.get(&path) => 200).body;
        body["metadata"]["labels"][key] = "v".into();
        want!(a.put(&path, &body) => 403, msg);
        // removing (or changing) one an admin set
        want!(bed.admin.patch(&path, MERGE, &set("admin")) => 200);
        let remove = json!({"metadata": {"labels": {key: null}}});
        refused(&bed, &[("", remove), ("status", set("v"))], &msg).await;
        let body = without(want!(a.get(&path) => 200).body, "/metadata/labels", key);
        want!(a.put(&path, &body) => 403, msg);
        let n = node(&bed, "node-a").await;
        assert_eq!(n["metadata"]["labels"][key], "admin");
    }
}

both!(fact_9_9_post_own_existing_node);
async fn fact_9_9_post_own_existing_node(b: Backend) {
    let bed = Bed::new(b).await;
    let mut n = node_body("node-a");
    let r = want!(bed.node_a.post(NODES, &n) => 409, "nodes \"node-a\" already exists");
    assert_eq!(r.reason(), "AlreadyExists");
    n["metadata"]["labels"] = json!({"node-role.kubernetes.io/x": ""});
    let msg =
        "node \"node-a\" is not allowed to set the following labels: node-role.kubernetes.io/x";
    want!(bed.node_a.post(NODES, &n) => 403, forbidden("node-a", msg));
}

both!(fact_9_10_node_registers_itself_with_a_taint);
async fn fact_9_10_node_registers_itself_with_a_taint(b: Backend) {
    let bed = Bed::new(b).await;
    want!(bed.admin.delete(&node_path("node-b", ""), None) => 200);
    want!(bed.admin.get(&node_path("node-b", "")) => 404);
    let mine = json!({"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"});
    let mut n = node_body("node-b");
    n["spec"] = json!({"taints": [mine]});
    let r = want!(bed.node_b.post(NODES, &n) => 201);
    let taints = json!([mine, {"key": NOT_READY, "effect": "NoSchedule"}]);
    assert_eq!(r.body["spec"]["taints"], taints);
    assert_eq!(node(&bed, "node-b").await["spec"]["taints"], taints);
}

both!(fact_9_11_get_other_node_forbidden);
async fn fact_9_11_get_other_node_forbidden(b: Backend) {
    let bed = Bed::new(b).await;
    want!(bed.node_a.get(&node_path("node-a", "")) => 200);
    let msg = "User \"system:node:node-a\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node 'node-a' cannot read 'node-b', only its own Node object";
    want!(bed.node_a.get(&node_path("node-b", "")) => 403, forbidden("node-b", msg));
}

both!(fact_9_12_list_nodes_forbidden);
async fn fact_9_12_list_nodes_forbidden(b: Backend) {
    let bed = Bed::new(b).await;
    let msg = "nodes is forbidden: User \"system:node:node-a\" cannot list resource \"nodes\" in API group \"\" at the cluster scope: node 'node-a' cannot read all nodes, only its own Node object";
    want!(bed.node_a.get(NODES) => 403, msg);
}

both!(fact_9_13_delete_nodes_forbidden);
async fn fact_9_13_delete_nodes_forbidden(b: Backend) {
    let bed = Bed::new(b).await;
    for n in ["node-b", "node-a"] {
        let msg = "User \"system:node:node-a\" cannot delete resource \"nodes\" in API group \"\" at the cluster scope";
        want!(bed.node_a.delete(&node_path(n, ""), None) => 403, forbidden(n, msg));
        node(&bed, n).await;
    }
}

both!(fact_9_14_admin_created_node_gets_not_ready_taint_kept);
async fn fact_9_14_admin_created_node_gets_not_ready_taint_kept(b: Backend) {
    let bed = Bed::new(b).await;
    let taints = json!([{"key": NOT_READY, "effect": "NoSchedule"}]);
    assert_eq!(node(&bed, "node-a").await["spec"]["taints"], taints);
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    want!(bed.node_a.patch(&node_path("node-a", "status"), STRATEGIC, &ready) => 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let n = node(&bed, "node-a").await;
    assert_eq!(n["spec"]["taints"], taints, "nothing removes it");
    // the times not sent are Go's zero metav1.Time: null
    let ready = json!([{"type": "Ready", "status": "True",
                        "lastHeartbeatTime": null, "lastTransitionTime": null}]);
    assert_eq!(n["status"]["conditions"], ready);
    let x = want!(bed.admin.post(NODES, &node_body("node-x")) => 201).body;
    assert_eq!(x["spec"]["taints"], taints);
}

// ---- 10: events ----

fn core_event(name: &str, pod: &Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Event",
           "metadata": {"name": name, "namespace": "default"},
           "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                              "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
           "reason": "Killing", "message": "Stopping container c", "type": "Normal",
           "source": {"component": "kubelet", "host": "node-a"},
           "firstTimestamp": "2026-11-23T12:00:00Z", "lastTimestamp": "2026-11-23T12:00:00Z", "count": 1})
}

both!(fact_10_1_node_creates_core_events);
async fn fact_10_1_node_creates_core_events(b: Backend) {
    let bed = Bed::new(b).await;
    let mine = bed.pod("p-a", Some("node-a")).await;
    let theirs = bed.pod("p-b", Some("node-b")).await;
    let bare = ["firstTimestamp", "lastTimestamp", "count"]
        .iter()
        .fold(core_event("ev0.3", &mine), |e, k| without(e, "", k));
    let mut bogus = core_event("ev0.4", &mine);
    bogus["type"] = "Bogus".into();
    let (own, others) = (core_event("ev0.1", &mine), core_event("ev0.2", &theirs));
    for e in [own, others, bare, bogus] {
        let r = want!(bed.node_a.post(EVENTS, &e) => 201).body;
        assert_eq!(r["involvedObject"], e["involvedObject"]);
    }
    let stored = bed.events().await;
    let names: Vec<&str> = stored
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ev0.1", "ev0.2", "ev0.3", "ev0.4"]);
    assert_eq!(stored[1]["involvedObject"]["name"], "p-b");
    assert_eq!(stored[3]["type"], "Bogus");
}

both!(fact_10_2_core_event_namespace_must_match_involved_object);
async fn fact_10_2_core_event_namespace_must_match_involved_object(b: Backend) {
    let bed = Bed::new(b).await;
    let pod = bed.pod("p-a", Some("node-a")).await;
    bed.add_namespace("other").await;
    let mut e = core_event("ev0.2", &pod);
    e["metadata"]["namespace"] = "other".into();
    let msg = "Event \"ev0.2\" is invalid: involvedObject.namespace: Invalid value: \"default\": does not match event.namespace";
    let r = want!(bed.node_a.post("/api/v1/namespaces/other/events", &e) => 422, msg);
    assert_eq!(r.reason(), "Invalid");
    assert!(bed.events().await.is_empty());
}

both!(fact_10_3_node_patches_events_but_cannot_read_or_delete_them);
async fn fact_10_3_node_patches_events_but_cannot_read_or_delete_them(b: Backend) {
    let bed = Bed::new(b).await;
    let pod = bed.pod("p-a", Some("node-a")).await;
    let created = want!(bed.node_a.post(EVENTS, &core_event("ev0.1", &pod)) => 201);
    let path = format!("{EVENTS}/ev0.1");
    let patch = json!({"count": 2, "lastTimestamp": "2026-11-23T12:00:09Z"});
    let r = want!(bed.node_a.patch(&path, STRATEGIC, &patch) => 200);
    assert_eq!(r.body["count"], 2);
    assert_eq!(r.rv(), created.rv() + 1);
    let msg = |verb: &str| {
        format!(
            "events \"ev0.1\" is forbidden: User \"system:node:node-a\" cannot {verb} resource \"events\" in API group \"\" in the namespace \"default\""
        )
    };
    want!(bed.node_a.get(&path) => 403, msg("get"));
    want!(bed.node_a.delete(&path, None) => 403, msg("delete"));
    assert_eq!(bed.events().await[0]["count"], 2);
}

both!(fact_10_4_events_k8s_io_events_and_their_core_view);
async fn fact_10_4_events_k8s_io_events_and_their_core_view(b: Backend) {
    let bed = Bed::new(b).await;
    let pod = bed.pod("p-a", Some("node-a")).await;
    let (a, t) = (&bed.node_a, "2026-11-23T12:00:00.123456Z");
    let ev = |name: &str, instance: &str| {
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": name, "namespace": "default"},
               "eventTime": t, "reportingController": "kubelet", "reportingInstance": instance,
               "action": "Killing", "reason": "Killing", "note": "Stopping container c", "type": "Normal",
               "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                             "name": "p-a", "uid": pod["metadata"]["uid"]}})
    };
    let r = want!(a.post(NEW_EVENTS, &ev("ev0.e1", "node-a")) => 201).body;
    assert_eq!(r["eventTime"], t);
    assert_eq!(r["note"], "Stopping container c");
    want!(a.post(NEW_EVENTS, &ev("ev0.e1b", "node-b")) => 201);
    let no_time = without(ev("ev0.e2", "node-a"), "", "eventTime");
    let msg = "Event \"ev0.e2\" is invalid: eventTime: Required value";
    want!(a.post(NEW_EVENTS, &no_time) => 422, msg);
    let series = json!({"series": {"count": 2, "lastObservedTime": "2026-11-23T12:00:05.000000Z"}});
    let p = want!(a.patch(&format!("{NEW_EVENTS}/ev0.e1"), MERGE, &series) => 200);
    assert_eq!(p.body["series"], series["series"]);
    // read through core/v1, as created and after the patch
    for name in ["ev0.e1b", "ev0.e1"] {
        let c = want!(bed.admin.get(&format!("{EVENTS}/{name}")) => 200).body;
        assert_eq!(c["message"], "Stopping container c", "{c:#}");
        assert_eq!(c["source"], json!({}), "{c:#}");
        for k in ["firstTimestamp", "lastTimestamp", "count"] {
            assert!(c[k].is_null(), "{k}: {c:#}");
        }
        assert_eq!(c["involvedObject"]["name"], "p-a");
        assert_eq!(c["eventTime"], t);
    }
}
