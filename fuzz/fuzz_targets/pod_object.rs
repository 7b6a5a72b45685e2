//! A pod object (JSON, as the watch or a manifest delivers it) -> worker inputs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaplet::grace;

fuzz_target!(|data: &[u8]| {
    let Ok(pod) = serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(data) else {
        return;
    };
    if let Ok(info) = reaplet::pod::PodInfo::from_api(&pod) {
        let p = std::path::Path::new("/root").join(info.uid.as_str());
        assert_eq!(p.parent(), Some(std::path::Path::new("/root")));
        let g = grace::effective_grace(None, info.deletion_grace, None, info.spec_grace);
        assert!(g >= 1);
        // a held grace only ever decreases
        for ask in [Some(0), Some(i64::MAX), None] {
            let again = grace::effective_grace(Some(g), info.deletion_grace, ask, info.spec_grace);
            assert!(again <= g && again >= 1);
        }
        if let Some(d) = info.deletion_grace {
            assert!(g <= d.max(1));
        }
    }
});
