//! The node's name as reaplet's API credentials carry it, read locally before anything starts
//! (no request). The kubelet's counterpart is the other way round: its name is
//! `--hostname-override` or the host name (`nodeutil.GetHostname`), and the API server checks
//! that its certificate says the same (`system:node:<name>`, the Node authorizer and
//! NodeRestriction). reaplet beside a kubelet registered under another name than the host's (a
//! cloud's private DNS name, kubeadm's `--hostname-override`) must act as that name, and its
//! credentials usually say it:
//!
//! * a client certificate whose subject CN is `system:node:<name>` (the node's own kubeconfig:
//!   `client-certificate-data`, or a `client-certificate` file such as the kubelet's
//!   `kubelet-client-current.pem`), decoded as kube decodes it (standard base64, the first PEM
//!   `CERTIFICATE` block) and read with the small DER reader below: the CN is the last one of
//!   the subject, as the API server's x509 authenticator reads it;
//! * a pod-bound service-account token (the DaemonSet's projected token, or a token in the
//!   kubeconfig), whose JWT carries the private claim `kubernetes.io` → `node` → `name` (the
//!   API server's user extra `authentication.kubernetes.io/node-name`). The token's signature
//!   is not checked: the API server does that; only what it will say is read.
//!
//! Invariants:
//! * malformed input (bad base64, bad PEM or DER, no CN, a JWT that is not one, an unreadable
//!   file) is no name and an [`IdentityError`] for the start-up log ([`Found::problem`]), never a
//!   panic nor a configuration error;
//! * a name that is not a valid node name (DNS subdomain) is no name (and a problem);
//! * a client certificate, when the credentials have one, decides alone: the API server
//!   authenticates a request's client certificate before any token (x509 before the token
//!   authenticators) and never reads a token beside it, so a certificate of another identity
//!   (an admin's) is no name even beside a token with a node claim;
//! * the token is read in place (kube keeps it secret), never copied with the other secrets;
//!   an exec plugin or auth provider carries no name here.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use secrecy::ExposeSecret as _;

/// Where the node's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameFrom {
    /// `CN=system:node:<name>` of the client certificate.
    Certificate,
    /// The `kubernetes.io` → `node` → `name` claim of a pod-bound service-account token.
    TokenClaim,
    /// `hostnameOverride` (`--hostname-override`, `REAPLET_HOSTNAME_OVERRIDE`, the config file).
    HostnameOverride,
    /// The host's name, lower-cased (as the kubelet's default).
    HostName,
}

impl NameFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Certificate => "credentials certificate",
            Self::TokenClaim => "token claim",
            Self::HostnameOverride => "--hostname-override",
            Self::HostName => "host name",
        }
    }
}

/// A node name the credentials carry, and which of their parts says it (for the messages:
/// `CN=system:node:n of client certificate /etc/kubernetes/pki/kubelet.pem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialsName {
    pub name: String,
    pub from: NameFrom,
    pub detail: String,
}

impl fmt::Display for CredentialsName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// The part of the credentials a name or a problem is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The kubeconfig's `client-certificate-data`.
    CertificateData,
    /// A `client-certificate` file.
    CertificateFile(String),
    /// The kubeconfig's `token`.
    Token,
    /// A `tokenFile` (the in-cluster projected token).
    TokenFile(String),
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CertificateData => f.write_str("client-certificate-data"),
            Self::CertificateFile(path) => write!(f, "client certificate {path}"),
            Self::Token => f.write_str("kubeconfig token"),
            Self::TokenFile(path) => write!(f, "token file {path}"),
        }
    }
}

/// Why the credentials name no node although they might: each says which part of them.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{part}: unreadable: {source}")]
    Unreadable { part: Part, source: std::io::Error },
    #[error("{part}: not base64: {source}")]
    NotBase64 {
        part: Part,
        source: base64::DecodeError,
    },
    #[error("{part}: not PEM: {source}")]
    NotPem { part: Part, source: pem::PemError },
    #[error("{part}: no PEM CERTIFICATE block")]
    NoCertificateBlock { part: Part },
    #[error("{part}: not a certificate: {source}")]
    Der { part: Part, source: DerError },
    #[error("{part}: the certificate's subject has no CN")]
    NoCommonName { part: Part },
    #[error("{part}: a JWT payload that is not base64url: {source}")]
    TokenNotBase64 {
        part: Part,
        source: base64::DecodeError,
    },
    #[error("{part}: a JWT payload that is not JSON: {source}")]
    TokenNotJson {
        part: Part,
        source: serde_json::Error,
    },
    /// `CN=system:node:<name>` or the node claim, with a name the API server would not have
    /// registered.
    #[error("{part}: names the node {name:?}, which is not a node name (a DNS subdomain)")]
    NotANodeName { part: Part, name: String },
}

/// What the credentials say: a name, or none, and why none when they might have said one.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub name: Option<CredentialsName>,
    /// The part that could not be read (logged at start; never an error). Shared, as the
    /// settings that hold it are cloned.
    pub problem: Option<Arc<IdentityError>>,
}

/// The same name, and the same problem: the one reading, cloned (the I/O and JSON errors in a
/// problem have no equality of their own).
impl PartialEq for Found {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && match (&self.problem, &other.problem) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// The credentials of `auth` (a kubeconfig's user, or the in-cluster token file): the client
/// certificate's when there is one, else the token's.
pub fn from_credentials(auth: &kube::config::AuthInfo) -> Found {
    let has_certificate =
        auth.client_certificate_data.is_some() || auth.client_certificate.is_some();
    let read = if has_certificate {
        cert_name(auth)
    } else {
        token_name(auth)
    };
    match read {
        Ok(name) => Found {
            name,
            problem: None,
        },
        Err(e) => Found {
            name: None,
            problem: Some(Arc::new(e)),
        },
    }
}

/// The user name prefix of a node identity (`system:node:<name>`).
const NODE_USER_PREFIX: &str = "system:node:";

/// The node a client certificate names (`client-certificate-data` over `client-certificate`,
/// as kube reads them): `None` without one, or for another identity (an admin, a service
/// account's certificate).
fn cert_name(auth: &kube::config::AuthInfo) -> Result<Option<CredentialsName>, IdentityError> {
    let (part, bytes) = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => {
            let part = Part::CertificateData;
            match STANDARD.decode(data) {
                Ok(bytes) => (part, bytes),
                Err(source) => return Err(IdentityError::NotBase64 { part, source }),
            }
        }
        (None, Some(path)) => {
            let part = Part::CertificateFile(path.clone());
            match std::fs::read(path) {
                Ok(bytes) => (part, bytes),
                Err(source) => return Err(IdentityError::Unreadable { part, source }),
            }
        }
        (None, None) => return Ok(None),
    };
    let cn = certificate_cn(&bytes, &part)?;
    let Some(name) = cn.strip_prefix(NODE_USER_PREFIX) else {
        return Ok(None);
    };
    if !super::values::is_dns_subdomain(name) {
        let name = name.to_owned();
        return Err(IdentityError::NotANodeName { part, name });
    }
    Ok(Some(CredentialsName {
        name: name.to_owned(),
        from: NameFrom::Certificate,
        detail: format!("CN={cn} of {part}"),
    }))
}

/// The node a token's claim names (the kubeconfig's `token`, else its `tokenFile`: the
/// in-cluster projected token): `None` without one, or for a token not bound to a node.
fn token_name(auth: &kube::config::AuthInfo) -> Result<Option<CredentialsName>, IdentityError> {
    let (part, token): (Part, Cow<'_, str>) = match (&auth.token, &auth.token_file) {
        (Some(token), _) => (Part::Token, Cow::Borrowed(token.expose_secret())),
        (None, Some(path)) => {
            let part = Part::TokenFile(path.clone());
            match std::fs::read_to_string(path) {
                Ok(text) => (part, Cow::Owned(text)),
                Err(source) => return Err(IdentityError::Unreadable { part, source }),
            }
        }
        (None, None) => return Ok(None),
    };
    let Some(name) = token_node_name(token.trim(), &part)? else {
        return Ok(None);
    };
    if !super::values::is_dns_subdomain(&name) {
        return Err(IdentityError::NotANodeName { part, name });
    }
    Ok(Some(CredentialsName {
        detail: format!("claim kubernetes.io.node.name={name} of the {part}"),
        name,
        from: NameFrom::TokenClaim,
    }))
}

/// The subject CN of the first certificate in `bytes` (PEM: the first `CERTIFICATE` block, as
/// the kubelet's `kubelet-client-current.pem` holds the key first; or DER as it is).
fn certificate_cn(bytes: &[u8], part: &Part) -> Result<String, IdentityError> {
    let der = if bytes.first() == Some(&SEQUENCE) {
        Cow::Borrowed(bytes)
    } else {
        let blocks = pem::parse_many(bytes).map_err(|source| IdentityError::NotPem {
            part: part.clone(),
            source,
        })?;
        let block = blocks
            .into_iter()
            .find(|b| b.tag() == "CERTIFICATE")
            .ok_or_else(|| IdentityError::NoCertificateBlock { part: part.clone() })?;
        Cow::Owned(block.into_contents())
    };
    match subject_cn(&der) {
        Ok(Some(cn)) => Ok(cn),
        Ok(None) => Err(IdentityError::NoCommonName { part: part.clone() }),
        Err(source) => Err(IdentityError::Der {
            part: part.clone(),
            source,
        }),
    }
}

/// A DER reading problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DerError {
    #[error("truncated")]
    Truncated,
    #[error("tag {found:#04x} where {expected:#04x} was expected")]
    UnexpectedTag { expected: u8, found: u8 },
    #[error("a length form DER does not allow")]
    BadLength,
    #[error("a multi-byte tag")]
    LongTag,
    #[error("a CN that is not text")]
    NotText,
}

/// One DER element: (tag, contents, what follows).
fn element(buf: &[u8]) -> Result<(u8, &[u8], &[u8]), DerError> {
    let (&tag, rest) = buf.split_first().ok_or(DerError::Truncated)?;
    if tag & 0x1f == 0x1f {
        return Err(DerError::LongTag);
    }
    let (&first, rest) = rest.split_first().ok_or(DerError::Truncated)?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        // indefinite (0x80) is BER only; more than 4 length bytes is no certificate
        0x81..=0x84 => {
            let n = usize::from(first & 0x7f);
            if rest.len() < n {
                return Err(DerError::Truncated);
            }
            let (bytes, rest) = rest.split_at(n);
            if bytes[0] == 0 || (n == 1 && bytes[0] < 0x80) {
                return Err(DerError::BadLength);
            }
            let len = bytes
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, rest)
        }
        _ => return Err(DerError::BadLength),
    };
    if rest.len() < len {
        return Err(DerError::Truncated);
    }
    let (contents, rest) = rest.split_at(len);
    Ok((tag, contents, rest))
}

/// The element of tag `expected` at the start of `buf`: (contents, what follows).
fn expect(buf: &[u8], expected: u8) -> Result<(&[u8], &[u8]), DerError> {
    let (tag, contents, rest) = element(buf)?;
    if tag != expected {
        return Err(DerError::UnexpectedTag {
            expected,
            found: tag,
        });
    }
    Ok((contents, rest))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OID: u8 = 0x06;
/// `[0] EXPLICIT Version` of a v2/v3 certificate.
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// The last CN of an X.509 certificate's subject (RFC 5280 §4.1: `Certificate ::= SEQUENCE {
/// tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer, validity,
/// subject, ... }, ... }`); `None` when the subject has none.
fn subject_cn(der: &[u8]) -> Result<Option<String>, DerError> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    if rest.first() == Some(&VERSION) {
        rest = element(rest)?.2;
    }
    rest = expect(rest, INTEGER)?.1; // serialNumber
    rest = expect(rest, SEQUENCE)?.1; // signature
    rest = expect(rest, SEQUENCE)?.1; // issuer
    rest = expect(rest, SEQUENCE)?.1; // validity
    let (mut rdns, _) = expect(rest, SEQUENCE)?; // subject
    let mut cn = None;
    while !rdns.is_empty() {
        let (mut set, next) = expect(rdns, SET)?;
        rdns = next;
        while !set.is_empty() {
            let (atv, next) = expect(set, SEQUENCE)?;
            set = next;
            let (oid, value) = expect(atv, OID)?;
            if oid == COMMON_NAME {
                let (tag, text, _) = element(value)?;
                cn = Some(directory_string(tag, text)?);
            }
        }
    }
    Ok(cn)
}

/// A DirectoryString's text: UTF8String, PrintableString, IA5String, TeletexString (read as
/// Latin-1, as Go does) or BMPString (UCS-2).
fn directory_string(tag: u8, bytes: &[u8]) -> Result<String, DerError> {
    match tag {
        0x0c | 0x13 | 0x16 => String::from_utf8(bytes.to_vec()).map_err(|_| DerError::NotText),
        0x14 => Ok(bytes.iter().map(|b| char::from(*b)).collect()),
        0x1e if bytes.len().is_multiple_of(2) => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).map_err(|_| DerError::NotText)
        }
        _ => Err(DerError::NotText),
    }
}

/// The node claim of a service-account JWT: `Ok(None)` for a token that has none (not
/// pod-bound, a pod not yet on a node, or an opaque static token), `Err` for a JWT whose
/// payload cannot be read. The payload is base64url without padding, as a JWS's parts are
/// (RFC 7515 §2).
fn token_node_name(token: &str, part: &Part) -> Result<Option<String>, IdentityError> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        // not a JWT: a static or bootstrap token carries no claims
        return Ok(None);
    };
    let bytes =
        URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|source| IdentityError::TokenNotBase64 {
                part: part.clone(),
                source,
            })?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|source| IdentityError::TokenNotJson {
            part: part.clone(),
            source,
        })?;
    Ok(claims
        .get("kubernetes.io")
        .and_then(|k| k.get("node"))
        .and_then(|n| n.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_owned))
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
