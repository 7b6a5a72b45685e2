//! The quantity port against what k8s.io/apimachinery v0.36.6 printed for upstream's own test
//! inputs and edge cases (`quantity_vectors.tsv`): the error kind, the backend it chose with its
//! numbers, `Value()`, `MilliValue()` and `ScaledValue(Kilo)`.

use super::quantity::{Quantity, QuantityError, Resources, is_scalar_resource_name};

const VECTORS: &str = include_str!("quantity_vectors.tsv");

/// The one vector read differently on purpose: a power of ten past ±100,000 is refused.
const DEVIATIONS: &[&str] = &["1e2147483647"];

fn field<'a>(f: &'a str, key: &str) -> &'a str {
    f.strip_prefix(key)
        .unwrap_or_else(|| panic!("{f:?} is not {key}…"))
}

#[test]
fn every_vector_reads_as_upstream_reads_it() {
    let mut checked = 0;
    for line in VECTORS.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split('\t').collect();
        let input: String = serde_json::from_str(f[0]).unwrap();
        let got = Quantity::parse(&input);
        if DEVIATIONS.contains(&input.as_str()) {
            assert_eq!(got, Err(QuantityError::ExponentTooLarge), "{input:?}");
            checked += 1;
            continue;
        }
        match f[1] {
            "ERR" => {
                let want = match f[2] {
                    "ErrFormatWrong" => QuantityError::FormatWrong,
                    "ErrSuffix" => QuantityError::Suffix,
                    "ErrNumeric" => QuantityError::Numeric,
                    other => panic!("unknown error {other}"),
                };
                assert_eq!(got, Err(want), "{input:?}");
            }
            "OK" => {
                let q = got.unwrap_or_else(|e| panic!("{input:?}: {e}"));
                assert_eq!(q.backend(), f[4], "{input:?} backend");
                assert_eq!(
                    q.value().to_string(),
                    field(f[5], "Value="),
                    "{input:?} Value"
                );
                assert_eq!(
                    q.milli_value().to_string(),
                    field(f[6], "MilliValue="),
                    "{input:?} MilliValue"
                );
                assert_eq!(
                    q.scaled_value(3).to_string(),
                    field(f[7], "ScaledValue(Kilo)="),
                    "{input:?} ScaledValue(Kilo)"
                );
            }
            other => panic!("bad line {other}"),
        }
        checked += 1;
    }
    assert!(checked > 500, "{checked}");
}

/// Every CPU quantity from 1m to 4000m, written as millicores and as cores, reads as itself
/// (the float parser read 515 of them 1m high).
#[test]
fn every_millicore_is_exact() {
    for m in 1..=4000i64 {
        assert_eq!(Quantity::parse(&format!("{m}m")).unwrap().milli_value(), m);
        let cores = format!("{}.{:03}", m / 1000, m % 1000);
        assert_eq!(Quantity::parse(&cores).unwrap().milli_value(), m, "{cores}");
    }
}

/// Sums are exact and read once: two containers of 0.5m are 1m.
#[test]
fn sums_are_read_once() {
    let mut q: Quantity = "0.5m".parse().unwrap();
    q.add(&"0.5m".parse().unwrap());
    assert_eq!(q.milli_value(), 1);
    let mut q: Quantity = "100Mi".parse().unwrap();
    q.add(&"0.5".parse().unwrap());
    assert_eq!(q.value(), 100 * 1024 * 1024 + 1);
    // an int64 overflow becomes an exact decimal
    let mut q: Quantity = "9E".parse().unwrap();
    q.add(&"9E".parse().unwrap());
    assert_eq!(
        q.cmp_value(&"18E".parse().unwrap()),
        std::cmp::Ordering::Equal
    );
    let big: Quantity = "2".parse().unwrap();
    assert_eq!(big.max(&"1500m".parse().unwrap()).milli_value(), 2000);
}

#[test]
fn scalar_resource_names_are_the_schedulers() {
    for (n, want) in [
        ("nvidia.com/gpu", true),
        ("example.com/foo_bar", true),
        ("example.com/Foo", true),
        ("Example.com/foo", false),
        ("hugepages-2Mi", true),
        ("attachable-volumes-aws-ebs", true),
        ("kubernetes.io/foo", true),
        ("foo.kubernetes.io/bar", true),
        ("storage", false),
        ("foo", false),
        ("requests.example.com/foo", false),
        ("a/b/c", false),
        ("example.com/", false),
        ("/foo", false),
        ("example.com/-foo", false),
        (&format!("example.com/{}", "a".repeat(63)), true),
        (&format!("example.com/{}", "a".repeat(64)), false),
    ] {
        assert_eq!(is_scalar_resource_name(n), want, "{n}");
    }
    let list = [
        ("cpu", "350m"),
        ("memory", "1.5Gi"),
        ("pods", "110"),
        ("storage", "1Gi"),
        ("example.com/dongle", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
    .collect();
    let r = Resources::from_list(&list);
    assert_eq!(
        (r.milli_cpu, r.memory, r.pods, r.scalar.len()),
        (350, 1_610_612_736, 110, 1)
    );
}

/// A hostile exponent is refused, not computed for minutes (upstream hangs on some of these),
/// on every path: a decimal, a zero, an int64 amount; sums stay bounded.
#[test]
fn an_absurd_exponent_is_refused_quickly() {
    for q in [
        "1.0000000000000000001e2147483600",
        "0e-2000000000",
        "1e2000000000",
        "1e100001",
        "0.0e100002",
    ] {
        assert_eq!(
            Quantity::parse(q),
            Err(QuantityError::ExponentTooLarge),
            "{q}"
        );
    }
    // the largest power allowed still adds and reads at once
    let mut q: Quantity = "1e100000".parse().unwrap();
    q.add(&"1".parse().unwrap());
    q.add(&"1e-9".parse().unwrap());
    assert_eq!(
        q.cmp_value(&"1e100000".parse().unwrap()),
        std::cmp::Ordering::Greater
    );
    let _ = (q.value(), q.milli_value());
}
