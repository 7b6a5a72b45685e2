//! Where standby probes the kubelet's health endpoint: the kubelet's `healthzPort` and
//! `healthzBindAddress` (its `KubeletConfiguration` fields, or reaplet's flags of the same names
//! `--healthz-port` and `--healthz-bind-address`), unless reaplet's own `kubeletHealthzURL`
//! names the endpoint. Counterpart of the kubelet's defaulting of those two fields
//! (`SetDefaults_KubeletConfiguration`: port 10248, address `127.0.0.1`), its validation (a port
//! is 0 or 1 to 65535) and of `cmd/kubelet/app/server.go`, which serves `/healthz` only when the
//! port is above 0.
//!
//! Invariants:
//! * `kubeletHealthzURL`, set in any of reaplet's layers, wins over both fields wherever they
//!   come from; otherwise each field is layered like every other setting (flags > environment
//!   > reaplet's file > the kubelet's file > the kubelet's defaults);
//! * port 0 means the kubelet serves no health endpoint: the result is `None` (the Lease alone
//!   decides), never a URL that would always fail;
//! * an unspecified bind address is probed where the kubelet's wildcard socket answers:
//!   `0.0.0.0` on `127.0.0.1` (an IPv4 wildcard always listens there), `::` as the URL host
//!   `[::]`, which the probe tries on `::1`, then on `127.0.0.1` (a host whose loopback has no
//!   IPv6 has no `::1`: the kubelet's socket then answers on IPv4 alone;
//!   [`crate::standby::probe`]); empty is the default `127.0.0.1`;
//! * an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is the IPv4 address it maps (the
//!   kubelet, in Go, listens on IPv4 for it); any other IPv6 address is bracketed in the URL;
//! * every error is a [`ConfigError`] naming `healthzPort`, `healthzBindAddress` or
//!   `kubeletHealthzURL`.

use super::{ConfigError, err};
use std::net::IpAddr;

/// The kubelet's default `healthzPort`.
pub const DEFAULT_PORT: u16 = 10248;
/// The kubelet's default `healthzBindAddress`.
pub const DEFAULT_BIND_ADDRESS: &str = "127.0.0.1";

/// Where the chosen health endpoint came from (for the start-up line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthzFrom {
    /// reaplet's own `kubeletHealthzURL` (flag, environment or reaplet's file).
    Url,
    /// `healthzPort` / `healthzBindAddress` in reaplet's flags, environment or file (over the
    /// kubelet's file, field by field).
    Settings,
    /// `healthzPort` / `healthzBindAddress` in the kubelet's config file.
    KubeletConfig,
    /// Neither field anywhere: the kubelet's defaults.
    Defaults,
}

impl HealthzFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Url => "kubeletHealthzURL",
            Self::Settings => "healthzPort/healthzBindAddress in reaplet's settings",
            Self::KubeletConfig => "healthzPort/healthzBindAddress in the kubelet's config file",
            Self::Defaults => {
                "the kubelet's defaults (healthzPort 10248, healthzBindAddress 127.0.0.1)"
            }
        }
    }
}

/// The kubelet's health endpoint: `Some(url)`, or `None` when the kubelet serves none
/// (`healthzPort` 0). `url` is `kubeletHealthzURL`; `port` and `address` are the two kubelet
/// fields as layered (`Some` when any layer sets them).
pub(super) fn resolve(
    url: Option<String>,
    port: Option<String>,
    address: Option<String>,
) -> Result<(Option<String>, HealthzFrom), ConfigError> {
    // checked even when the URL wins: a bad value is a mistake wherever it is
    let p = parse_port(port.as_deref())?;
    let host = probe_host(address.as_deref())?;
    if let Some(url) = url {
        return Ok((Some(explicit_url(url)?), HealthzFrom::Url));
    }
    let from = if port.is_some() || address.is_some() {
        HealthzFrom::Settings
    } else {
        HealthzFrom::Defaults
    };
    Ok((p.map(|p| format!("http://{host}:{p}/healthz")), from))
}

/// `kubeletHealthzURL`, checked: an `http://` URL with a host.
fn explicit_url(url: String) -> Result<String, ConfigError> {
    let url = url.trim().to_owned();
    match url.parse::<hyper::Uri>() {
        Ok(u) if u.scheme_str() == Some("http") && u.host().is_some() => Ok(url),
        _ => Err(err(
            "kubeletHealthzURL",
            format!(
                "{url:?}: must be an http:// URL like {}",
                crate::standby::DEFAULT_HEALTHZ_URL
            ),
        )),
    }
}

/// `healthzPort`: `None` for 0 (no health endpoint), else the port (default 10248).
fn parse_port(v: Option<&str>) -> Result<Option<u16>, ConfigError> {
    let Some(v) = v else {
        return Ok(Some(DEFAULT_PORT));
    };
    let n: u16 = v.trim().parse().map_err(|_| {
        err(
            "healthzPort",
            format!("{v:?} must be 0 (no health endpoint) or a port from 1 to 65535"),
        )
    })?;
    Ok((n != 0).then_some(n))
}

/// The URL host to probe for `healthzBindAddress`: `0.0.0.0` on `127.0.0.1`, `::` as `[::]`
/// (the probe tries both loopbacks), an IPv4-mapped address as its IPv4 address, any other
/// IPv6 address in brackets, a host name as it is (lower-cased).
fn probe_host(v: Option<&str>) -> Result<String, ConfigError> {
    let v = v.map(str::trim).unwrap_or_default();
    let v = if v.is_empty() {
        DEFAULT_BIND_ADDRESS
    } else {
        v
    };
    let ip = v.parse::<IpAddr>().map(|a| match a {
        IpAddr::V6(a6) => a6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        a => a,
    });
    match ip {
        Ok(IpAddr::V4(a)) if a.is_unspecified() => Ok("127.0.0.1".into()),
        Ok(IpAddr::V6(a)) if a.is_unspecified() => Ok("[::]".into()),
        Ok(IpAddr::V4(a)) => Ok(a.to_string()),
        Ok(IpAddr::V6(a)) => Ok(format!("[{a}]")),
        Err(_) => {
            let name = v.to_lowercase();
            if super::values::is_dns_subdomain(&name) {
                Ok(name)
            } else {
                Err(err(
                    "healthzBindAddress",
                    format!("{v:?} is neither an IP address nor a host name"),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RawSettings, load, resolve as resolve_all};
    use std::path::Path;

    fn s(v: &str) -> Option<String> {
        Some(v.into())
    }

    #[test]
    fn defaults_are_the_kubelets() {
        assert_eq!(
            resolve(None, None, None).unwrap(),
            (s("http://127.0.0.1:10248/healthz"), HealthzFrom::Defaults)
        );
        assert_eq!(
            resolve(None, None, None).unwrap().0.as_deref(),
            Some(crate::standby::DEFAULT_HEALTHZ_URL)
        );
    }

    #[test]
    fn port_and_address_make_the_url() {
        let cases = [
            (s("10300"), None, "http://127.0.0.1:10300/healthz"),
            (None, s("10.1.2.3"), "http://10.1.2.3:10248/healthz"),
            (s("1"), s("127.0.0.2"), "http://127.0.0.2:1/healthz"),
            (
                s("65535"),
                s("Node-1.Local"),
                "http://node-1.local:65535/healthz",
            ),
            // unspecified: loopback of the family
            (None, s("0.0.0.0"), "http://127.0.0.1:10248/healthz"),
            // `::`: the probe tries ::1, then 127.0.0.1 (issue 44)
            (s("10249"), s("::"), "http://[::]:10249/healthz"),
            (None, s("0:0:0:0:0:0:0:0"), "http://[::]:10248/healthz"),
            // IPv4-mapped: the IPv4 address the kubelet listens on
            (
                None,
                s("::ffff:127.0.0.1"),
                "http://127.0.0.1:10248/healthz",
            ),
            (None, s("::ffff:0.0.0.0"), "http://127.0.0.1:10248/healthz"),
            (None, s(""), "http://127.0.0.1:10248/healthz"),
            (None, s("  "), "http://127.0.0.1:10248/healthz"),
            // IPv6 in brackets
            (None, s("::1"), "http://[::1]:10248/healthz"),
            (s("8080"), s("fd00::12"), "http://[fd00::12]:8080/healthz"),
        ];
        for (port, address, want) in cases {
            let (url, from) = resolve(None, port.clone(), address.clone()).unwrap();
            assert_eq!(url.as_deref(), Some(want), "{port:?} {address:?}");
            assert_eq!(from, HealthzFrom::Settings);
            // every URL made is one the explicit setting accepts too
            assert_eq!(explicit_url(want.into()).unwrap(), want);
        }
    }

    #[test]
    fn port_0_disables_the_probe() {
        for address in [None, s("0.0.0.0"), s("::1"), s("10.0.0.1")] {
            assert_eq!(
                resolve(None, s("0"), address).unwrap(),
                (None, HealthzFrom::Settings)
            );
        }
    }

    #[test]
    fn the_explicit_url_wins() {
        for (port, address) in [(None, None), (s("0"), None), (s("10300"), s("::"))] {
            assert_eq!(
                resolve(s(" http://127.0.0.1:1/healthz "), port, address).unwrap(),
                (s("http://127.0.0.1:1/healthz"), HealthzFrom::Url)
            );
        }
    }

    #[test]
    fn invalid_values_name_their_field() {
        for (url, port, address, field) in [
            (None, s("65536"), None, "healthzPort"),
            (None, s("-1"), None, "healthzPort"),
            (None, s("http"), None, "healthzPort"),
            (None, s("10248.5"), None, "healthzPort"),
            (None, None, s("a b"), "healthzBindAddress"),
            (None, None, s("[::1]"), "healthzBindAddress"),
            (None, None, s("127.0.0.1:10248"), "healthzBindAddress"),
            // a bad kubelet field is an error even when the URL wins over it
            (
                s("http://127.0.0.1:1/healthz"),
                s("99999"),
                None,
                "healthzPort",
            ),
            (
                s("https://127.0.0.1:10248/healthz"),
                None,
                None,
                "kubeletHealthzURL",
            ),
            (s("127.0.0.1:10248"), None, None, "kubeletHealthzURL"),
        ] {
            let e = resolve(url, port, address).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        f
    }

    const KUBELET: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    /// Through every layer: the kubelet's file, reaplet's file, flags, the explicit URL.
    #[test]
    fn layers_from_the_kubelets_file_to_the_flags() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let load_k = |text: &str, flags: RawSettings| {
            let k = write(d, "kubelet.yaml", &format!("{KUBELET}{text}"));
            let s = load(flags, Some(&k)).unwrap().settings;
            (s.kubelet_healthz_url, s.kubelet_healthz_from)
        };
        // the kubelet's file alone
        assert_eq!(
            load_k(
                "healthzPort: 10300\nhealthzBindAddress: 0.0.0.0\n",
                RawSettings::default()
            ),
            (
                s("http://127.0.0.1:10300/healthz"),
                HealthzFrom::KubeletConfig
            )
        );
        assert_eq!(
            load_k("healthzBindAddress: \"::\"\n", RawSettings::default()),
            (s("http://[::]:10248/healthz"), HealthzFrom::KubeletConfig)
        );
        // kubeadm's zero value for the address is the default, not a setting
        assert_eq!(
            load_k("healthzBindAddress: \"\"\n", RawSettings::default()),
            (s("http://127.0.0.1:10248/healthz"), HealthzFrom::Defaults)
        );
        // 0 in the kubelet's file is the kubelet's "no health endpoint", not "unset"
        assert_eq!(
            load_k("healthzPort: 0\n", RawSettings::default()),
            (None, HealthzFrom::KubeletConfig)
        );
        // a flag over the kubelet's file, field by field
        let flags = RawSettings {
            healthz_port: s("10301"),
            ..RawSettings::default()
        };
        assert_eq!(
            load_k("healthzPort: 0\nhealthzBindAddress: 10.0.0.7\n", flags),
            (s("http://10.0.0.7:10301/healthz"), HealthzFrom::Settings)
        );
        let flags = RawSettings {
            healthz_port: s("0"),
            ..RawSettings::default()
        };
        assert_eq!(
            load_k("healthzPort: 10300\n", flags),
            (None, HealthzFrom::Settings)
        );
        // reaplet's explicit URL over everything
        let flags = RawSettings {
            kubelet_healthz_url: s("http://127.0.0.1:1/healthz"),
            ..RawSettings::default()
        };
        assert_eq!(
            load_k("healthzPort: 0\n", flags),
            (s("http://127.0.0.1:1/healthz"), HealthzFrom::Url)
        );
        // reaplet's own file, over the kubelet's, under the flags
        let k = write(d, "kubelet.yaml", &format!("{KUBELET}healthzPort: 10300\n"));
        let own = write(
            d,
            "reaplet.yaml",
            &format!(
                "kubeletConfig: {}\nhealthzPort: 10302\nhealthzBindAddress: \"::1\"\n",
                k.display()
            ),
        );
        let st = load(RawSettings::default(), Some(&own)).unwrap().settings;
        assert_eq!(
            st.kubelet_healthz_url.as_deref(),
            Some("http://[::1]:10302/healthz")
        );
        let flags = RawSettings {
            healthz_bind_address: s("127.0.0.3"),
            ..RawSettings::default()
        };
        let st = load(flags, Some(&own)).unwrap().settings;
        assert_eq!(
            st.kubelet_healthz_url.as_deref(),
            Some("http://127.0.0.3:10302/healthz")
        );
        // no kubelet file, no setting: the kubelet's defaults
        let st = resolve_all(RawSettings::default()).unwrap();
        assert_eq!(
            (st.kubelet_healthz_url.as_deref(), st.kubelet_healthz_from),
            (
                Some(crate::standby::DEFAULT_HEALTHZ_URL),
                HealthzFrom::Defaults
            )
        );
    }

    #[test]
    fn the_kubelets_invalid_values_name_its_field_and_file() {
        let dir = tempfile::tempdir().unwrap();
        for (text, field) in [
            ("healthzPort: 65536\n", "healthzPort"),
            ("healthzPort: -1\n", "healthzPort"),
            ("healthzPort: \"10248\"\n", "healthzPort"),
            ("healthzPort: 1.5\n", "healthzPort"),
            ("healthzBindAddress: 10248\n", "healthzBindAddress"),
            ("healthzBindAddress: \"a b\"\n", "healthzBindAddress"),
        ] {
            let k = write(dir.path(), "k.yaml", &format!("{KUBELET}{text}"));
            let e = load(RawSettings::default(), Some(&k)).unwrap_err();
            assert_eq!(e.field, field, "{text:?}: {e}");
            assert!(e.to_string().contains("k.yaml"), "{e}");
        }
    }
}
