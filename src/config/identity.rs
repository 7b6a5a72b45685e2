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
//!   `kubelet-client-current.pem`), read with the small DER reader below: the CN is the last
//!   one of the subject, as the API server's x509 authenticator reads it;
//! * a pod-bound service-account token (the DaemonSet's projected token, or a token in the
//!   kubeconfig), whose JWT carries the private claim `kubernetes.io` → `node` → `name` (the
//!   API server's user extra `authentication.kubernetes.io/node-name`). The token's signature
//!   is not checked: the API server does that; only what it will say is read.
//!
//! Invariants:
//! * malformed input (bad base64, bad PEM or DER, no CN, a JWT that is not one) is no name and a
//!   note for the start-up log ([`Found::notes`]), never a panic nor an error;
//! * a name that is not a valid node name (DNS subdomain) is no name (noted);
//! * the certificate wins over a token when both are given (the API server authenticates the
//!   certificate first); an exec plugin or auth provider carries no name here.

use std::fmt;

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

/// What the credentials say: a name, or none, and what could not be read in them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub name: Option<CredentialsName>,
    /// Parts that could not be read (logged at start; never an error).
    pub notes: Vec<String>,
}

/// The credentials of `auth` (a kubeconfig's user, or the in-cluster token file).
pub fn from_credentials(auth: &kube::config::AuthInfo) -> Found {
    let mut found = Found::default();
    let cert = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => Some((
            decode_base64(data).ok_or_else(|| "not base64".to_string()),
            "client-certificate-data".to_string(),
        )),
        (None, Some(path)) => Some((
            std::fs::read(path).map_err(|e| format!("unreadable: {e}")),
            format!("client certificate {path}"),
        )),
        (None, None) => None,
    };
    if let Some((bytes, what)) = cert {
        match bytes.and_then(|b| certificate_cn(&b)) {
            Ok(cn) => match cn.strip_prefix(NODE_USER_PREFIX) {
                Some(name) if super::values::is_dns_subdomain(name) => {
                    found.name = Some(CredentialsName {
                        name: name.to_owned(),
                        from: NameFrom::Certificate,
                        detail: format!("CN={cn} of {what}"),
                    });
                    return found;
                }
                Some(name) => found
                    .notes
                    .push(format!("{what}: CN {cn:?}: {name:?} is not a node name")),
                // another identity (an admin, a service account's certificate): no name
                None => {}
            },
            Err(why) => found.notes.push(format!("{what}: {why}")),
        }
    }
    // the token: inline (kubeconfig `token`, kept secret by kube: read through its own
    // serialisation), else the file (the in-cluster projected token)
    let inline = serde_json::to_value(auth)
        .ok()
        .and_then(|v| v.get("token")?.as_str().map(str::to_owned));
    let token = match (inline, &auth.token_file) {
        (Some(t), _) => Some((Ok(t), "kubeconfig token".to_string())),
        (None, Some(path)) => Some((
            std::fs::read_to_string(path).map_err(|e| format!("unreadable: {e}")),
            format!("token file {path}"),
        )),
        (None, None) => None,
    };
    if let Some((text, what)) = token {
        match text.and_then(|t| token_node_name(t.trim())) {
            Ok(Some(name)) if super::values::is_dns_subdomain(&name) => {
                found.name = Some(CredentialsName {
                    detail: format!("claim kubernetes.io.node.name={name} of the {what}"),
                    name,
                    from: NameFrom::TokenClaim,
                });
            }
            Ok(Some(name)) => found
                .notes
                .push(format!("{what}: node claim {name:?} is not a node name")),
            // not bound to a pod on a node (or no JWT at all: a static token): no name
            Ok(None) => {}
            Err(why) => found.notes.push(format!("{what}: {why}")),
        }
    }
    found
}

/// The user name prefix of a node identity (`system:node:<name>`).
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The subject CN of the first certificate in `bytes` (PEM, or DER as it is).
pub fn certificate_cn(bytes: &[u8]) -> Result<String, String> {
    let der = if bytes.first() == Some(&0x30) {
        bytes.to_vec()
    } else {
        pem_certificate(bytes)?
    };
    match subject_cn(&der) {
        Ok(Some(cn)) => Ok(cn),
        Ok(None) => Err("the certificate's subject has no CN".into()),
        Err(e) => Err(format!("not a certificate: {e}")),
    }
}

/// The DER of the first `CERTIFICATE` block of PEM text.
fn pem_certificate(bytes: &[u8]) -> Result<Vec<u8>, String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = std::str::from_utf8(bytes).map_err(|_| "neither PEM nor DER".to_string())?;
    let start = text
        .find(BEGIN)
        .ok_or_else(|| "no PEM CERTIFICATE block".to_string())?
        + BEGIN.len();
    let len = text[start..]
        .find(END)
        .ok_or_else(|| "a PEM CERTIFICATE block with no end".to_string())?;
    decode_base64(&text[start..start + len]).ok_or_else(|| "a PEM block that is not base64".into())
}

/// Decodes base64 of either alphabet (standard or URL-safe), padded or not, ignoring ASCII
/// white space (PEM's line breaks); `None` for anything else.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits, mut padding) = (0u32, 0u32, 0usize);
    let mut digits = 0usize;
    for b in text.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => continue,
            _ => return None,
        };
        // nothing after padding
        if padding > 0 {
            return None;
        }
        digits += 1;
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // a lone digit is no byte; padding only completes a group of four (left-over bits are
    // ignored, as Go's decoder does)
    let rem = digits % 4;
    let ok = rem != 1 && padding <= 2 && (padding == 0 || (rem + padding).is_multiple_of(4));
    ok.then_some(out)
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
pub fn subject_cn(der: &[u8]) -> Result<Option<String>, DerError> {
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
/// payload cannot be read.
pub fn token_node_name(token: &str) -> Result<Option<String>, String> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        // not a JWT: a static or bootstrap token carries no claims
        return Ok(None);
    };
    let bytes = decode_base64(payload).ok_or("a JWT payload that is not base64url")?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| "a JWT payload that is not JSON")?;
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
