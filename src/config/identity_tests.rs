//! The node name in credentials ([`super`]): real certificates made here with Debian's
//! `openssl` (as the test bed's PKI makes them), JWTs of the API server's claim layout, and
//! malformed input of every kind (never a panic, never a name).

use super::*;
use proptest::prelude::*;
use std::path::Path;
use std::process::Command;

/// A self-signed EC certificate with `subject` (openssl's `/O=a/CN=b` form) in `dir`: (PEM
/// file, key file).
fn certificate(dir: &Path, subject: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let tag: String = subject
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let (cert, key) = (
        dir.join(format!("{tag}.crt")),
        dir.join(format!("{tag}.key")),
    );
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            subject,
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ])
        .output()
        .expect("run openssl (Debian's openssl package)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// The DER form of a PEM certificate file.
fn der(pem: &Path) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in", pem.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

/// Standard base64, padded (what a kubeconfig's `*-data` fields hold).
fn b64(bytes: &[u8], url: bool) -> String {
    const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, b| (a << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            let c = STD[((n >> (18 - 6 * i)) & 63) as usize];
            out.push(match (url, c) {
                (true, b'+') => '-',
                (true, b'/') => '_',
                _ => c as char,
            });
        }
        if !url {
            out.push_str(&"=".repeat(3 - chunk.len()));
        }
    }
    out
}

/// A JWT with `claims` (base64url, no padding; the signature is not read).
fn jwt(claims: &serde_json::Value) -> String {
    let header = br#"{"alg":"RS256","kid":"k"}"#;
    format!(
        "{}.{}.{}",
        b64(header, true),
        b64(claims.to_string().as_bytes(), true),
        b64(b"not-a-signature", true)
    )
}

/// The API server's claims of a token bound to a pod on node `node`.
fn bound_claims(node: &str) -> serde_json::Value {
    serde_json::json!({
        "aud": ["https://kubernetes.default.svc"], "exp": 1_900_000_000,
        "iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:kube-system:reaplet",
        "kubernetes.io": {
            "namespace": "kube-system",
            "node": {"name": node, "uid": "5d1c4f8e-0000-4000-8000-000000000001"},
            "pod": {"name": "reaplet-abcde", "uid": "5d1c4f8e-0000-4000-8000-000000000002"},
            "serviceaccount": {"name": "reaplet", "uid": "5d1c4f8e-0000-4000-8000-000000000003"},
        },
    })
}

fn auth(v: serde_json::Value) -> kube::config::AuthInfo {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_node_certificate_names_the_node_in_pem_der_data_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "/O=system:nodes/CN=system:node:foo");
    let pem = std::fs::read(&cert).unwrap();
    assert_eq!(certificate_cn(&pem).unwrap(), "system:node:foo");
    assert_eq!(certificate_cn(&der(&cert)).unwrap(), "system:node:foo");
    // the kubeconfig's client-certificate-data
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate-data": b64(&pem, false)}),
    ));
    assert_eq!(f.notes, Vec::<String>::new());
    let n = f.name.unwrap();
    assert_eq!((n.name.as_str(), n.from), ("foo", NameFrom::Certificate));
    assert_eq!(n.detail, "CN=system:node:foo of client-certificate-data");
    // the kubelet's kubelet-client-current.pem: key and certificate in one file
    let both = dir.path().join("kubelet-client-current.pem");
    let mut text = std::fs::read(&key).unwrap();
    text.extend_from_slice(&pem);
    std::fs::write(&both, text).unwrap();
    let path = both.to_str().unwrap();
    let f = from_credentials(&auth(serde_json::json!({"client-certificate": path})));
    let n = f.name.unwrap();
    assert_eq!(n.name, "foo");
    assert_eq!(
        n.detail,
        format!("CN=system:node:foo of client certificate {path}")
    );
}

#[test]
fn the_last_cn_counts_and_other_identities_name_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Go's pkix (the API server's x509 authenticator) keeps the last CN of the subject
    let (two, _) = certificate(dir.path(), "/CN=system:node:first/CN=system:node:bar");
    assert_eq!(
        certificate_cn(&std::fs::read(&two).unwrap()).unwrap(),
        "system:node:bar"
    );
    // an admin's certificate: no name, nothing to say
    let (admin, _) = certificate(dir.path(), "/O=system:masters/CN=admin");
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate": admin.to_str().unwrap()}),
    ));
    assert_eq!(f, Found::default());
    // a node user whose name is no node name: noted, no name
    let (bad, _) = certificate(dir.path(), "/CN=system:node:Not_A_Name");
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate": bad.to_str().unwrap()}),
    ));
    assert!(f.name.is_none());
    assert_eq!(f.notes.len(), 1, "{:?}", f.notes);
    assert!(f.notes[0].contains("Not_A_Name"), "{:?}", f.notes);
    // no CN at all
    let (none, _) = certificate(dir.path(), "/O=system:nodes");
    assert_eq!(
        certificate_cn(&std::fs::read(&none).unwrap()),
        Err("the certificate's subject has no CN".into())
    );
}

#[test]
fn malformed_certificates_are_no_name_and_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = certificate(dir.path(), "/CN=system:node:foo");
    let d = der(&cert);
    for (data, why) in [
        ("%%%not base64%%%".to_string(), "not base64"),
        (
            b64(b"hello, not a certificate", false),
            "no PEM CERTIFICATE block",
        ),
        (b64(b"-----BEGIN CERTIFICATE-----\nAAAA\n", false), "no end"),
        (
            b64(
                b"-----BEGIN CERTIFICATE-----\n%%\n-----END CERTIFICATE-----\n",
                false,
            ),
            "not base64",
        ),
        (b64(&d[..d.len() / 2], false), "truncated"),
        (b64(&[0x30, 0x80, 0, 0], false), "length form"),
        (
            b64(&[0x30, 0x03, 0x02, 0x01, 0x01], false),
            "tag 0x02 where 0x30",
        ),
    ] {
        let f = from_credentials(&auth(serde_json::json!({"client-certificate-data": data})));
        assert!(f.name.is_none(), "{data}");
        assert_eq!(f.notes.len(), 1, "{data}: {:?}", f.notes);
        assert!(f.notes[0].contains(why), "{data}: {:?}", f.notes);
    }
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate": "/nonexistent/c.pem"}),
    ));
    assert!(f.name.is_none());
    assert!(f.notes[0].contains("unreadable"), "{:?}", f.notes);
}

#[test]
fn a_pod_bound_token_names_its_node_inline_and_from_the_token_file() {
    let token = jwt(&bound_claims("node-7.eu-west-1.compute.internal"));
    let f = from_credentials(&auth(serde_json::json!({"token": token})));
    let n = f.name.unwrap();
    assert_eq!(n.name, "node-7.eu-west-1.compute.internal");
    assert_eq!(n.from, NameFrom::TokenClaim);
    assert!(
        n.detail.ends_with("of the kubeconfig token"),
        "{}",
        n.detail
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{}\n", jwt(&bound_claims("bar")))).unwrap();
    let f = from_credentials(&auth(
        serde_json::json!({"tokenFile": file.to_str().unwrap()}),
    ));
    assert_eq!(f.name.unwrap().name, "bar");
    // a certificate and a token: the certificate's (the API server reads it first)
    let (cert, _) = certificate(dir.path(), "/CN=system:node:foo");
    let f = from_credentials(&auth(serde_json::json!({
        "client-certificate": cert.to_str().unwrap(), "token": jwt(&bound_claims("bar"))})));
    assert_eq!(f.name.unwrap().name, "foo");
}

#[test]
fn tokens_without_a_node_or_malformed_are_no_name() {
    // a token not bound to a pod (kubectl create token), and an opaque static token
    let mut unbound = bound_claims("x");
    unbound["kubernetes.io"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k == "namespace" || k == "serviceaccount");
    for t in [
        jwt(&unbound),
        "abcdef.0123456789abcdef".into(),
        "opaque".into(),
    ] {
        assert_eq!(
            from_credentials(&auth(serde_json::json!({"token": t}))),
            Found::default()
        );
    }
    for (t, why) in [
        ("a.%%%.c".to_string(), "not base64url"),
        (format!("a.{}.c", b64(b"not json", true)), "not JSON"),
    ] {
        let f = from_credentials(&auth(serde_json::json!({"token": t})));
        assert!(f.name.is_none());
        assert!(f.notes[0].contains(why), "{:?}", f.notes);
    }
    let f = from_credentials(&auth(
        serde_json::json!({"token": jwt(&bound_claims("UPPER"))}),
    ));
    assert!(f.name.is_none());
    assert!(f.notes[0].contains("not a node name"), "{:?}", f.notes);
    let f = from_credentials(&auth(
        serde_json::json!({"tokenFile": "/nonexistent/token"}),
    ));
    assert!(f.notes[0].contains("unreadable"), "{:?}", f.notes);
}

#[test]
fn base64_of_both_alphabets_padded_or_not() {
    for s in [
        &b""[..],
        b"f",
        b"fo",
        b"foo",
        b"foob",
        b"fooba",
        b"foobar",
        &[0xfb, 0xff, 0xfe],
    ] {
        assert_eq!(decode_base64(&b64(s, false)).as_deref(), Some(s));
        assert_eq!(decode_base64(&b64(s, true)).as_deref(), Some(s));
    }
    assert_eq!(decode_base64("Zm9v\nYmFy\r\n").unwrap(), b"foobar");
    for bad in ["Z", "Zm9vY", "Zg===", "Zg=x", "Zm9v!", "Z=g"] {
        assert_eq!(decode_base64(bad), None, "{bad}");
    }
}

proptest! {
    /// Arbitrary bytes, and every cut of a real certificate, read as a certificate or a
    /// token: an answer, never a panic.
    #[test]
    fn nothing_panics_on_arbitrary_input(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = subject_cn(&bytes);
        let _ = certificate_cn(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        let _ = decode_base64(&text);
        let _ = token_node_name(&text);
        let mut cert = vec![0x30, 0x82, 0x01, 0x00];
        cert.extend_from_slice(&bytes);
        let _ = subject_cn(&cert);
    }
}

#[test]
fn every_cut_of_a_real_certificate_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = certificate(dir.path(), "/O=system:nodes/CN=system:node:foo");
    let d = der(&cert);
    assert_eq!(subject_cn(&d), Ok(Some("system:node:foo".into())));
    for cut in 0..d.len() {
        assert!(subject_cn(&d[..cut]).is_err(), "cut at {cut}");
    }
}
