//! The node name in credentials ([`super`]): real certificates made here with Debian's
//! `openssl` (as the test bed's PKI makes them), JWTs of the API server's claim layout, and
//! malformed input of every kind (never a panic, never a name: an [`IdentityError`] of its
//! kind, naming the part it is in).

use super::*;
use base64::engine::general_purpose::URL_SAFE;
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
fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Base64url without padding (a JWT's parts).
fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT with `claims` (base64url, no padding; the signature is not read).
fn jwt(claims: &serde_json::Value) -> String {
    let header = br#"{"alg":"RS256","kid":"k"}"#;
    format!(
        "{}.{}.{}",
        b64url(header),
        b64url(claims.to_string().as_bytes()),
        b64url(b"not-a-signature")
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

/// The problem `f` holds (none: `None`).
fn problem(f: &Found) -> Option<&IdentityError> {
    f.problem.as_deref()
}

#[test]
fn a_node_certificate_names_the_node_in_pem_der_data_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "/O=system:nodes/CN=system:node:foo");
    let pem = std::fs::read(&cert).unwrap();
    let part = Part::CertificateData;
    assert_eq!(certificate_cn(&pem, &part).unwrap(), "system:node:foo");
    assert_eq!(
        certificate_cn(&der(&cert), &part).unwrap(),
        "system:node:foo"
    );
    // the kubeconfig's client-certificate-data
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate-data": b64(&pem)}),
    ));
    assert!(f.problem.is_none(), "{f:?}");
    let n = f.name.unwrap();
    assert_eq!((n.name.as_str(), n.from), ("foo", NameFrom::Certificate));
    assert_eq!(n.detail, "CN=system:node:foo of client-certificate-data");
    // the kubelet's kubelet-client-current.pem: key and certificate in one file, key first
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
        certificate_cn(&std::fs::read(&two).unwrap(), &Part::CertificateData).unwrap(),
        "system:node:bar"
    );
    // an admin's certificate: no name, nothing to say
    let (admin, _) = certificate(dir.path(), "/O=system:masters/CN=admin");
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate": admin.to_str().unwrap()}),
    ));
    assert_eq!(f, Found::default());
    // a node user whose name is no node name: no name, and the problem in that file
    let (bad, _) = certificate(dir.path(), "/CN=system:node:Not_A_Name");
    let path = bad.to_str().unwrap();
    let f = from_credentials(&auth(serde_json::json!({"client-certificate": path})));
    assert!(f.name.is_none());
    assert!(
        matches!(problem(&f), Some(IdentityError::NotANodeName {
            part: Part::CertificateFile(p), name,
        }) if p == path && name == "Not_A_Name"),
        "{f:?}"
    );
    // no CN at all
    let (none, _) = certificate(dir.path(), "/O=system:nodes");
    assert!(matches!(
        certificate_cn(&std::fs::read(&none).unwrap(), &Part::CertificateData),
        Err(IdentityError::NoCommonName {
            part: Part::CertificateData
        })
    ));
}

#[test]
fn malformed_certificates_are_no_name_and_a_problem_of_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path(), "/CN=system:node:foo");
    let d = der(&cert);
    type Kind = fn(&IdentityError) -> bool;
    let cases: [(String, Kind); 9] = [
        ("%%%not base64%%%".into(), |e| {
            matches!(e, IdentityError::NotBase64 { .. })
        }),
        // the URL-safe alphabet, unpadded, is not what kube reads either
        (b64url(&[0xfb, 0xff]), |e| {
            matches!(e, IdentityError::NotBase64 { .. })
        }),
        (b64(b"hello, not a certificate"), |e| {
            matches!(e, IdentityError::NoCertificateBlock { .. })
        }),
        // the key alone (the key half of kubelet-client-current.pem)
        (b64(&std::fs::read(&key).unwrap()), |e| {
            matches!(e, IdentityError::NoCertificateBlock { .. })
        }),
        // a block with no end is no block
        (b64(b"-----BEGIN CERTIFICATE-----\nAAAA\n"), |e| {
            matches!(e, IdentityError::NoCertificateBlock { .. })
        }),
        (
            b64(b"-----BEGIN CERTIFICATE-----\n%%\n-----END CERTIFICATE-----\n"),
            |e| {
                matches!(
                    e,
                    IdentityError::NotPem {
                        source: pem::PemError::InvalidData(_),
                        ..
                    }
                )
            },
        ),
        (b64(&d[..d.len() / 2]), |e| {
            matches!(
                e,
                IdentityError::Der {
                    source: DerError::Truncated,
                    ..
                }
            )
        }),
        (b64(&[0x30, 0x80, 0, 0]), |e| {
            matches!(
                e,
                IdentityError::Der {
                    source: DerError::BadLength,
                    ..
                }
            )
        }),
        (b64(&[0x30, 0x03, 0x02, 0x01, 0x01]), |e| {
            matches!(
                e,
                IdentityError::Der {
                    source: DerError::UnexpectedTag {
                        expected: 0x30,
                        found: 0x02
                    },
                    ..
                }
            )
        }),
    ];
    for (data, kind) in cases {
        let f = from_credentials(&auth(serde_json::json!({"client-certificate-data": data})));
        assert!(f.name.is_none(), "{data}");
        let e = problem(&f).unwrap_or_else(|| panic!("{data}: no problem"));
        assert!(kind(e), "{data}: {e:?}");
        assert!(
            matches!(
                e,
                IdentityError::NotBase64 {
                    part: Part::CertificateData,
                    ..
                } | IdentityError::NoCertificateBlock {
                    part: Part::CertificateData
                } | IdentityError::NotPem {
                    part: Part::CertificateData,
                    ..
                } | IdentityError::Der {
                    part: Part::CertificateData,
                    ..
                }
            ),
            "{e:?}"
        );
    }
    let f = from_credentials(&auth(
        serde_json::json!({"client-certificate": "/nonexistent/c.pem"}),
    ));
    assert!(f.name.is_none());
    assert!(
        matches!(problem(&f), Some(IdentityError::Unreadable {
            part: Part::CertificateFile(p), source,
        }) if p == "/nonexistent/c.pem" && source.kind() == std::io::ErrorKind::NotFound),
        "{f:?}"
    );
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
    // a node's certificate and a token: the certificate's (the API server reads it first)
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
    // a JWS's parts are base64url without padding (RFC 7515 §2): padded is not one
    let mut claims = bound_claims("padded").to_string();
    while claims.len().is_multiple_of(3) {
        claims.push(' ');
    }
    let padded = URL_SAFE.encode(&claims);
    assert!(padded.ends_with('='), "{padded}");
    let unpadded = format!("a.{}.c", b64url(claims.as_bytes()));
    assert_eq!(
        token_node_name(&unpadded, &Part::Token).unwrap().as_deref(),
        Some("padded")
    );
    type Kind = fn(&IdentityError) -> bool;
    let cases: [(String, Kind); 3] = [
        ("a.%%%.c".into(), |e| {
            matches!(
                e,
                IdentityError::TokenNotBase64 {
                    part: Part::Token,
                    ..
                }
            )
        }),
        (format!("a.{padded}.c"), |e| {
            matches!(
                e,
                IdentityError::TokenNotBase64 {
                    part: Part::Token,
                    ..
                }
            )
        }),
        (format!("a.{}.c", b64url(b"not json")), |e| {
            matches!(
                e,
                IdentityError::TokenNotJson {
                    part: Part::Token,
                    ..
                }
            )
        }),
    ];
    for (t, kind) in cases {
        let f = from_credentials(&auth(serde_json::json!({"token": t})));
        assert!(f.name.is_none(), "{t}");
        assert!(problem(&f).is_some_and(kind), "{t}: {f:?}");
    }
    let f = from_credentials(&auth(
        serde_json::json!({"token": jwt(&bound_claims("UPPER"))}),
    ));
    assert!(f.name.is_none());
    assert!(
        matches!(problem(&f), Some(IdentityError::NotANodeName {
            part: Part::Token, name,
        }) if name == "UPPER"),
        "{f:?}"
    );
    let f = from_credentials(&auth(
        serde_json::json!({"tokenFile": "/nonexistent/token"}),
    ));
    assert!(f.name.is_none());
    assert!(
        matches!(problem(&f), Some(IdentityError::Unreadable {
            part: Part::TokenFile(p), ..
        }) if p == "/nonexistent/token"),
        "{f:?}"
    );
}

/// The API server runs its x509 authenticator before the token ones: with a client certificate
/// in the kubeconfig the request is the certificate's user, and a token beside it is never
/// read. An admin's certificate and a node-bound token: no name (not the token's node); a
/// certificate that cannot be read beside one: its problem, still not the token's node.
#[test]
fn a_certificate_of_another_identity_hides_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, _) = certificate(dir.path(), "/O=system:masters/CN=kubernetes-admin");
    let f = from_credentials(&auth(serde_json::json!({
        "client-certificate": admin.to_str().unwrap(),
        "token": jwt(&bound_claims("bar")),
    })));
    assert_eq!(f, Found::default());
    let f = from_credentials(&auth(serde_json::json!({
        "client-certificate-data": b64(b"not a certificate"),
        "token": jwt(&bound_claims("bar")),
    })));
    assert!(f.name.is_none(), "{f:?}");
    assert!(
        matches!(
            problem(&f),
            Some(IdentityError::NoCertificateBlock {
                part: Part::CertificateData
            })
        ),
        "{f:?}"
    );
}

proptest! {
    /// Arbitrary bytes read as a certificate (DER, PEM, or the kubeconfig's data) or a token:
    /// an answer, never a panic.
    #[test]
    fn nothing_panics_on_arbitrary_input(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = subject_cn(&bytes);
        let _ = certificate_cn(&bytes, &Part::CertificateData);
        let _ = from_credentials(&auth(serde_json::json!({"client-certificate-data": b64(&bytes)})));
        let text = String::from_utf8_lossy(&bytes);
        let _ = token_node_name(&text, &Part::Token);
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
