//! CRI labels and annotations (lines of `key=value`; a line `--` starts the next container)
//! -> an orphan's spec.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaplet::cri::{ContainerRunState, RuntimeContainer, RuntimeSandbox};
use std::collections::HashMap;

fn pairs(block: &str) -> HashMap<String, String> {
    block
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut blocks = text.split("\n--\n");
    let sb = pairs(blocks.next().unwrap_or_default());
    let uid = sb.get(reaplet::cri::LABEL_POD_UID).cloned().unwrap_or_default();
    let sandboxes = vec![RuntimeSandbox {
        id: "sb".into(),
        pod_uid: uid.clone(),
        pod_name: String::new(),
        pod_namespace: String::new(),
        ready: true,
        created_at: 0,
        labels: sb.clone(),
        annotations: sb,
    }];
    let containers: Vec<RuntimeContainer> = blocks
        .enumerate()
        .map(|(i, b)| {
            let kv = pairs(b);
            RuntimeContainer {
                id: format!("c{i}"),
                sandbox_id: "sb".into(),
                name: kv.get(reaplet::cri::LABEL_CONTAINER_NAME).cloned().unwrap_or_default(),
                attempt: 0,
                pod_uid: kv.get(reaplet::cri::LABEL_POD_UID).cloned().unwrap_or_else(|| uid.clone()),
                state: ContainerRunState::Running,
                created_at: 0,
                labels: kv.clone(),
                annotations: kv,
            }
        })
        .collect();
    let g = reaplet::pod::group_runtime(&sandboxes, &containers);
    for (u, (sbs, cs)) in &g.pods {
        let info = reaplet::pod::PodInfo::from_runtime(u, sbs, cs);
        assert_eq!(&info.uid, u);
    }
});
