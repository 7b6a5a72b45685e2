//! `resource.Quantity.String()` as apimachinery v0.36 prints a quantity, for the eviction
//! message and its annotations: a parsed quantity's text (kept when the parser deems it
//! canonical, `100Mi`, `+5Mi`; else canonical, `1024Mi` is `1Gi`) and a new quantity of a
//! format (`NewQuantity(v, BinarySI)`: `679132Ki`, `1Gi`, `1k` below 1024). Checked against
//! Go's own output (tables in the tests of [`super::thresholds`] and [`super::rank`]).

use num_bigint::BigInt;
use num_integer::Integer;

/// A quantity's format (`resource.Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

/// A quantity's text split as upstream splits it: sign, whole digits (leading zeros dropped,
/// `0` when none), fraction digits, suffix.
struct Parts<'a> {
    positive: bool,
    num: &'a str,
    denom: &'a str,
    suffix: &'a str,
}

fn split_quantity(s: &str) -> Parts<'_> {
    let b = s.as_bytes();
    let mut pos = 0;
    let mut positive = true;
    match b.first() {
        Some(b'-') => {
            positive = false;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    if pos == b.len() {
        return Parts {
            positive,
            num: "0",
            denom: "",
            suffix: "",
        };
    }
    let from = pos;
    while pos < b.len() && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let num = if pos == from { "0" } else { &s[from..pos] };
    let mut denom = "";
    if pos < b.len() && b[pos] == b'.' {
        pos += 1;
        let d = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        denom = &s[d..pos];
    }
    Parts {
        positive,
        num,
        denom,
        suffix: &s[pos..],
    }
}

/// A suffix's base, exponent and format: the crate's `quantitySuffixer.interpret`, the
/// format from the suffix's kind.
fn interpret_suffix(suffix: &str) -> Option<(u32, i32, Format)> {
    use crate::drain::quantity::{Base, interpret};
    Some(match interpret(suffix)? {
        (Base::Two, e) => (2, e, Format::BinarySI),
        (Base::Ten, e) if suffix.len() > 1 && suffix.starts_with(['e', 'E']) => {
            (10, e, Format::DecimalExponent)
        }
        (Base::Ten, e) => (10, e, Format::DecimalSI),
    })
}

/// The format of a quantity's text, by its suffix (`Ki`…`Ei` binary, an `e` exponent
/// decimal-exponent, anything else decimal SI).
fn format_of(text: &str) -> Format {
    interpret_suffix(split_quantity(text).suffix).map_or(Format::DecimalSI, |(_, _, f)| f)
}

/// Whether upstream keeps the text as the quantity's string: its fast path (an `int64` value
/// at a scale of at least 1n) with a text already in canonical shape.
fn keeps_text(p: &Parts<'_>, exponent: i32, format: Format) -> bool {
    let digits = p.num.len() + p.denom.len();
    let (precision, scale, multiplier): (i64, i32, i64) = match format {
        Format::BinarySI if exponent >= 0 && p.denom.is_empty() => (
            15 - p.num.len() as i64 - ((exponent as f32) * 3.0 / 10.0) as i64 - 1,
            0,
            1i64 << exponent,
        ),
        Format::BinarySI => (-1, 0, 1),
        _ => (18 - digits as i64, exponent, 1),
    };
    let scale = scale.wrapping_sub(p.denom.len() as i32);
    if precision < 0 || scale < -9 {
        return false;
    }
    let shifted = format!("{}{}", p.num, p.denom);
    let Ok(value) = shifted.parse::<i64>() else {
        return false;
    };
    if value.checked_mul(multiplier).is_none() {
        return false;
    }
    match format {
        Format::BinarySI => exponent % 10 == 0 && value & 7 != 0,
        _ => scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0'),
    }
}

/// `ParseQuantity(text).String()` for a text that parses: the text itself when upstream keeps
/// it (`100Mi`, `+5Mi`, `1.25e2`), else the canonical form (`1024Mi` is `1Gi`).
pub fn quantity_string(text: &str) -> String {
    if text == "0" {
        return text.to_string();
    }
    let p = split_quantity(text);
    let Some((base, exponent, format)) = interpret_suffix(p.suffix) else {
        return text.to_string();
    };
    if keeps_text(&p, exponent, format) {
        return text.to_string();
    }
    let mut m: BigInt = format!("{}{}", p.num, p.denom).parse().unwrap_or_default();
    let mut e = -(p.denom.len() as i64);
    if base == 10 {
        e += i64::from(exponent);
    } else {
        m <<= exponent.clamp(0, 63) as usize;
    }
    if !p.positive {
        m = -m;
    }
    canonical(m, e, format, true)
}

fn pow10(n: u64) -> BigInt {
    BigInt::from(10u8).pow(n as u32)
}

/// `mantissa × 10^exp` as upstream's `CanonicalizeBytes` prints it, after rounding to 1n away
/// from zero as `ParseQuantity` does (and, with `parsed`, its cap of a binary value at
/// ±MaxInt64; `NewQuantity` has no cap).
fn canonical(mut m: BigInt, mut e: i64, format: Format, parsed: bool) -> String {
    if m == BigInt::ZERO {
        return "0".to_string();
    }
    if e < -9 {
        let drop = (-9 - e) as u64;
        let negative = m < BigInt::ZERO;
        let magnitude = if negative { -m } else { m };
        let q = if drop > magnitude.to_string().len() as u64 {
            BigInt::from(1u8)
        } else {
            let (q, r) = magnitude.div_rem(&pow10(drop));
            if r == BigInt::ZERO { q } else { q + 1u8 }
        };
        m = if negative { -q } else { q };
        e = -9;
    }
    // the trailing zeros into the exponent
    let ten = BigInt::from(10u8);
    while m.is_multiple_of(&ten) {
        m /= 10u8;
        e += 1;
    }
    let mut format = format;
    if format == Format::BinarySI {
        // a binary value has at most 9 fraction digits and no positive power of ten but its
        // own trailing zeros, so scaling to an integer stays small
        let (scaled, unit) = if e >= 0 {
            (&m * pow10(e as u64), BigInt::from(1u8))
        } else {
            (m.clone(), pow10((-e) as u64))
        };
        let max = BigInt::from(i64::MAX) * &unit;
        let magnitude = if scaled < BigInt::ZERO {
            -&scaled
        } else {
            scaled.clone()
        };
        if parsed && magnitude > max {
            let capped = i64::MAX;
            return binary_string(if scaled < BigInt::ZERO {
                -capped
            } else {
                capped
            });
        }
        if magnitude < BigInt::from(1024) * &unit || e < 0 {
            // below 1024, or not whole: upstream prints it in decimal SI
            format = Format::DecimalSI;
        } else {
            match i64::try_from(&scaled) {
                Ok(v) => return binary_string(v),
                Err(_) => format = Format::DecimalSI,
            }
        }
    }
    // the exponent down to a multiple of three
    let r = e.rem_euclid(3);
    m *= pow10(r as u64);
    e -= r;
    let suffix = match format {
        Format::DecimalExponent if e == 0 => String::new(),
        Format::DecimalExponent => format!("e{e}"),
        // upstream prints no suffix for a power it has none for (`1000E` is `1`)
        _ => match e {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        }
        .to_string(),
    };
    format!("{m}{suffix}")
}

/// A whole `BinarySI` value of at least 1024 in magnitude: the largest binary suffix that
/// divides it. `MinInt64` stays plain, as upstream's `int64` negation leaves it.
fn binary_string(v: i64) -> String {
    let negative = v < 0;
    let mut r = if negative { v.wrapping_neg() } else { v };
    let mut times = 0;
    while r >= 1024 && r % 1024 == 0 {
        r /= 1024;
        times += 1;
    }
    if negative {
        r = r.wrapping_neg();
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .get(times)
        .copied()
        .unwrap_or("");
    format!("{r}{suffix}")
}

/// `NewQuantity(v, BinarySI).String()`: `1Gi`, `679132Ki`, `1500000`; below 1024 in magnitude
/// upstream prints decimal SI (`1000` is `1k`).
pub fn format_bytes_binary(v: i64) -> String {
    canonical(BigInt::from(v), 0, Format::BinarySI, false)
}

/// `v` printed as upstream prints a new quantity of the format `like` was written in (by its
/// suffix: `Ki`…`Ei` binary SI, an `e` exponent decimal exponent, otherwise decimal SI, so
/// 1500000 is `1500k`).
pub fn format_as(v: i64, like: &str) -> String {
    canonical(BigInt::from(v), 0, format_of(like), false)
}
