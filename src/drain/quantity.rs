//! `resource.Quantity` exactly as Kubernetes v1.36 (`k8s.io/apimachinery` v0.36) parses, adds,
//! compares and reads it (`ParseQuantity`, `Add`, `Cmp`, `Value`, `MilliValue`), and the
//! scheduler's view of a resource list built from quantities (`framework.Resource.Add`:
//! CPU in millicores, everything else in whole units, other names ignored).
//!
//! Invariants:
//! * a quantity is held as upstream holds it: an `int64Amount` (value × 10^scale, at most 18
//!   significant digits and nothing finer than 1n) or an exact decimal (`inf.Dec`) rounded away
//!   from zero to 1n (binary values capped at 2^63-1), so every reading agrees with upstream's
//!   bit for bit, its overflow and negative-number quirks included (pinned by the vectors in
//!   `quantity_vectors.tsv`, printed by v0.36.6 itself);
//! * sums are exact: a pod's requests are added as quantities and read once (two containers of
//!   0.5m are 1m, not 2m), as `PodRequests` and the scheduler do;
//! * the one deliberate difference: a quantity whose power of ten is beyond ±100,000 (an
//!   absurd exponent, zero included) is refused (`ExponentTooLarge`) where upstream computes
//!   for minutes or hangs (or, for `1e2147483647`, reads an odd 1); so every rescaling in a
//!   sum, a comparison or a reading is bounded.

use num_bigint::{BigInt, Sign};
use num_integer::Integer;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Why a string is not a quantity (upstream's three errors, and ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    FormatWrong,
    #[error("unable to parse quantity's numeric part")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("the quantity's exponent is beyond what reaplet reads (a power of ten past ±100000)")]
    ExponentTooLarge,
}

/// How far an exact decimal may be rescaled (digits).
const MAX_RESCALE: i64 = 100_000;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Amount {
    /// `value × 10^scale` (`int64Amount`).
    Int { value: i64, scale: i32 },
    /// `unscaled × 10^-scale` (`inf.Dec`).
    Dec { unscaled: BigInt, scale: i32 },
}

/// A `resource.Quantity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(Amount);

impl Default for Quantity {
    fn default() -> Self {
        Quantity(Amount::Int { value: 0, scale: 0 })
    }
}

fn pow10(n: u32) -> BigInt {
    BigInt::from(10u8).pow(n)
}

/// `big.Int.Int64()`: the low 64 bits, two's complement.
fn wrap64(x: &BigInt) -> i64 {
    let (sign, digits) = x.to_u64_digits();
    let low = digits.first().copied().unwrap_or(0) as i64;
    if sign == Sign::Minus {
        low.wrapping_neg()
    } else {
        low
    }
}

/// `negativeScaleInt64`: `base / 10^n`, rounded away from zero.
fn scale_down(base: i64, n: i64) -> i64 {
    let mut value = base;
    let mut fraction = false;
    for _ in 0..n {
        if value % 10 != 0 {
            fraction = true;
        }
        value /= 10;
        if value == 0 {
            return if fraction { base.signum() } else { 0 };
        }
    }
    if fraction {
        value + base.signum()
    } else {
        value
    }
}

/// `positiveScaleInt64`: `base × 10^d` and whether it fit. Its value on overflow is upstream's:
/// the wrapped product for the gaps 1, 2, 3, 6 and 9 (0 for `MinInt64`), else 0; a negative
/// gap (an int32 subtraction that wrapped) leaves `base`.
fn scale_up(base: i64, d: i32) -> (i64, bool) {
    match d {
        0 => (base, true),
        d if d < 0 => (base, true),
        1 | 2 | 3 | 6 | 9 => {
            let f = 10i64.pow(d as u32);
            if base == 0 || base == 1 {
                (base * f, true)
            } else if base == i64::MIN {
                (0, false)
            } else {
                match base.checked_mul(f) {
                    Some(v) => (v, true),
                    None => (base.wrapping_mul(f), false),
                }
            }
        }
        d => {
            if base == 0 {
                return (0, true);
            }
            if base == i64::MIN {
                return (0, false);
            }
            let mut v = base;
            for _ in 0..d {
                match v.checked_mul(10) {
                    Some(n) => v = n,
                    None => return (0, false),
                }
            }
            (v, true)
        }
    }
}

/// `scaledValue(unscaled, scale, newScale)` of the decimal backend.
fn dec_scaled(u: &BigInt, scale: i64, new_scale: i64) -> i64 {
    let dif = scale - new_scale;
    match dif.cmp(&0) {
        Ordering::Equal => wrap64(u),
        Ordering::Less => {
            // int64(math.Pow10(n)): exact to 10^18, MinInt64 beyond on amd64
            let f = if -dif <= 18 {
                10i64.pow((-dif) as u32)
            } else {
                i64::MIN
            };
            wrap64(u).wrapping_mul(f)
        }
        Ordering::Greater => {
            if *u < BigInt::from(i64::MAX) && dif < 19 {
                // a signed comparison: every negative number takes this branch, wrapped
                let w = wrap64(u);
                let f = 10i64.pow(dif as u32);
                let (q, r) = (w / f, w % f);
                if r != 0 { q.wrapping_add(1) } else { q }
            } else {
                let (q, r) = u.div_mod_floor(&pow10(dif as u32));
                let q = wrap64(&q);
                if r != BigInt::ZERO {
                    q.wrapping_add(1)
                } else {
                    q
                }
            }
        }
    }
}

pub(crate) enum Base {
    Ten,
    Two,
}

/// `quantitySuffixer.interpret`: the base, the exponent and whether it is binary.
pub(crate) fn interpret(s: &str) -> Option<(Base, i32)> {
    let dec = |e| Some((Base::Ten, e));
    let bin = |e| Some((Base::Two, e));
    match s {
        "" => dec(0),
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(10),
        "Mi" => bin(20),
        "Gi" => bin(30),
        "Ti" => bin(40),
        "Pi" => bin(50),
        "Ei" => bin(60),
        s if s.len() > 1 && s.starts_with(['e', 'E']) => {
            // strconv.ParseInt, then truncated to 32 bits
            s[1..].parse::<i64>().ok().map(|e| (Base::Ten, e as i32))
        }
        _ => None,
    }
}

/// `inf.Dec.SetString` of the scanned number: (unscaled, scale).
fn dec_of(text: &str) -> Option<(BigInt, i32)> {
    let (neg, t) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = format!("{int}{frac}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut u: BigInt = digits.parse().ok()?;
    if neg {
        u = -u;
    }
    Some((u, i32::try_from(frac.len()).ok()?))
}

impl Quantity {
    /// `ParseQuantity`.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::FormatWrong);
        }
        let b = s.as_bytes();
        let digits_from = |mut i: usize| {
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            i
        };
        let mut i = 0;
        let positive = match b[0] {
            b'-' => {
                i = 1;
                false
            }
            b'+' => {
                i = 1;
                true
            }
            _ => true,
        };
        while i < b.len() && b[i] == b'0' {
            i += 1;
        }
        if i == b.len() {
            return Ok(Quantity::default());
        }
        let start = i;
        i = digits_from(i);
        let num = if i == start { "0" } else { &s[start..i] };
        let mut denom = "";
        if i < b.len() && b[i] == b'.' {
            let d = i + 1;
            i = digits_from(d);
            denom = &s[d..i];
        }
        let value_text = &s[..i];
        let suffix_from = i;
        while i < b.len() && b"eEinumkKMGTP".contains(&b[i]) {
            i += 1;
        }
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        i = digits_from(i);
        if i < b.len() {
            return Err(QuantityError::FormatWrong);
        }
        let (base, exponent) = interpret(&s[suffix_from..]).ok_or(QuantityError::Suffix)?;

        // the fast path: an int64Amount
        let (precision, mut scale, mantissa): (i64, i32, i64) = match base {
            Base::Ten => (18 - (num.len() + denom.len()) as i64, exponent, 1),
            Base::Two if denom.is_empty() => (
                15 - num.len() as i64 - ((exponent as f32) * 3.0 / 10.0) as i64 - 1,
                0,
                1i64 << exponent,
            ),
            Base::Two => (-1, 0, 1),
        };
        if precision >= 0 {
            scale = scale.wrapping_sub(denom.len() as i32);
            if scale >= -9 {
                let value: i64 = format!("{num}{denom}")
                    .parse()
                    .map_err(|_| QuantityError::Numeric)?;
                if let Some(v) = value.checked_mul(mantissa) {
                    if scale as i64 > MAX_RESCALE {
                        return Err(QuantityError::ExponentTooLarge);
                    }
                    let value = if positive { v } else { -v };
                    return Ok(Quantity(Amount::Int { value, scale }));
                }
            }
        }

        // the slow path: an exact decimal
        let (mut u, text_scale) = dec_of(value_text).ok_or(QuantityError::Numeric)?;
        let mut dscale = text_scale;
        match base {
            Base::Ten => dscale = dscale.wrapping_sub(exponent),
            Base::Two => u <<= exponent as usize,
        }
        let negative = u.sign() == Sign::Minus;
        if negative {
            u = -u;
        }
        if u != BigInt::ZERO {
            // round the magnitude up to a multiple of 1n
            let gap = 9 - dscale as i64;
            if gap.abs() > MAX_RESCALE {
                return Err(QuantityError::ExponentTooLarge);
            }
            if gap >= 0 {
                u *= pow10(gap as u32);
            } else {
                let (q, r) = u.div_rem(&pow10((-gap) as u32));
                u = if r != BigInt::ZERO { q + 1 } else { q };
            }
            dscale = 9;
        }
        if matches!(base, Base::Two) {
            let max = BigInt::from(i64::MAX) * pow10(dscale.max(0) as u32);
            if dscale >= 0 && u > max {
                u = BigInt::from(i64::MAX);
                dscale = 0;
            }
        }
        if (dscale as i64).abs() > MAX_RESCALE {
            // only a zero keeps a scale this far out
            return Err(QuantityError::ExponentTooLarge);
        }
        if negative {
            u = -u;
        }
        Ok(Quantity(Amount::Dec {
            unscaled: u,
            scale: dscale,
        }))
    }

    /// `ScaledValue(scale)`: the value in units of 10^scale, rounded up (upstream's rules,
    /// including its overflow and negative-number results).
    pub fn scaled_value(&self, scale: i32) -> i64 {
        match &self.0 {
            Amount::Int { value, scale: s } => {
                if *s < scale {
                    scale_down(*value, scale as i64 - *s as i64)
                } else {
                    scale_up(*value, s.wrapping_sub(scale)).0
                }
            }
            Amount::Dec { unscaled, scale: s } => dec_scaled(unscaled, *s as i64, -(scale as i64)),
        }
    }

    /// `Value()`.
    pub fn value(&self) -> i64 {
        self.scaled_value(0)
    }

    /// `MilliValue()`.
    pub fn milli_value(&self) -> i64 {
        self.scaled_value(-3)
    }

    /// The exact value as `unscaled × 10^-scale`.
    fn exact(&self) -> (BigInt, i64) {
        match &self.0 {
            Amount::Int { value, scale } => (BigInt::from(*value), -(*scale as i64)),
            Amount::Dec { unscaled, scale } => (unscaled.clone(), *scale as i64),
        }
    }

    /// Whether it is exactly zero.
    pub fn is_zero(&self) -> bool {
        match &self.0 {
            Amount::Int { value, .. } => *value == 0,
            Amount::Dec { unscaled, .. } => *unscaled == BigInt::ZERO,
        }
    }

    /// `Add`: exact; two int64 amounts stay one while the sum fits, else the sum is a decimal.
    pub fn add(&mut self, y: &Quantity) {
        if let (
            Amount::Int {
                value: a,
                scale: sa,
            },
            Amount::Int {
                value: b,
                scale: sb,
            },
        ) = (&self.0, &y.0)
        {
            let (a, sa, b, sb) = (*a, *sa, *b, *sb);
            let sum = if b == 0 {
                Some((a, sa))
            } else if a == 0 {
                Some((b, sb))
            } else if sa == sb {
                a.checked_add(b).map(|v| (v, sa))
            } else if sa > sb {
                match scale_up(a, sa.wrapping_sub(sb)) {
                    (c, true) => c.checked_add(b).map(|v| (v, sb)),
                    _ => None,
                }
            } else {
                match scale_up(b, sb.wrapping_sub(sa)) {
                    (c, true) => a.checked_add(c).map(|v| (v, sa)),
                    _ => None,
                }
            };
            if let Some((value, scale)) = sum {
                self.0 = Amount::Int { value, scale };
                return;
            }
        }
        // inf.Dec addition: exact, at the larger of the two scales (both within MAX_RESCALE
        // of 0, so the work is bounded)
        let (ua, sa) = self.exact();
        let (ub, sb) = y.exact();
        let s = sa.max(sb);
        let unscaled = ua * pow10((s - sa) as u32) + ub * pow10((s - sb) as u32);
        self.0 = Amount::Dec {
            unscaled,
            scale: s as i32,
        };
    }

    /// The larger of the two (`Cmp`), this one on a tie. Not modelled: upstream's `Cmp` turns
    /// an int64 amount into a decimal in place (`AsDec`), which changes nothing for values
    /// that fit but changes an overflowing reading (`1E`: `MilliValue` 0 as an int64 amount,
    /// MinInt64 as a decimal); such a value is no request anyone makes.
    pub fn max(self, y: &Quantity) -> Quantity {
        if y.cmp_value(&self) == Ordering::Greater {
            y.clone()
        } else {
            self
        }
    }

    /// `Cmp`: by exact value.
    pub fn cmp_value(&self, y: &Quantity) -> Ordering {
        let (ua, sa) = self.exact();
        let (ub, sb) = y.exact();
        let s = sa.max(sb);
        (ua * pow10((s - sa) as u32)).cmp(&(ub * pow10((s - sb) as u32)))
    }
}

#[cfg(test)]
impl Quantity {
    /// The backend as the vectors print it: `int64{value,e<scale>}` or
    /// `dec{unscaled,scale<scale>}`.
    pub(crate) fn backend(&self) -> String {
        match &self.0 {
            Amount::Int { value, scale } => format!("int64{{{value},e{scale}}}"),
            Amount::Dec { unscaled, scale } => format!("dec{{{unscaled},scale{scale}}}"),
        }
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// A resource list: name → quantity (`v1.ResourceList`).
pub type ResourceList = BTreeMap<String, Quantity>;

/// Adds `b` into `a` (`addResourceList`).
pub fn add_list(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        a.entry(k.clone()).or_default().add(q);
    }
}

/// The per-resource maximum of `a` and `b` into `a` (`maxResourceList`).
pub fn max_list(a: &mut ResourceList, b: &ResourceList) {
    for (k, q) in b {
        let cur = a.remove(k).unwrap_or_default();
        a.insert(k.clone(), cur.max(q));
    }
}

pub use super::resources::{Resources, is_scalar_resource_name};
