//! Value parsers shared by every configuration layer: Go-style durations, node names, absolute
//! paths, positive numbers and booleans. Each failure is a [`ConfigError`] naming its field.

use super::{ConfigError, err};
use std::path::PathBuf;
use std::time::Duration;

/// Parses Go's `time.Duration` forms: `500ms`, `10s`, `2m`, `1h`, `1m30s`, `4h0m0s`, `1.5h`,
/// `100us`/`100µs`, `10ns`; a bare number is seconds (`7`). Negative durations are rejected.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        if num_end == 0 {
            return Err(format!("{s:?} is not a duration like 500ms, 10s, 2m"));
        }
        let v: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{s:?}: bad number"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" if num_end == t.len() => 1.0,
            u => return Err(format!("{s:?}: unknown unit {u:?} (ms, s, m, h)")),
        };
        rest = &rest[unit_end..];
        total += v * mult;
    }
    if !total.is_finite() || !(0.0..=1e9).contains(&total) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(total))
}

pub(super) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

pub(super) fn abs_path(field: &'static str, v: &str) -> Result<PathBuf, ConfigError> {
    if v.is_empty() {
        return Err(err(field, "must not be empty"));
    }
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(err(field, format!("{v:?} must be an absolute path")));
    }
    Ok(p)
}

pub(super) fn duration(
    field: &'static str,
    v: Option<String>,
    default: Duration,
    min: Duration,
) -> Result<Duration, ConfigError> {
    let d = match v {
        Some(v) => parse_duration(&v).map_err(|e| err(field, e))?,
        None => default,
    };
    if d < min {
        return Err(err(field, format!("must be at least {min:?}")));
    }
    Ok(d)
}

pub(super) fn positive_f64(
    field: &'static str,
    v: Option<String>,
    default: f64,
) -> Result<f64, ConfigError> {
    bounded_number(
        field,
        v,
        default,
        "a number",
        |x: &f64| x.is_finite() && *x > 0.0,
        |v| format!("{v:?} must be a positive number"),
    )
}

pub(super) fn positive_u32(
    field: &'static str,
    v: Option<String>,
    default: u32,
) -> Result<u32, ConfigError> {
    bounded_number(
        field,
        v,
        default,
        "a whole number",
        |x| *x != 0,
        |_| "must be at least 1".into(),
    )
}

/// `v` parsed as `what` (`default` when unset), and within the bound `ok`: else `out_of_bound`
/// (given `v`) says why.
/// A whole number from 0 to `max`.
pub(super) fn at_most_u32(
    field: &'static str,
    v: Option<String>,
    default: u32,
    max: u32,
) -> Result<u32, ConfigError> {
    bounded_number(
        field,
        v,
        default,
        "a whole number",
        |x| *x <= max,
        |_| format!("must be at most {max}"),
    )
}

fn bounded_number<T: std::str::FromStr>(
    field: &'static str,
    v: Option<String>,
    default: T,
    what: &str,
    ok: impl Fn(&T) -> bool,
    out_of_bound: impl Fn(&str) -> String,
) -> Result<T, ConfigError> {
    let Some(v) = v else { return Ok(default) };
    let x: T = v
        .trim()
        .parse()
        .map_err(|_| err(field, format!("{v:?} is not {what}")))?;
    if !ok(&x) {
        return Err(err(field, out_of_bound(&v)));
    }
    Ok(x)
}

pub(super) fn boolean(
    field: &'static str,
    v: Option<String>,
    default: bool,
) -> Result<bool, ConfigError> {
    match v.as_deref().map(str::trim) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(o) => Err(err(field, format!("{o:?}: must be true or false"))),
    }
}
