//! Go's own parsers where the kubelet's messages and accepted inputs depend on them:
//! `strconv.ParseFloat(s, 32)` (eviction percentages: `float32`, hexadecimal floats, `_`
//! separators, `inf`, `nan`), `strconv.Quote` for its error text, and `time.ParseDuration`
//! (`evictionSoftGracePeriod`). Checked against Go 1.26 in the tests of [`super::thresholds`].

// ---------------------------------------------------------------------------------------------
// Go's `strconv.ParseFloat(s, 32)`

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FloatError {
    Syntax,
    Range,
}

/// `strconv.ParseFloat(s, 32)`: Go's syntax (decimal or hexadecimal, `_` between digits,
/// `inf`/`infinity` with a sign, `nan` without one, any case), correctly rounded to `f32`;
/// a finite number beyond `f32` is a range error, one below it rounds to zero.
pub(super) fn go_parse_f32(s: &str) -> Result<f32, FloatError> {
    let (negative, unsigned) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if unsigned.eq_ignore_ascii_case("inf") || unsigned.eq_ignore_ascii_case("infinity") {
        return Ok(if negative {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        });
    }
    if s.eq_ignore_ascii_case("nan") {
        return Ok(f32::NAN);
    }
    let b = unsigned.as_bytes();
    if b.len() > 2 && b[0] == b'0' && b[1].eq_ignore_ascii_case(&b'x') {
        return parse_hex_f32(s, &b[2..], negative);
    }
    // the decimal form: digits with one optional point, then an optional exponent
    let mut i = 0;
    let mut underscores = false;
    let mut saw_point = false;
    let mut saw_digits = false;
    while i < b.len() {
        match b[i] {
            b'_' => underscores = true,
            b'.' if !saw_point => saw_point = true,
            c if c.is_ascii_digit() => saw_digits = true,
            _ => break,
        }
        i += 1;
    }
    if !saw_digits {
        return Err(FloatError::Syntax);
    }
    if i < b.len() && b[i].eq_ignore_ascii_case(&b'e') {
        i = exponent_end(b, i + 1, &mut underscores)?.0;
    }
    if i != b.len() || (underscores && !underscores_ok(s)) {
        return Err(FloatError::Syntax);
    }
    // what is left is a plain decimal literal, which Rust rounds correctly as Go does
    let clean: String = s.chars().filter(|&c| c != '_').collect();
    let v: f32 = clean.parse().map_err(|_| FloatError::Syntax)?;
    if v.is_infinite() {
        return Err(FloatError::Range);
    }
    Ok(v)
}

/// An exponent's digits from `i` (just past `e` or `p`): an optional sign, then a digit, then
/// digits and `_`. Its end and its signed value (capped in size as Go caps it).
fn exponent_end(
    b: &[u8],
    mut i: usize,
    underscores: &mut bool,
) -> Result<(usize, i64), FloatError> {
    let mut sign = 1;
    match b.get(i) {
        Some(b'+') => i += 1,
        Some(b'-') => {
            sign = -1;
            i += 1;
        }
        _ => {}
    }
    if !b.get(i).is_some_and(u8::is_ascii_digit) {
        return Err(FloatError::Syntax);
    }
    let mut e: i64 = 0;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
        if b[i] == b'_' {
            *underscores = true;
        } else if e < 10_000 {
            e = e * 10 + i64::from(b[i] - b'0');
        }
        i += 1;
    }
    Ok((i, sign * e))
}

/// Go's rule for `_` in a number: only between two digits (a base prefix counts as a digit).
fn underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let b = match b.first() {
        Some(b'+' | b'-') => &b[1..],
        _ => b,
    };
    // what came last: '^' nothing, '0' a digit (or the prefix), '_' an underscore, '!' other
    let mut last = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        last = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    for &c in &b[i..] {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            last = b'0';
        } else if c == b'_' {
            if last != b'0' {
                return false;
            }
            last = b'_';
        } else {
            if last == b'_' {
                return false;
            }
            last = b'!';
        }
    }
    last != b'_'
}

/// A hexadecimal float (`0x1.8p3`; the `p` exponent is required), after its `0x`.
fn parse_hex_f32(s: &str, b: &[u8], negative: bool) -> Result<f32, FloatError> {
    let mut mantissa: u64 = 0;
    let mut digits = 0i64; // significant digits seen
    let mut kept = 0i64; // digits held in `mantissa` (16 fit)
    let mut point = 0i64; // digits before the point, leading zeros counted negative
    let mut saw_point = false;
    let mut saw_digits = false;
    let mut truncated = false;
    let mut underscores = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'_' {
            underscores = true;
        } else if c == b'.' {
            if saw_point {
                break;
            }
            saw_point = true;
            point = digits;
        } else if let Some(d) = (c as char).to_digit(16) {
            saw_digits = true;
            if c == b'0' && digits == 0 {
                point -= 1;
            } else {
                digits += 1;
                if kept < 16 {
                    mantissa = mantissa * 16 + u64::from(d);
                    kept += 1;
                } else if d != 0 {
                    truncated = true;
                }
            }
        } else {
            break;
        }
        i += 1;
    }
    if !saw_digits {
        return Err(FloatError::Syntax);
    }
    if !saw_point {
        point = digits;
    }
    if !b.get(i).is_some_and(|c| c.eq_ignore_ascii_case(&b'p')) {
        return Err(FloatError::Syntax);
    }
    let (end, e) = exponent_end(b, i + 1, &mut underscores)?;
    if end != b.len() || (underscores && !underscores_ok(s)) {
        return Err(FloatError::Syntax);
    }
    let exp2 = if mantissa == 0 {
        0
    } else {
        point * 4 + e - kept * 4
    };
    round_to_f32(mantissa, exp2, truncated, negative)
}

/// `mantissa × 2^exp2` (plus, with `sticky`, a little more than that) rounded to the nearest
/// `f32`, ties to even; beyond the largest finite `f32` is a range error.
fn round_to_f32(mantissa: u64, exp2: i64, sticky: bool, negative: bool) -> Result<f32, FloatError> {
    let sign = if negative { 1u32 << 31 } else { 0 };
    if mantissa == 0 {
        return Ok(f32::from_bits(sign));
    }
    let width = 64 - i64::from(mantissa.leading_zeros());
    let top = exp2 + width - 1; // the power of two of the leading bit
    // the power of two of the last bit kept: 24 significant bits, or the subnormals' 2^-149
    let last = if top >= -126 { top - 23 } else { -149 };
    let drop = last - exp2;
    let m = u128::from(mantissa);
    let mut kept: u128 = if drop <= 0 {
        // exact (shifted left by less than 24 bits); a sticky tail is below half a unit
        m << (-drop)
    } else if drop > 64 {
        0 // below half a unit of the last kept bit
    } else {
        let q = m >> drop;
        let rem = m & ((1u128 << drop) - 1);
        let half = 1u128 << (drop - 1);
        let up = rem > half || (rem == half && (sticky || q & 1 == 1));
        q + u128::from(up)
    };
    let bits = if top >= -126 {
        let mut top = top;
        if kept == 1 << 24 {
            kept >>= 1;
            top += 1;
        }
        if top > 127 {
            return Err(FloatError::Range);
        }
        (((top + 127) as u32) << 23) | (kept as u32 & 0x007f_ffff)
    } else {
        // subnormal; a carry into 2^23 is the smallest normal number's bits
        kept as u32
    };
    Ok(f32::from_bits(sign | bits))
}

/// `strconv.Quote`. Unicode's printable classes are approximated: every non-ASCII character
/// prints as itself except controls, spaces, the common format characters and private use.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x1_0000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn is_printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u, 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e)
        || matches!(u, 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x206f)
        || matches!(u, 0xfeff | 0xfff9..=0xfffb | 0xfffe | 0xffff)
        || matches!(u, 0xe000..=0xf8ff | 0xf_0000..=0x10_ffff))
}

// ---------------------------------------------------------------------------------------------
// Go's `time.ParseDuration`

/// `time.ParseDuration`: nanoseconds (negative allowed), or Go's error text. Its quirks are
/// kept: `0` alone needs no unit, a fraction is scaled through `float64`, and a sum that wraps
/// `uint64` exactly passes (as it does in Go).
pub(super) fn go_parse_duration(s: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", time_quote(s));
    const LIMIT: u64 = 1 << 63;
    let b = s.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&c) = b.first()
        && (c == b'-' || c == b'+')
    {
        negative = c == b'-';
        i = 1;
    }
    if &s[i..] == "0" {
        return Ok(0);
    }
    if i == b.len() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while i < b.len() {
        if !(b[i] == b'.' || b[i].is_ascii_digit()) {
            return Err(invalid());
        }
        let start = i;
        let mut whole: u64 = 0;
        while i < b.len() && b[i].is_ascii_digit() {
            if whole > LIMIT / 10 {
                return Err(invalid());
            }
            whole = whole * 10 + u64::from(b[i] - b'0');
            if whole > LIMIT {
                return Err(invalid());
            }
            i += 1;
        }
        let has_whole = i != start;
        let (mut fraction, mut scale, mut has_fraction) = (0u64, 1f64, false);
        if i < b.len() && b[i] == b'.' {
            i += 1;
            let from = i;
            let mut overflow = false;
            while i < b.len() && b[i].is_ascii_digit() {
                if !overflow {
                    let next = (fraction <= (LIMIT - 1) / 10)
                        .then(|| fraction * 10 + u64::from(b[i] - b'0'))
                        .filter(|&y| y <= LIMIT);
                    match next {
                        Some(y) => {
                            fraction = y;
                            scale *= 10.0;
                        }
                        None => overflow = true,
                    }
                }
                i += 1;
            }
            has_fraction = i != from;
        }
        if !has_whole && !has_fraction {
            return Err(invalid());
        }
        let unit_from = i;
        while i < b.len() && !(b[i] == b'.' || b[i].is_ascii_digit()) {
            i += 1;
        }
        if i == unit_from {
            return Err(format!("time: missing unit in duration {}", time_quote(s)));
        }
        let unit_text = &s[unit_from..i];
        let unit: u64 = match unit_text {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    time_quote(unit_text),
                    time_quote(s)
                ));
            }
        };
        if whole > LIMIT / unit {
            return Err(invalid());
        }
        let mut v = whole * unit;
        if fraction > 0 {
            v += (fraction as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total = total.wrapping_add(v);
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if negative {
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// The `time` package's own quoting: `"` and `\` escaped, every byte of a control or
/// non-ASCII character as `\xNN`.
pub(super) fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c.is_ascii() && c >= ' ' {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{byte:02x}"));
            }
        }
    }
    out.push('"');
    out
}
