//! Facts of section 11: what an imitation is likely to get wrong (resourceVersion,
//! generation, spec updates, defaults, topology labels, content types, managedFields,
//! `details.kind`).

use super::pods::*;
use super::*;

both!(fact_11_1_one_resource_version_counter);
async fn fact_11_1_one_resource_version_counter(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s0", Some("node-a")).await;
    let mut last = rv(&p);
    for m in ["a", "b", "c"] {
        let r = bed
            .node_a
            .patch(
                &status_path("s0"),
                MERGE,
                &json!({"status": {"message": m}}),
            )
            .await;
        last += 1;
        assert_eq!(
            r.body["metadata"]["resourceVersion"],
            json!(last.to_string())
        );
    }
    // other objects take theirs from the same counter
    assert_eq!(rv(&bed.pod("s1", Some("node-a")).await), last + 1);
    let label = json!({"metadata": {"annotations": {"example.com/x": "y"}}});
    assert_eq!(
        bed.admin
            .patch("/api/v1/nodes/node-b", MERGE, &label)
            .await
            .rv(),
        last + 2
    );
    let r = bed
        .node_a
        .patch(
            &status_path("s0"),
            MERGE,
            &json!({"status": {"message": "c"}}),
        )
        .await;
    assert_eq!(r.rv(), last, "a no-op keeps it");
}

both!(fact_11_2_generation);
async fn fact_11_2_generation(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("m0", Some("node-a")).await;
    assert_eq!(p["metadata"]["generation"], 1);
    let image = json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}});
    let steps = [
        (
            &bed.admin,
            pod_path("m0"),
            MERGE,
            json!({"spec": {"activeDeadlineSeconds": 600}}),
            2,
        ),
        (&bed.admin, pod_path("m0"), STRATEGIC, image, 3),
        (
            &bed.admin,
            pod_path("m0"),
            MERGE,
            json!({"metadata": {"labels": {"x": "y"}}}),
            3,
        ),
        (
            &bed.node_a,
            status_path("m0"),
            MERGE,
            json!({"status": {"phase": "Running"}}),
            3,
        ),
    ];
    for (c, path, ct, body, want) in steps {
        let r = c.patch(&path, ct, &body).await;
        r.expect(200, None);
        assert_eq!(r.body["metadata"]["generation"], want, "{body}");
    }
    let r = bed.admin.delete(&pod_path("m0"), None).await;
    assert_eq!(
        r.body["metadata"]["generation"], 4,
        "a graceful delete sets dt"
    );
    let r = bed
        .admin
        .delete(&pod_path("m0"), Some(&json!({"gracePeriodSeconds": 10})))
        .await;
    assert_eq!(r.body["metadata"]["generation"], 4, "shortening the grace");
}

both!(fact_11_3_which_spec_fields_an_update_may_change);
async fn fact_11_3_which_spec_fields_an_update_may_change(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("m0", Some("node-a")).await;
    let mut tolerations = p["spec"]["tolerations"].as_array().unwrap().clone();
    tolerations.push(json!({"key": "example.com/t", "operator": "Exists", "effect": "NoSchedule"}));
    let allowed = [
        (
            STRATEGIC,
            json!({"spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}),
        ),
        (MERGE, json!({"spec": {"activeDeadlineSeconds": 600}})),
        (MERGE, json!({"spec": {"tolerations": tolerations}})),
    ];
    for (ct, body) in allowed {
        bed.admin
            .patch(&pod_path("m0"), ct, &body)
            .await
            .expect(200, None);
    }
    let r = bed
        .admin
        .patch(
            &pod_path("m0"),
            MERGE,
            &json!({"spec": {"nodeName": "node-b"}}),
        )
        .await;
    r.expect(422, None);
    assert_eq!(
        (r.reason(), &r.body["details"]["kind"]),
        ("Invalid", &json!("Pod"))
    );
    let prefix =
        "Pod \"m0\" is invalid: spec: Forbidden: pod updates may not change fields other than ";
    assert!(r.message().starts_with(prefix), "{}", r.message());
    let line = |sign: char, node: &str| {
        r.message()
            .lines()
            .skip(1)
            .any(|l| l.trim_start().starts_with(sign) && l.contains(&format!("\"{node}\"")))
    };
    assert!(
        line('-', "node-a") && line('+', "node-b"),
        "a diff: {}",
        r.message()
    );
}

both!(fact_11_4_defaults_on_create);
async fn fact_11_4_defaults_on_create(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("d", Some("node-a")).await;
    let spec = &p["spec"];
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
        assert_eq!(spec[k], v, "{k}");
    }
    let c = &spec["containers"][0];
    assert_eq!(
        (
            &c["imagePullPolicy"],
            &c["terminationMessagePath"],
            &c["terminationMessagePolicy"]
        ),
        (
            &json!("Always"),
            &json!("/dev/termination-log"),
            &json!("File")
        )
    );
    let toleration = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
    let want = json!([
        toleration("node.kubernetes.io/not-ready"),
        toleration("node.kubernetes.io/unreachable")
    ]);
    assert_eq!(spec["tolerations"], want);
    assert_eq!(
        p["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
}

both!(fact_11_5_pods_inherit_the_nodes_topology_labels);
async fn fact_11_5_pods_inherit_the_nodes_topology_labels(b: Backend) {
    let real = matches!(b, Backend::Real);
    let bed = Bed::new(b).await;
    let (zone, region) = (
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
    );
    let relabel = |z: &str| json!({"metadata": {"labels": {zone: z, region: "r1"}}});
    bed.admin
        .patch("/api/v1/nodes/node-a", MERGE, &relabel("z1"))
        .await
        .expect(200, None);
    if real {
        // the real server's admission reads the Node from its informer, which may not have
        // seen the relabel yet (a run here once got the pod's own `mine`): wait, by dry-run creates,
        // until admission copies the new labels (bounded)
        let t = std::time::Instant::now();
        loop {
            let r = bed
                .admin
                .post(
                    "/api/v1/namespaces/default/pods?dryRun=All",
                    &pod_body("probe", Some("node-a")),
                )
                .await;
            if r.body["metadata"]["labels"][zone] == "z1" {
                break;
            }
            assert!(
                t.elapsed().as_secs() < 30,
                "labels never copied: {:#}",
                r.body
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    let mut own = pod_body("t0", Some("node-a"));
    own["metadata"]["labels"][zone] = "mine".into();
    let t0 = bed.create(own).await;
    let owner = node_owner("node-a", &node_uid(&bed, "node-a").await);
    let m = bed
        .node_a
        .post(
            PODS,
            &mirror("static-t-node-a", Some("node-a"), Some(owner)),
        )
        .await;
    m.expect(201, None);
    for p in [&t0, &m.body] {
        let l = &p["metadata"]["labels"];
        assert_eq!(
            (&l[zone], &l[region], &l["app"]),
            (&json!("z1"), &json!("r1"), &p["metadata"]["name"]),
            "{p:#}"
        );
    }
    let b = bed.pod("t1", Some("node-b")).await;
    assert!(b["metadata"]["labels"][zone].is_null());
    bed.admin
        .patch("/api/v1/nodes/node-a", MERGE, &relabel("z2"))
        .await
        .expect(200, None);
    assert_eq!(
        bed.stored("t0").await.unwrap()["metadata"]["labels"][zone],
        "z1",
        "not propagated"
    );
}

both!(fact_11_6_content_types);
async fn fact_11_6_content_types(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s0", Some("node-a")).await;
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    let r = bed.admin.patch(&pod_path("s0"), JSON, &label).await;
    expect_status(
        &r,
        415,
        "UnsupportedMediaType",
        "415: Unsupported Media Type",
    );
    let unknown = "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf";
    let post = bed
        .admin
        .send("POST", PODS, MERGE, Some(&pod_body("s1", Some("node-a"))))
        .await;
    let put = bed
        .admin
        .send("PUT", &pod_path("s0"), MERGE, Some(&p))
        .await;
    for r in [post, put] {
        expect_status(&r, 415, "UnsupportedMediaType", unknown);
    }
    const APPLY: &str = "application/apply-patch+yaml";
    let applied = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s0"}, "status": {"message": "applied"}});
    let r = bed.admin.patch(&status_path("s0"), APPLY, &applied).await;
    let msg = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch";
    expect_status(&r, 422, "Invalid", msg);
    let r = bed
        .admin
        .patch(
            &format!("{}?fieldManager=x&force=true", status_path("s0")),
            APPLY,
            &applied,
        )
        .await;
    r.expect(200, None);
    assert_eq!(r.body["status"]["message"], "applied");
}

/// A POST with no User-Agent header (to the imitation over a raw connection).
async fn post_without_user_agent(bed: &Bed, path: &str, body: &Value) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if bed.is_real() {
        let r = bed
            .admin
            .send_as("POST", path, JSON, Some(body), None)
            .await;
        r.expect(201, None);
        return r.body;
    }
    let mut s = tokio::net::TcpStream::connect(bed.api().addr)
        .await
        .expect("connect");
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: apiserver\r\nAuthorization: Bearer {}\r\nContent-Type: {JSON}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        User::Admin.token(),
        body.len()
    );
    s.write_all(format!("{head}{body}").as_bytes())
        .await
        .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    let (_, json) = text.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn managers(p: &Value) -> Vec<(String, String, String)> {
    let s = |e: &Value, k: &str| e[k].as_str().unwrap_or("").to_owned();
    p["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .map(|e| (s(e, "manager"), s(e, "operation"), s(e, "subresource")))
        .collect()
}

both!(fact_11_7_managed_fields);
async fn fact_11_7_managed_fields(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s0", Some("node-a")).await;
    let update = |m: &str, sub: &str| (m.to_owned(), "Update".to_owned(), sub.to_owned());
    assert_eq!(managers(&p), [update("conformance", "")]);
    let r = set_phase(&bed, "s0", "Running").await;
    assert_eq!(
        managers(&r),
        [update("conformance", ""), update("conformance", "status")]
    );
    let anon = post_without_user_agent(&bed, PODS, &pod_body("s1", Some("node-a"))).await;
    assert_eq!(managers(&anon), [update("unknown", "")], "{anon:#}");
}

both!(fact_11_8_details_kind);
async fn fact_11_8_details_kind(b: Backend) {
    let bed = Bed::new(b).await;
    let p = bed.pod("s0", Some("node-a")).await;
    bed.pod("x-b", Some("node-b")).await;
    set_phase(&bed, "s0", "Running").await;
    let zero = json!({"uid": "00000000-0000-0000-0000-000000000000"});
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "nonexist", "namespace": "default"}});
    let lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a";
    let cases = [
        (bed.node_a.get(&pod_path("gone")).await, 403, "pods"),
        (bed.node_a.delete(&pod_path("x-b"), None).await, 403, "pods"),
        (bed.node_a.get("/api/v1/nodes/node-b").await, 403, "nodes"),
        (bed.admin.get(&pod_path("gone")).await, 404, "pods"),
        (bed.node_a.get(lease).await, 404, "leases"),
        (bed.node_a.put(&status_path("s0"), &p).await, 409, "pods"),
        (
            bed.admin
                .delete(&pod_path("s0"), Some(&json!({"preconditions": zero})))
                .await,
            409,
            "Pod",
        ),
        (
            bed.node_a
                .patch(&status_path("s0"), MERGE, &json!({"metadata": zero}))
                .await,
            422,
            "Pod",
        ),
        (
            bed.node_a
                .post(&format!("{}/eviction", pod_path("nonexist")), &eviction)
                .await,
            404,
            "pod",
        ),
    ];
    for (r, code, kind) in cases {
        r.expect(code, None);
        assert_eq!(r.body["details"]["kind"], kind, "{:#}", r.body);
    }
}
