//! Tests of the eviction thresholds. The vectors were printed by upstream itself:
//! `k8s.io/apimachinery` v0.36.5 (`Quantity.String()`), Go 1.26 `strconv.ParseFloat(_, 32)` and
//! `time.ParseDuration`, and `k8s.io/kubernetes` v1.36.5 `eviction.ParseThresholdConfig`.

use super::*;
use crate::pressure::goparse::time_quote;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `ParseThresholdConfig` with maps written `k=v;k=v`.
fn parse(
    pods: bool,
    hard: &str,
    soft: &str,
    grace: &str,
    reclaim: &str,
) -> Result<Vec<Threshold>, ThresholdError> {
    let m = |s: &str| -> BTreeMap<String, String> {
        s.split(';')
            .filter(|kv| !kv.is_empty())
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let enforce: Vec<String> = if pods { vec!["pods".into()] } else { vec![] };
    parse_threshold_config(&enforce, &m(hard), &m(soft), &m(grace), &m(reclaim))
}

/// Go's `Duration.String()` for whole seconds.
fn go_seconds(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

fn value_text(v: &ThresholdValue, text: &str) -> String {
    match v {
        ThresholdValue::Quantity(_) => quantity_string(text),
        ThresholdValue::Percentage(p) => format!("{p}"),
    }
}

/// The thresholds as the Go harness printed them: `signal:value:grace:minReclaim`.
fn render(ts: &[Threshold]) -> String {
    ts.iter()
        .map(|t| {
            let reclaim = match (&t.min_reclaim, &t.min_reclaim_text) {
                (Some(v), Some(text)) => value_text(v, text),
                _ => "-".to_string(),
            };
            format!(
                "{}:{}:{}:{}",
                t.signal,
                value_text(&t.value, &t.value_text),
                go_seconds(t.grace_period),
                reclaim
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn ok(pods: bool, hard: &str, soft: &str, grace: &str, reclaim: &str) -> String {
    render(&parse(pods, hard, soft, grace, reclaim).expect("valid settings"))
}

fn err(hard: &str, soft: &str, grace: &str, reclaim: &str) -> ThresholdError {
    parse(false, hard, soft, grace, reclaim).expect_err("invalid settings")
}

/// `ParseQuantity(text).String()`.
const QUANTITY_STRINGS: &[(&str, &str)] = &[
    ("1Gi", "1Gi"),
    ("1024Mi", "1Gi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Gi", "512Mi"),
    ("100Mi", "100Mi"),
    ("100M", "100M"),
    ("1500000", "1500k"),
    ("1000", "1k"),
    ("1k", "1k"),
    ("1e3", "1e3"),
    ("1.5e3", "1500"),
    ("1500e3", "1500e3"),
    ("1E3", "1E3"),
    ("0.5", "500m"),
    ("1.5", "1500m"),
    ("-1Gi", "-1Gi"),
    ("-100Mi", "-100Mi"),
    ("0Mi", "0"),
    ("0", "0"),
    ("-0.5", "-500m"),
    ("-1e3", "-1e3"),
    ("0.1Ki", "102400m"),
    ("0.0001Ki", "102400u"),
    ("10Ei", "9223372036854775807"),
    ("-10Ei", "-9223372036854775807"),
    ("1000E", "1"),
    ("1e21", "1e21"),
    ("12e-1", "1200e-3"),
    ("1n", "1n"),
    ("0.0000000001", "1n"),
    ("-1", "-1"),
    ("1023", "1023"),
    ("1025", "1025"),
    ("1024", "1024"),
    ("2048", "2048"),
    ("1000Ki", "1000Ki"),
    ("1.0Ki", "1Ki"),
    ("+5Mi", "+5Mi"),
    ("1m", "1m"),
    ("100000Mi", "100000Mi"),
    ("3e-5", "30e-6"),
    ("7Ei", "7Ei"),
    ("8Ei", "9223372036854775807"),
    ("-8Ei", "-9223372036854775807"),
    ("1Pi", "1Pi"),
    (
        "123456789012345678901234567890",
        "123456789012345678901234567890",
    ),
    ("0.5Ki", "512"),
    ("1500Ki", "1500Ki"),
    ("1e-9", "1e-9"),
    ("1e-10", "1e-9"),
    ("5e18", "5e18"),
    ("1.25e2", "1.25e2"),
    ("01k", "01k"),
    ("+1k", "+1k"),
    ("-0", "0"),
    ("000", "0"),
    ("-0Mi", "0"),
    ("1.G", "1.G"),
    ("5.", "5."),
    (".5Ki", "512"),
    ("2048Ki", "2Mi"),
    ("1048576Ki", "1Gi"),
    ("1024Ki", "1Mi"),
    ("8Ki", "8Ki"),
    ("7Ki", "7Ki"),
    ("0.5Mi", "512Ki"),
    ("3Mi", "3Mi"),
    ("1e-12", "1e-9"),
    ("-1e-12", "-1e-9"),
    ("123456789012345678", "123456789012345678"),
    ("1234567890123456789", "1234567890123456789"),
    ("1E", "1E"),
    ("10E", "10E"),
    ("1Ei", "1Ei"),
    ("1.5Ei", "1536Pi"),
    ("100000000Gi", "100000000Gi"),
    ("1e100", "10e99"),
    ("1.000", "1"),
    ("1000m", "1"),
    ("1500m", "1500m"),
    ("0.001", "1m"),
    ("1u", "1u"),
    ("1000n", "1u"),
    ("12345.6789n", "12346n"),
    ("-1024Mi", "-1Gi"),
    ("0.000000001234Ki", "1264n"),
    ("1.5E3", "1500"),
    ("15e2", "1500"),
    ("150e-2", "1500e-3"),
    ("-1.5", "-1500m"),
    ("999999999999999999999k", "999999999999999999999k"),
    ("1.0", "1"),
    ("10", "10"),
    ("100", "100"),
    ("1e0", "1e0"),
    ("1e1", "10"),
    ("1e2", "100"),
    ("1e-1", "100e-3"),
    ("1000e-3", "1"),
];

/// `NewQuantity(v, format).String()`: BinarySI, DecimalSI, DecimalExponent.
const NEW_QUANTITY_STRINGS: &[(i64, &str, &str, &str)] = &[
    (1073741824, "1Gi", "1073741824", "1073741824"),
    (695431168, "679132Ki", "695431168", "695431168"),
    (104857600, "100Mi", "104857600", "104857600"),
    (1000, "1k", "1k", "1e3"),
    (1500000, "1500000", "1500k", "1500e3"),
    (512, "512", "512", "512"),
    (0, "0", "0", "0"),
    (1023, "1023", "1023", "1023"),
    (1025, "1025", "1025", "1025"),
    (1024, "1Ki", "1024", "1024"),
    (-1024, "-1Ki", "-1024", "-1024"),
    (-1000, "-1k", "-1k", "-1e3"),
    (-1023, "-1023", "-1023", "-1023"),
    (999, "999", "999", "999"),
    (
        4611686018427387904,
        "4Ei",
        "4611686018427387904",
        "4611686018427387904",
    ),
    (
        9223372036854775807,
        "9223372036854775807",
        "9223372036854775807",
        "9223372036854775807",
    ),
    (
        -9223372036854775808,
        "-9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775808",
    ),
    (858993459, "858993459", "858993459", "858993459"),
    (3000, "3000", "3k", "3e3"),
    (1048576000, "1000Mi", "1048576k", "1048576e3"),
    (-5000, "-5000", "-5k", "-5e3"),
    (1000000000000, "976562500Ki", "1T", "1e12"),
    (
        1152921504606846976,
        "1Ei",
        "1152921504606846976",
        "1152921504606846976",
    ),
    (
        3377699720527872,
        "3Pi",
        "3377699720527872",
        "3377699720527872",
    ),
    (1000000000000000000, "976562500000000Ki", "1E", "1e18"),
    (7000000000000000000, "6835937500000000Ki", "7E", "7e18"),
    (-1000000000, "-1000000000", "-1G", "-1e9"),
    (10, "10", "10", "10"),
    (100, "100", "100", "100"),
    (1536, "1536", "1536", "1536"),
];

/// `ParseFloat(TrimRight(text, "%"), 32)`, then `float32 / 100` (its bits), or the error.
const PERCENTAGES: &[(&str, Result<u32, &str>)] = &[
    ("10%", Ok(0x3dcccccd)),
    ("33.3%", Ok(0x3eaa7efa)),
    ("5%", Ok(0x3d4ccccd)),
    ("15%", Ok(0x3e19999a)),
    ("0.1%", Ok(0x3a83126f)),
    ("99.9%", Ok(0x3f7fbe77)),
    ("1e1%", Ok(0x3dcccccd)),
    (
        "x%",
        Err("strconv.ParseFloat: parsing \"x\": invalid syntax"),
    ),
    ("%", Err("strconv.ParseFloat: parsing \"\": invalid syntax")),
    ("10%%", Ok(0x3dcccccd)),
    ("-5%", Ok(0xbd4ccccd)),
    ("101%", Ok(0x3f8147ae)),
    ("100.0%", Ok(0x3f800000)),
    ("0.0%", Ok(0x00000000)),
    ("-0%", Ok(0x80000000)),
    ("inf%", Ok(0x7f800000)),
    ("+inf%", Ok(0x7f800000)),
    ("-Inf%", Ok(0xff800000)),
    ("nan%", Ok(0x7fc00000)),
    ("NaN%", Ok(0x7fc00000)),
    (
        "+nan%",
        Err("strconv.ParseFloat: parsing \"+nan\": invalid syntax"),
    ),
    (
        "-nan%",
        Err("strconv.ParseFloat: parsing \"-nan\": invalid syntax"),
    ),
    ("infinity%", Ok(0x7f800000)),
    (
        "1e40%",
        Err("strconv.ParseFloat: parsing \"1e40\": value out of range"),
    ),
    ("1e-50%", Ok(0x00000000)),
    ("1e-40%", Ok(0x000002ca)),
    (".5%", Ok(0x3ba3d70a)),
    ("5.%", Ok(0x3d4ccccd)),
    (
        ".%",
        Err("strconv.ParseFloat: parsing \".\": invalid syntax"),
    ),
    ("1_0%", Ok(0x3dcccccd)),
    ("0x1p-2%", Ok(0x3b23d70a)),
    (
        " 5%",
        Err("strconv.ParseFloat: parsing \" 5\": invalid syntax"),
    ),
    (
        "5 %",
        Err("strconv.ParseFloat: parsing \"5 \": invalid syntax"),
    ),
    (
        "1e%",
        Err("strconv.ParseFloat: parsing \"1e\": invalid syntax"),
    ),
    ("33.333333333%", Ok(0x3eaaaaaa)),
    ("7.7%", Ok(0x3d9db22d)),
    ("12.34%", Ok(0x3dfcb924)),
    ("50%", Ok(0x3f000000)),
    ("0x1.8p1", Ok(0x3cf5c28f)),
    ("0X_1p0", Ok(0x3c23d70a)),
    (
        "0x1p",
        Err("strconv.ParseFloat: parsing \"0x1p\": invalid syntax"),
    ),
    ("0x.8p1", Ok(0x3c23d70a)),
    ("0x1.fffffep127", Ok(0x7c23d70a)),
    (
        "0x1.ffffffp127",
        Err("strconv.ParseFloat: parsing \"0x1.ffffffp127\": value out of range"),
    ),
    ("0x1p-149", Ok(0x00000000)),
    ("0x1p-150", Ok(0x00000000)),
    ("0x1.8p-150", Ok(0x00000000)),
    ("0x1p-126", Ok(0x000147ae)),
    ("0x1.fffffffffffffffffp0", Ok(0x3ca3d70a)),
    ("0x123456789abcdef0123p0", Ok(0x603a69dc)),
    ("0x1.000001p0", Ok(0x3c23d70a)),
    ("0x1.0000010000000000001p0", Ok(0x3c23d70c)),
    ("0x1.000003p0", Ok(0x3c23d70d)),
    ("0x0.0000000000000000001p0", Ok(0x1623d70a)),
    ("0x1p-1_0", Ok(0x3723d70a)),
    ("0x1.fffffcp-127", Ok(0x000147ae)),
    ("0x1.fffffep-127", Ok(0x000147ae)),
    ("0xffffffp104", Ok(0x7c23d70a)),
    (
        "0x1p128",
        Err("strconv.ParseFloat: parsing \"0x1p128\": value out of range"),
    ),
    ("0x00000001p0", Ok(0x3c23d70a)),
    ("0x.00001p0", Ok(0x3223d70a)),
    ("0x1P+3", Ok(0x3da3d70a)),
    ("0xAbC.dEp-4", Ok(0x3fdbe8cd)),
    ("1_000", Ok(0x41200000)),
    (
        "_1",
        Err("strconv.ParseFloat: parsing \"_1\": invalid syntax"),
    ),
    (
        "1_",
        Err("strconv.ParseFloat: parsing \"1_\": invalid syntax"),
    ),
    (
        "1__0",
        Err("strconv.ParseFloat: parsing \"1__0\": invalid syntax"),
    ),
    (
        "1_.5",
        Err("strconv.ParseFloat: parsing \"1_.5\": invalid syntax"),
    ),
    ("1e1_0", Ok(0x4cbebc20)),
    (
        "1e_1",
        Err("strconv.ParseFloat: parsing \"1e_1\": invalid syntax"),
    ),
    ("0x_1p0", Ok(0x3c23d70a)),
    (
        "0_x1p0",
        Err("strconv.ParseFloat: parsing \"0_x1p0\": invalid syntax"),
    ),
    ("1.e1", Ok(0x3dcccccd)),
    ("+.5", Ok(0x3ba3d70a)),
    ("-.5e-1", Ok(0xba03126f)),
    ("00001", Ok(0x3c23d70a)),
    ("1e-45", Ok(0x00000000)),
    ("1e-46", Ok(0x00000000)),
    ("7e-46", Ok(0x00000000)),
    ("3.4028235e38", Ok(0x7c23d70a)),
    (
        "3.4028236e38",
        Err("strconv.ParseFloat: parsing \"3.4028236e38\": value out of range"),
    ),
    (
        "3.40282357e38",
        Err("strconv.ParseFloat: parsing \"3.40282357e38\": value out of range"),
    ),
    (
        "1e39",
        Err("strconv.ParseFloat: parsing \"1e39\": value out of range"),
    ),
    (
        "1e400",
        Err("strconv.ParseFloat: parsing \"1e400\": value out of range"),
    ),
    ("1e-400", Ok(0x00000000)),
    (
        "1e99999999999999999999",
        Err("strconv.ParseFloat: parsing \"1e99999999999999999999\": value out of range"),
    ),
    ("INF", Ok(0x7f800000)),
    ("Infinity", Ok(0x7f800000)),
    ("-infinity", Ok(0xff800000)),
    (
        "infinit",
        Err("strconv.ParseFloat: parsing \"infinit\": invalid syntax"),
    ),
    (
        "infx",
        Err("strconv.ParseFloat: parsing \"infx\": invalid syntax"),
    ),
    ("NAN", Ok(0x7fc00000)),
    ("nAn", Ok(0x7fc00000)),
    (
        "1.5.5",
        Err("strconv.ParseFloat: parsing \"1.5.5\": invalid syntax"),
    ),
    (
        "..5",
        Err("strconv.ParseFloat: parsing \"..5\": invalid syntax"),
    ),
    (
        "1e+",
        Err("strconv.ParseFloat: parsing \"1e+\": invalid syntax"),
    ),
    (
        "1e-",
        Err("strconv.ParseFloat: parsing \"1e-\": invalid syntax"),
    ),
    (
        "0x",
        Err("strconv.ParseFloat: parsing \"0x\": invalid syntax"),
    ),
    (
        "0x1",
        Err("strconv.ParseFloat: parsing \"0x1\": invalid syntax"),
    ),
    (
        "0xp1",
        Err("strconv.ParseFloat: parsing \"0xp1\": invalid syntax"),
    ),
    (
        "0x.p1",
        Err("strconv.ParseFloat: parsing \"0x.p1\": invalid syntax"),
    ),
    ("0x1.p1", Ok(0x3ca3d70a)),
    ("1.0000000596046447753906250001", Ok(0x3c23d70c)),
    ("1.00000005960464477539062500", Ok(0x3c23d70a)),
    ("16777217", Ok(0x4823d70a)),
    ("16777219", Ok(0x4823d70d)),
    ("1_0.0_1e0_1", Ok(0x3f8020c4)),
    (
        "0b101",
        Err("strconv.ParseFloat: parsing \"0b101\": invalid syntax"),
    ),
    ("1e+1", Ok(0x3dcccccd)),
    (
        "é",
        Err("strconv.ParseFloat: parsing \"é\": invalid syntax"),
    ),
    (
        "a\"b\\",
        Err("strconv.ParseFloat: parsing \"a\\\"b\\\\\": invalid syntax"),
    ),
    (
        "\t",
        Err("strconv.ParseFloat: parsing \"\\t\": invalid syntax"),
    ),
    (
        "\u{a0}",
        Err("strconv.ParseFloat: parsing \"\\u00a0\": invalid syntax"),
    ),
    (
        "\u{200b}1",
        Err("strconv.ParseFloat: parsing \"\\u200b1\": invalid syntax"),
    ),
];

/// `GetThresholdQuantity` of a percentage: capacity, percentage, quantity.
const PERCENT_QUANTITIES: &[(i64, &str, i64)] = &[
    (1000, "10%", 100),
    (8589934592, "33.3%", 2860448256),
    (3221225472, "12.34%", 397499232),
    (123456789, "7.7%", 9506172),
    (9223372036854775807, "100.0%", -9223372036854775808),
    (9223372036854775807, "99.9%", 9214148783565176832),
    (-1000, "10%", -100),
    (0, "50%", 0),
    (9007199254740993, "100.0%", 9007199254740992),
];

/// `time.ParseDuration`: nanoseconds or the error.
const DURATIONS: &[(&str, Result<i64, &str>)] = &[
    ("0", Ok(0)),
    ("-0", Ok(0)),
    ("+0", Ok(0)),
    ("", Err("time: invalid duration \"\"")),
    ("1m30s", Ok(90000000000)),
    ("90s", Ok(90000000000)),
    ("1.5h", Ok(5400000000000)),
    ("-1s", Ok(-1000000000)),
    ("1", Err("time: missing unit in duration \"1\"")),
    ("1x", Err("time: unknown unit \"x\" in duration \"1x\"")),
    ("x", Err("time: invalid duration \"x\"")),
    (".s", Err("time: invalid duration \".s\"")),
    ("1.s", Ok(1000000000)),
    (".5s", Ok(500000000)),
    ("1µs", Ok(1000)),
    ("1μs", Ok(1000)),
    ("1us", Ok(1000)),
    ("9223372036854775807ns", Ok(9223372036854775807)),
    (
        "9223372036854775808ns",
        Err("time: invalid duration \"9223372036854775808ns\""),
    ),
    ("-9223372036854775808ns", Ok(-9223372036854775808)),
    ("2562047h", Ok(9223369200000000000)),
    ("2562048h", Err("time: invalid duration \"2562048h\"")),
    (
        "1h\"",
        Err("time: unknown unit \"h\\\"\" in duration \"1h\\\"\""),
    ),
    ("é", Err("time: invalid duration \"\\xc3\\xa9\"")),
    (
        "1é",
        Err("time: unknown unit \"\\xc3\\xa9\" in duration \"1\\xc3\\xa9\""),
    ),
    ("0s", Ok(0)),
    ("-0s", Ok(0)),
    ("1.0000000000000000000001s", Ok(1000000000)),
    ("3m.5s", Ok(180500000000)),
    (" 1s", Err("time: invalid duration \" 1s\"")),
    ("1s ", Err("time: unknown unit \"s \" in duration \"1s \"")),
    ("1S", Err("time: unknown unit \"S\" in duration \"1S\"")),
    ("\x01", Err("time: invalid duration \"\\x01\"")),
    ("1h1m1s", Ok(3661000000000)),
    ("1.5µs", Ok(1500)),
    ("1.5h30m", Ok(7200000000000)),
    ("0.0000000001s", Ok(0)),
    ("1e3s", Err("time: unknown unit \"e\" in duration \"1e3s\"")),
    (".", Err("time: invalid duration \".\"")),
    ("+", Err("time: invalid duration \"+\"")),
    ("-", Err("time: invalid duration \"-\"")),
    ("--1s", Err("time: invalid duration \"--1s\"")),
    ("1s2", Err("time: missing unit in duration \"1s2\"")),
    ("9223372036854775808ns9223372036854775808ns", Ok(0)),
    ("2562047h47m16.854775807s", Ok(9223372036854775807)),
    (
        "2562047h47m16.854775808s",
        Err("time: invalid duration \"2562047h47m16.854775808s\""),
    ),
    ("-2562047h47m16.854775808s", Ok(-9223372036854775808)),
    (
        "1m-1s",
        Err("time: unknown unit \"m-\" in duration \"1m-1s\""),
    ),
    ("1.ms", Ok(1000000)),
    ("0.333333333333333333333h", Ok(1200000000000)),
    ("5m", Ok(300000000000)),
    ("300ms", Ok(300000000)),
    ("00", Err("time: missing unit in duration \"00\"")),
    ("0.0s", Ok(0)),
    (
        "1\\s",
        Err("time: unknown unit \"\\\\s\" in duration \"1\\\\s\""),
    ),
    (
        "1\x7fs",
        Err("time: unknown unit \"\x7fs\" in duration \"1\x7fs\""),
    ),
];

#[test]
fn quantity_strings_are_upstreams() {
    for (text, want) in QUANTITY_STRINGS {
        assert!(Quantity::parse(text).is_ok(), "{text} parses");
        assert_eq!(quantity_string(text), *want, "String() of {text:?}");
    }
}

#[test]
fn new_quantities_print_as_upstream_in_each_format() {
    for (v, binary, decimal, exponent) in NEW_QUANTITY_STRINGS {
        assert_eq!(format_bytes_binary(*v), *binary, "BinarySI {v}");
        assert_eq!(format_as(*v, "1Mi"), *binary, "like 1Mi: {v}");
        assert_eq!(format_as(*v, "100M"), *decimal, "like 100M: {v}");
        assert_eq!(format_as(*v, "1e3"), *exponent, "like 1e3: {v}");
    }
}

#[test]
fn the_formatter_gives_the_known_texts() {
    assert_eq!(format_bytes_binary(1_073_741_824), "1Gi");
    assert_eq!(format_bytes_binary(695_431_168), "679132Ki");
    assert_eq!(format_bytes_binary(100 * 1024 * 1024), "100Mi");
    assert_eq!(format_as(1000, "1k"), "1k");
    assert_eq!(format_as(1_500_000, "500M"), "1500k");
    for (v, text) in [(512, "512"), (0, "0"), (1023, "1023"), (1025, "1025")] {
        assert_eq!(format_bytes_binary(v), text);
        assert_eq!(format_as(v, "1"), text);
    }
    // below 1024 a binary quantity prints in decimal SI, as upstream does
    assert_eq!(format_bytes_binary(1000), "1k");
    assert_eq!(format_bytes_binary(1024), "1Ki");
    assert_eq!(format_bytes_binary(i64::MIN), "-9223372036854775808");
    // the format is the suffix's: binary, decimal SI, decimal exponent
    assert_eq!(format_as(2048, "0.5Gi"), "2Ki");
    assert_eq!(format_as(2000, "1.5"), "2k");
    assert_eq!(format_as(2000, "15E-1"), "2e3");
    assert_eq!(format_as(2000, "1E"), "2k");
}

#[test]
fn percentages_parse_as_go_float32() {
    for (text, want) in PERCENTAGES {
        let got = match parse_percentage(text, Field::Hard) {
            Ok(v) => Ok(v.to_bits()),
            Err(e) => Err(e.to_string()),
        };
        let want = want.map_err(str::to_string);
        assert_eq!(got, want, "percentage {text:?}");
    }
}

#[test]
fn a_percentage_quantity_truncates_the_float_product() {
    for (capacity, text, want) in PERCENT_QUANTITIES {
        let pct = parse_percentage(text, Field::Hard).expect("a percentage");
        let value = ThresholdValue::Percentage(pct);
        assert_eq!(value.quantity(*capacity), *want, "{text} of {capacity}");
    }
    let t = &parse(false, "memory.available=10%", "", "", "").unwrap()[0];
    assert_eq!(t.quantity(1000), 100);
    // float32 effects: 33.3% is 0.33299998..., so 8Gi gives 2860448256, not 2860448276
    let t = &parse(false, "memory.available=33.3%", "", "", "").unwrap()[0];
    assert_eq!(t.quantity(8 << 30), 2_860_448_256);
    assert_eq!(t.threshold_quantity_text(8 << 30), "2860448256");
    // NaN is accepted by the kubelet; its quantity is MinInt64 (amd64), so it never fires
    let t = &parse(false, "memory.available=nan%", "", "", "").unwrap()[0];
    assert_eq!(t.quantity(8 << 30), i64::MIN);
    assert_eq!(t.threshold_quantity_text(8 << 30), "-9223372036854775808");
}

#[test]
fn durations_parse_as_go() {
    for (text, want) in DURATIONS {
        let want = want.map_err(str::to_string);
        assert_eq!(go_parse_duration(text), want, "duration {text:?}");
    }
}

#[test]
fn thresholds_come_out_as_the_kubelets() {
    // each line: the kubelet's own output, with Go's random map order made key order
    assert_eq!(
        ok(false, "memory.available=1Gi", "", "", ""),
        "memory.available:1Gi:0s:-"
    );
    assert_eq!(
        ok(
            true,
            "memory.available=100Mi;nodefs.available=10%",
            "memory.available=2Gi;pid.available=5%",
            "memory.available=1m30s;pid.available=0s",
            "memory.available=500Mi"
        ),
        "memory.available:100Mi:0s:500Mi nodefs.available:0.1:0s:- \
         memory.available:2Gi:1m30s:500Mi pid.available:0.05:0s:- \
         allocatableMemory.available:100Mi:0s:500Mi"
    );
    assert_eq!(
        ok(
            true,
            "memory.available=10%;pid.available=1000",
            "memory.available=20%",
            "memory.available=1m",
            "memory.available=1%"
        ),
        "memory.available:0.1:0s:0.01 pid.available:1k:0s:- memory.available:0.2:1m0s:0.01 \
         allocatableMemory.available:0.1:0s:0.01"
    );
    assert_eq!(ok(true, "", "", "", ""), "");
    assert_eq!(
        ok(true, "allocatableMemory.available=1Gi", "", "", ""),
        "allocatableMemory.available:1Gi:0s:-"
    );
    assert_eq!(
        ok(false, "memory.available=1.5Gi", "", "", ""),
        "memory.available:1536Mi:0s:-"
    );
    assert_eq!(
        ok(
            false,
            "memory.available=1Gi",
            "",
            "pid.available=1s",
            "pid.available=10%"
        ),
        "memory.available:1Gi:0s:-"
    );
}

#[test]
fn a_soft_threshold_with_zero_grace_is_hard_and_copied() {
    let ts = parse(
        true,
        "memory.available=100Mi",
        "memory.available=200Mi",
        "memory.available=0s",
        "",
    )
    .unwrap();
    assert_eq!(
        render(&ts),
        "memory.available:100Mi:0s:- memory.available:200Mi:0s:- \
         allocatableMemory.available:100Mi:0s:- allocatableMemory.available:200Mi:0s:-"
    );
    assert!(ts.iter().all(Threshold::is_hard));
    for grace in ["-0s", "0"] {
        let ts = parse(
            false,
            "",
            "memory.available=1Gi",
            &format!("memory.available={grace}"),
            "",
        )
        .unwrap();
        assert_eq!(render(&ts), "memory.available:1Gi:0s:-", "grace {grace}");
    }
}

#[test]
fn the_allocatable_copy_needs_pods_and_a_hard_memory_threshold() {
    let ts = parse(false, "memory.available=100Mi", "", "", "").unwrap();
    assert_eq!(ts.len(), 1);
    let enforce = ["system-reserved".to_string(), "pods".to_string()];
    let ts = parse_threshold_config(
        &enforce,
        &map(&[("memory.available", "100Mi"), ("pid.available", "10%")]),
        &map(&[("memory.available", "1Gi")]),
        &map(&[("memory.available", "30s")]),
        &map(&[("memory.available", "50Mi")]),
    )
    .unwrap();
    let copy = ts.last().unwrap();
    assert_eq!(ts.len(), 4);
    assert_eq!(copy.signal, Signal::AllocatableMemoryAvailable);
    assert!(copy.is_hard());
    assert_eq!(copy.quantity(0), 100 << 20);
    assert_eq!(copy.min_reclaim_quantity(0), 50 << 20);
    assert_eq!(copy.threshold_quantity_text(0), "100Mi");
    assert_eq!(ts[2].grace_period, Duration::from_secs(30));
    assert!(!ts[2].is_hard());
}

#[test]
fn zero_and_hundred_percent_drop_the_threshold_only_when_written_exactly() {
    assert_eq!(
        ok(
            false,
            "memory.available=0%;nodefs.available=100%",
            "",
            "",
            ""
        ),
        ""
    );
    assert_eq!(
        ok(
            false,
            "memory.available=0.0%;nodefs.available=100.0%",
            "",
            "",
            ""
        ),
        "memory.available:0:0s:- nodefs.available:1:0s:-"
    );
    // a dropped soft threshold needs no grace period
    assert_eq!(ok(false, "", "memory.available=0%", "", ""), "");
}

#[test]
fn every_error_is_the_kubelets_and_names_its_setting() {
    let regex = "quantities must match the regular expression \
                 '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
    let cases: &[(ThresholdError, &str, Field)] = &[
        (
            err("memory.availble=1Gi", "", "", ""),
            "unsupported eviction signal memory.availble",
            Field::Hard,
        ),
        (
            err("", "memory.availble=1Gi", "memory.availble=1s", ""),
            "unsupported eviction signal memory.availble",
            Field::Soft,
        ),
        (
            err("", "", "memory.availble=1s", ""),
            "unsupported eviction signal memory.availble",
            Field::SoftGracePeriod,
        ),
        (
            err("", "", "", "memory.availble=1Gi"),
            "unsupported eviction signal memory.availble",
            Field::MinimumReclaim,
        ),
        (
            err("memory.available=x%", "", "", ""),
            "strconv.ParseFloat: parsing \"x\": invalid syntax",
            Field::Hard,
        ),
        (
            err("memory.available=%", "", "", ""),
            "strconv.ParseFloat: parsing \"\": invalid syntax",
            Field::Hard,
        ),
        (
            err("memory.available=-5%", "", "", ""),
            "eviction percentage threshold memory.available must be >= 0%: -5%",
            Field::Hard,
        ),
        (
            err("", "memory.available=101%", "memory.available=1s", ""),
            "eviction percentage threshold memory.available must be <= 100%: 101%",
            Field::Soft,
        ),
        (
            err("memory.available=1e40%", "", "", ""),
            "strconv.ParseFloat: parsing \"1e40\": value out of range",
            Field::Hard,
        ),
        (err("memory.available=1Gb", "", "", ""), regex, Field::Hard),
        (
            err("memory.available=0", "", "", ""),
            "eviction threshold memory.available must be positive: 0",
            Field::Hard,
        ),
        (
            err("memory.available=0Mi", "", "", ""),
            "eviction threshold memory.available must be positive: 0",
            Field::Hard,
        ),
        (
            err("memory.available=-1024Mi", "", "", ""),
            "eviction threshold memory.available must be positive: -1Gi",
            Field::Hard,
        ),
        (
            err("memory.available=-0.5", "", "", ""),
            "eviction threshold memory.available must be positive: -500m",
            Field::Hard,
        ),
        (
            err("", "memory.available=1Gi", "", ""),
            "grace period must be specified for the soft eviction threshold memory.available",
            Field::SoftGracePeriod,
        ),
        (
            err("", "memory.available=1Gi", "memory.available=x", ""),
            "time: invalid duration \"x\"",
            Field::SoftGracePeriod,
        ),
        (
            err("", "memory.available=1Gi", "memory.available=1", ""),
            "time: missing unit in duration \"1\"",
            Field::SoftGracePeriod,
        ),
        (
            err("", "memory.available=1Gi", "memory.available=1y", ""),
            "time: unknown unit \"y\" in duration \"1y\"",
            Field::SoftGracePeriod,
        ),
        (
            err("", "memory.available=1Gi", "memory.available=-1s", ""),
            "invalid eviction grace period specified: -1s, must be a positive value",
            Field::SoftGracePeriod,
        ),
        (
            err("memory.available=1Gi", "", "", "memory.available=0%"),
            "eviction percentage minimum reclaim memory.available must be positive: 0%",
            Field::MinimumReclaim,
        ),
        (
            err("memory.available=1Gi", "", "", "memory.available=-1%"),
            "eviction percentage minimum reclaim memory.available must be positive: -1%",
            Field::MinimumReclaim,
        ),
        (
            err("memory.available=1Gi", "", "", "memory.available=-1Mi"),
            "negative eviction minimum reclaim specified for memory.available",
            Field::MinimumReclaim,
        ),
        (
            err("memory.available=1Gi", "", "", "memory.available=x"),
            regex,
            Field::MinimumReclaim,
        ),
        (
            err("memory.available=1Gi", "", "", "memory.available=abc%"),
            "strconv.ParseFloat: parsing \"abc\": invalid syntax",
            Field::MinimumReclaim,
        ),
    ];
    for (e, text, field) in cases {
        assert_eq!(e.to_string(), *text);
        assert_eq!(e.field(), *field, "{text}");
    }
}

#[test]
fn minimum_reclaim_accepts_zero_and_has_no_upper_bound() {
    let ts = parse(false, "memory.available=1Gi", "", "", "memory.available=0").unwrap();
    assert_eq!(render(&ts), "memory.available:1Gi:0s:0");
    assert_eq!(ts[0].min_reclaim_quantity(1 << 30), 0);
    let ts = parse(
        false,
        "memory.available=1Gi",
        "",
        "",
        "memory.available=500%",
    )
    .unwrap();
    assert_eq!(render(&ts), "memory.available:1Gi:0s:5");
    assert_eq!(ts[0].min_reclaim_quantity(1000), 5000);
    let ts = parse(false, "memory.available=1Gi", "", "", "").unwrap();
    assert_eq!(ts[0].min_reclaim_quantity(1000), 0);
}

#[test]
fn errors_come_in_the_kubelets_order() {
    // hard before soft
    let e = err("memory.available=x%", "pid.available=-1", "", "");
    assert_eq!(e.field(), Field::Hard);
    // the grace periods and minimum reclaims are parsed before a missing grace is reported
    let e = err("", "memory.available=1Gi", "", "memory.available=-1Mi");
    assert_eq!(e.field(), Field::MinimumReclaim);
    let e = err("", "memory.available=1Gi", "pid.available=x", "");
    assert_eq!(e.to_string(), "time: invalid duration \"x\"");
    // within a map, in key order (Go's is random)
    let e = err("memory.available=0;bogus=1Gi;pid.available=-5%", "", "", "");
    assert_eq!(e.to_string(), "unsupported eviction signal bogus");
    let e = err("memory.available=0;pid.available=-5%", "", "", "");
    assert_eq!(
        e.to_string(),
        "eviction threshold memory.available must be positive: 0"
    );
}

#[test]
fn grace_entries_without_a_soft_threshold_are_ignored() {
    let ts = parse(false, "", "", "memory.available=1m", "").unwrap();
    assert!(ts.is_empty());
}

#[test]
fn the_linux_defaults_apply_only_from_a_file() {
    let defaults = map(&DEFAULT_EVICTION_HARD);
    assert_eq!(defaults.len(), 5);
    assert!(!defaults.contains_key("pid.available"));
    assert_eq!(defaults["memory.available"], "100Mi");
    assert_eq!(defaults["imagefs.inodesFree"], "5%");
    // a file without evictionHard: the defaults, with or without merge
    assert_eq!(effective_hard(None, false, true), defaults);
    assert_eq!(effective_hard(None, true, true), defaults);
    // a file's map as is without merge, `{}` included
    let user = map(&[("memory.available", "1Gi"), ("pid.available", "10%")]);
    assert_eq!(effective_hard(Some(&user), false, true), user);
    assert!(effective_hard(Some(&BTreeMap::new()), false, true).is_empty());
    // merge: the missing default keys added, the user's keys win
    let merged = effective_hard(Some(&user), true, true);
    assert_eq!(merged.len(), 6);
    assert_eq!(merged["memory.available"], "1Gi");
    assert_eq!(merged["nodefs.available"], "10%");
    assert_eq!(merged["pid.available"], "10%");
    assert_eq!(effective_hard(Some(&BTreeMap::new()), true, true), defaults);
    // flags only: never the defaults
    assert!(effective_hard(None, true, false).is_empty());
    assert_eq!(effective_hard(Some(&user), true, false), user);
    // the defaults parse: one memory threshold, four disk ones, the allocatable copy
    let ts = parse_threshold_config(
        &["pods".to_string()],
        &defaults,
        &BTreeMap::new(),
        &BTreeMap::new(),
        &BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(ts.len(), 6);
    assert_eq!(ts.iter().filter(|t| t.signal.evaluated()).count(), 2);
    assert_eq!(ts[5].signal, Signal::AllocatableMemoryAvailable);
    assert_eq!(ts[5].threshold_quantity_text(0), "100Mi");
}

#[test]
fn signals_have_the_kubelets_names_and_resources() {
    assert_eq!(Signal::ALL.len(), 9);
    for s in Signal::ALL {
        assert_eq!(Signal::parse(s.as_str()), Some(s));
        assert_eq!(s.to_string(), s.as_str());
    }
    assert_eq!(Signal::parse("Memory.available"), None);
    assert_eq!(Signal::parse(""), None);
    let resources: Vec<&str> = Signal::ALL.iter().map(|s| s.resource().as_str()).collect();
    assert_eq!(
        resources,
        [
            "memory",
            "memory",
            "ephemeral-storage",
            "inodes",
            "ephemeral-storage",
            "inodes",
            "ephemeral-storage",
            "inodes",
            "pids"
        ]
    );
    let evaluated: Vec<Signal> = Signal::ALL.into_iter().filter(|s| s.evaluated()).collect();
    assert_eq!(
        evaluated,
        [
            Signal::MemoryAvailable,
            Signal::AllocatableMemoryAvailable,
            Signal::PidAvailable
        ]
    );
    let memory: Vec<Signal> = Signal::ALL.into_iter().filter(|s| s.is_memory()).collect();
    assert_eq!(
        memory,
        [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]
    );
    assert_eq!(Resource::Pids.to_string(), "pids");
    assert_eq!(
        Field::SoftGracePeriod.config_name(),
        "evictionSoftGracePeriod"
    );
    assert_eq!(Field::Hard.to_string(), "evictionHard");
    assert_eq!(Field::Soft.config_name(), "evictionSoft");
    assert_eq!(
        Field::MinimumReclaim.config_name(),
        "evictionMinimumReclaim"
    );
}

#[test]
fn thresholds_compare_as_has_threshold_does() {
    let one = |hard: &str, reclaim: &str| parse(false, hard, "", "", reclaim).unwrap().remove(0);
    let a = one("memory.available=1Gi", "");
    // the same value written otherwise, another minimum reclaim: the same threshold
    assert_eq!(a, one("memory.available=1024Mi", "memory.available=1Mi"));
    assert_ne!(a, one("memory.available=1G", ""));
    assert_ne!(a, one("pid.available=1Gi", ""));
    let soft = parse(false, "", "memory.available=1Gi", "memory.available=1s", "")
        .unwrap()
        .remove(0);
    assert_ne!(a, soft);
    assert_eq!(
        one("memory.available=10%", ""),
        one("memory.available=10.0%", "")
    );
    assert_ne!(
        one("memory.available=10%", ""),
        one("memory.available=10Mi", "")
    );
    // Go's float equality: NaN equals nothing
    let nan = one("memory.available=nan%", "");
    assert_ne!(nan, nan.clone());
}

#[test]
fn threshold_texts_are_what_the_kubelet_prints() {
    let text = |hard: &str, capacity: i64| {
        parse(false, hard, "", "", "").unwrap()[0].threshold_quantity_text(capacity)
    };
    assert_eq!(text("memory.available=1Gi", 0), "1Gi");
    assert_eq!(text("memory.available=1024Mi", 0), "1Gi");
    assert_eq!(text("memory.available=+5Mi", 0), "+5Mi");
    assert_eq!(text("memory.available=1500000", 0), "1500k");
    assert_eq!(text("memory.available=50%", 2 << 30), "1Gi");
    assert_eq!(text("memory.available=10%", 8 << 30), "858993472");
    assert_eq!(text("pid.available=10%", 4_194_304), "419430");
}

#[test]
fn hexadecimal_and_separated_percentages_are_gos() {
    let pct = |s: &str| parse_percentage(s, Field::Hard);
    assert_eq!(pct("0x1p-2%"), Ok(0.0025));
    assert_eq!(pct("1_0%"), Ok(0.1));
    assert!(pct("1__0%").is_err());
    assert!(pct("0x1%").is_err());
    // the 24-bit rounding of a long hexadecimal mantissa, ties to even
    assert_eq!(go_parse_f32("0x1.000001p0"), Ok(1.0));
    assert_eq!(go_parse_f32("0x1.000003p0"), Ok(1.000_000_2));
    assert_eq!(go_parse_f32("0x1p-149"), Ok(f32::from_bits(1)));
    assert_eq!(go_parse_f32("0x1p128"), Err(FloatError::Range));
}

#[test]
fn quoting_is_gos() {
    assert_eq!(go_quote("a\"b\\"), "\"a\\\"b\\\\\"");
    assert_eq!(go_quote("\t\u{7f}\u{1}"), "\"\\t\\x7f\\x01\"");
    assert_eq!(
        go_quote("é\u{a0}\u{1F600}\u{10ffff}"),
        "\"é\\u00a0😀\\U0010ffff\""
    );
    assert_eq!(time_quote("1é\"\u{1}"), "\"1\\xc3\\xa9\\\"\\x01\"");
}
