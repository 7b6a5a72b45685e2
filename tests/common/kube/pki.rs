//! The test cluster's PKI, made with the `openssl` command line (Debian's openssl, on every
//! machine of this kind): one CA, the API server's serving certificate (127.0.0.1, localhost),
//! (and 10.0.2.100, the VM test's guest's view of it), a client certificate per identity (the name as CN, the groups as O, exactly what the API
//! server's x509 authenticator reads), the service-account signing key. EC P-256 keys in
//! PKCS#8: quick to make and read by Go, rustls and kube-rs alike.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A client identity: its certificate and key files.
#[derive(Clone, Debug)]
pub struct Identity {
    pub user: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl (Debian's openssl package)");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn key(path: &Path) {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        path.to_str().unwrap(),
    ]);
}

impl Pki {
    /// Makes the CA, the serving certificate and the service-account key in `dir`.
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let p = |n: &str| dir.join(n);
        let pki = Pki {
            dir: dir.to_owned(),
            ca: p("ca.crt"),
            ca_key: p("ca.key"),
            serving_cert: p("apiserver.crt"),
            serving_key: p("apiserver.key"),
            sa_key: p("sa.key"),
            sa_pub: p("sa.pub"),
        };
        key(&pki.ca_key);
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            pki.ca_key.to_str().unwrap(),
            "-subj",
            "/CN=reaplet-test-ca",
            "-days",
            "30",
            "-out",
            pki.ca.to_str().unwrap(),
        ]);
        pki.sign(
            &pki.serving_key,
            &pki.serving_cert,
            "/CN=kube-apiserver",
            // 10.0.2.100: the address the VM test's guest reaches it at (qemu's guestfwd)
            "subjectAltName=IP:127.0.0.1,IP:10.0.2.100,DNS:localhost,DNS:kubernetes\nextendedKeyUsage=serverAuth",
        );
        key(&pki.sa_key);
        openssl(&[
            "pkey",
            "-in",
            pki.sa_key.to_str().unwrap(),
            "-pubout",
            "-out",
            pki.sa_pub.to_str().unwrap(),
        ]);
        pki
    }

    fn sign(&self, key_path: &Path, cert: &Path, subj: &str, ext: &str) {
        key(key_path);
        let csr = cert.with_extension("csr");
        let extfile = cert.with_extension("ext");
        std::fs::write(&extfile, ext).unwrap();
        openssl(&[
            "req",
            "-new",
            "-key",
            key_path.to_str().unwrap(),
            "-subj",
            subj,
            "-out",
            csr.to_str().unwrap(),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            csr.to_str().unwrap(),
            "-CA",
            self.ca.to_str().unwrap(),
            "-CAkey",
            self.ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            extfile.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ]);
    }

    /// A client certificate for `user` in `groups` (e.g. `system:node:n1` in `system:nodes`).
    pub fn client(&self, user: &str, groups: &[&str]) -> Identity {
        let file = user.replace(':', "_");
        let cert = self.dir.join(format!("{file}.crt"));
        let key_path = self.dir.join(format!("{file}.key"));
        if !cert.exists() {
            let mut subj = String::new();
            for g in groups {
                subj.push_str(&format!("/O={g}"));
            }
            subj.push_str(&format!("/CN={user}"));
            self.sign(&key_path, &cert, &subj, "extendedKeyUsage=clientAuth");
        }
        Identity {
            user: user.to_owned(),
            cert,
            key: key_path,
        }
    }

    /// A kubeconfig for `id` talking to `server` (file paths, not embedded data).
    pub fn kubeconfig(&self, server: &str, id: &Identity, path: &Path) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n",
            ca = self.ca.display(),
            user = id.user,
            cert = id.cert.display(),
            key = id.key.display(),
        );
        std::fs::write(path, text).unwrap();
        path.to_owned()
    }
}
