//! Unit tests of node-pressure eviction's settings: the kubelet's defaults, flag syntax,
//! layering, files, and errors naming the field (and the kubelet's file when it alone is at
//! fault).
use super::super::{ConfigError, RawSettings, Settings, load, resolve};
use super::*;
use std::path::PathBuf;

const KUBELET_HEADER: &str =
    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn text(v: &str) -> Option<Given<SignalMap>> {
    Some(Given::Text(v.into()))
}

/// A field and the flag's text for it.
type Pair<'a> = (&'a str, &'a str);

/// Settings as flags give them: (field, the flag's text) pairs.
fn flags(fields: &[(&str, &str)]) -> RawSettings {
    let mut r = RawSettings::default();
    for &(field, v) in fields {
        let v = Some(v.to_string());
        if let Some(slot) = map_slot(&mut r, field) {
            *slot = v.map(Given::Text);
            continue;
        }
        match field {
            EVICTION_MAX_POD_GRACE_PERIOD => r.eviction_max_pod_grace_period = v,
            EVICTION_PRESSURE_TRANSITION_PERIOD => r.eviction_pressure_transition_period = v,
            MERGE_DEFAULT_EVICTION_SETTINGS => r.merge_default_eviction_settings = v,
            ENFORCE_NODE_ALLOCATABLE => r.enforce_node_allocatable = v.map(Given::Text),
            "kubeletConfig" => r.kubelet_config = v,
            _ => panic!("unknown field {field}"),
        }
    }
    r
}

fn resolved(fields: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    resolve(flags(fields))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f
}

/// Each threshold as `signal<value`, then its grace period (soft) and minimum reclaim.
fn thresholds(s: &Settings) -> Vec<String> {
    s.pressure
        .thresholds
        .iter()
        .map(|t| {
            let mut line = format!("{}<{}", t.signal, t.value_text);
            if !t.grace_period.is_zero() {
                line += &format!(" {}s", t.grace_period.as_secs());
            }
            if let Some(min) = &t.min_reclaim_text {
                line += &format!(" min={min}");
            }
            line
        })
        .collect()
}

/// The kubelet's Linux `evictionHard` defaults, in key order.
const DEFAULTS: [&str; 5] = [
    "imagefs.available<15%",
    "imagefs.inodesFree<5%",
    "memory.available<100Mi",
    "nodefs.available<10%",
    "nodefs.inodesFree<5%",
];

/// The kubelet's defaults with a config file: the Linux `evictionHard` map (no
/// `pid.available`), `enforceNodeAllocatable: [pods]` (so an `allocatableMemory.available` copy
/// of the hard memory threshold), no grace override, conditions held 5m.
#[test]
fn defaults_are_the_kubelets_from_a_config_file() {
    let s = resolve(RawSettings::default()).unwrap();
    let mut want = DEFAULTS.to_vec();
    want.push("allocatableMemory.available<100Mi");
    assert_eq!(thresholds(&s), want);
    assert_eq!(s.pressure.max_pod_grace_period, 0);
    let period = |s: &Settings| s.pressure.pressure_transition_period.as_secs();
    assert_eq!(period(&s), 300);
    assert!(s.pressure.any_evaluated());
    // the transition period: a zero value is the default, a negative one holds nothing
    for (v, want) in [
        ("90s", 90),
        ("1m30s", 90),
        ("0s", 300),
        ("0", 300),
        ("-0s", 300),
        ("-1m", 0),
        ("+2m", 120),
    ] {
        let s = resolved(&[(EVICTION_PRESSURE_TRANSITION_PERIOD, v)]).unwrap();
        assert_eq!(period(&s), want, "{v}");
    }
}

/// A set `evictionHard` is used as it is (`""`, the empty map: no hard threshold at all);
/// with `mergeDefaultEvictionSettings` it gains the default keys it lacks, its own winning.
#[test]
fn a_set_map_replaces_the_defaults_unless_merged() {
    let with = |map: &str, merge: &str| {
        let s = resolved(&[
            (EVICTION_HARD, map),
            (MERGE_DEFAULT_EVICTION_SETTINGS, merge),
        ]);
        thresholds(&s.unwrap())
    };
    let one = ["memory.available<1Gi", "allocatableMemory.available<1Gi"];
    assert_eq!(with("memory.available<1Gi", "false"), one);
    assert_eq!(
        thresholds(&resolved(&[(EVICTION_HARD, "memory.available<1Gi")]).unwrap()),
        one
    );
    assert_eq!(with("", "false"), Vec::<String>::new());
    assert!(
        !resolved(&[(EVICTION_HARD, "")])
            .unwrap()
            .pressure
            .any_evaluated()
    );
    assert_eq!(
        with("memory.available<1Gi,pid.available<10%", "true"),
        [
            "imagefs.available<15%",
            "imagefs.inodesFree<5%",
            "memory.available<1Gi",
            "nodefs.available<10%",
            "nodefs.inodesFree<5%",
            "pid.available<10%",
            "allocatableMemory.available<1Gi",
        ]
    );
    assert_eq!(with("", "true").len(), 6);
    // `0%` drops a default signal explicitly: no memory threshold, no allocatable copy
    assert_eq!(
        with("memory.available<0%", "true"),
        DEFAULTS[..2]
            .iter()
            .chain(&DEFAULTS[3..])
            .copied()
            .collect::<Vec<_>>()
    );
}

/// The kubelet's flag syntax: `sig<val` pairs for the thresholds, `sig=val` for the grace
/// periods and minimum reclaims, split on `,` then on the first separator, trimmed.
#[test]
fn the_flag_syntax_is_the_kubelets() {
    let s = resolved(&[
        (
            EVICTION_HARD,
            " memory.available < 500Mi ,,pid.available<5%",
        ),
        (EVICTION_SOFT, "memory.available<1.5Gi"),
        (
            EVICTION_SOFT_GRACE_PERIOD,
            "memory.available=1m30s,nodefs.available=2m",
        ),
        (EVICTION_MINIMUM_RECLAIM, "memory.available=100Mi"),
        (EVICTION_MAX_POD_GRACE_PERIOD, "60"),
    ])
    .unwrap();
    assert_eq!(
        thresholds(&s),
        [
            "memory.available<500Mi min=100Mi",
            "pid.available<5%",
            "memory.available<1.5Gi 90s min=100Mi",
            "allocatableMemory.available<500Mi min=100Mi",
        ]
    );
    assert_eq!(s.pressure.max_pod_grace_period, 60);
    // a later key wins; the value keeps everything after the first separator
    assert_eq!(
        flag_map("a<1,a<2,b< <3", '<').unwrap(),
        SignalMap::from([("a".into(), "2".into()), ("b".into(), "<3".into())])
    );
    assert_eq!(
        flag_map("a=b=c", '=').unwrap(),
        SignalMap::from([("a".into(), "b=c".into())])
    );
    for (field, value, expect) in [
        (EVICTION_HARD, "memory.available=100Mi", "string<string"),
        (
            EVICTION_SOFT,
            "memory.available<1Gi,nodefs",
            "string<string",
        ),
        (
            EVICTION_SOFT_GRACE_PERIOD,
            "memory.available<1m",
            "string=string",
        ),
        (
            EVICTION_MINIMUM_RECLAIM,
            "memory.available",
            "string=string",
        ),
    ] {
        let e = resolved(&[(field, value)]).unwrap_err();
        assert_eq!(e.field, field, "{value}: {e}");
        assert_eq!(e.why, format!("{value:?}: malformed pair, expect {expect}"));
    }
}

/// `evictionMaxPodGracePeriod` is the kubelet's `int32` flag (`ParseInt(s, 0, 32)`); any sign.
#[test]
fn the_max_pod_grace_period_is_an_int32() {
    let grace = |v: &str| {
        resolved(&[(EVICTION_MAX_POD_GRACE_PERIOD, v)]).map(|s| s.pressure.max_pod_grace_period)
    };
    for (v, want) in [
        ("30", 30),
        ("-5", -5),
        ("+7", 7),
        ("0x10", 16),
        ("010", 8),
        ("0o10", 8),
        ("0b11", 3),
        ("1_000", 1000),
        ("0x_1f", 31),
        ("2147483647", 2_147_483_647),
        ("-2147483648", -2_147_483_648),
        (" 12 ", 12),
    ] {
        assert_eq!(grace(v), Ok(want), "{v}");
    }
    let bad = "|30s|1.5|2147483648|-2147483649|_1|1_|1__0|0x|09|-";
    for v in bad.split('|') {
        let e = grace(v).unwrap_err();
        assert_eq!(e.field, EVICTION_MAX_POD_GRACE_PERIOD, "{v:?}: {e}");
    }
}

/// Errors the kubelet refuses to start with, exit 64 naming the field, with its text.
#[test]
fn invalid_thresholds_name_their_field_with_the_kubelets_text() {
    let soft = (EVICTION_SOFT, "memory.available<1Gi");
    let cases: [(&[Pair], &str, &str); 5] = [
        (
            &[soft],
            EVICTION_SOFT_GRACE_PERIOD,
            "grace period must be specified for the soft eviction threshold memory.available",
        ),
        (
            &[(EVICTION_HARD, "memory.free<1Gi")],
            EVICTION_HARD,
            "unsupported eviction signal memory.free",
        ),
        (
            &[(EVICTION_MINIMUM_RECLAIM, "memory.available=-1Gi")],
            EVICTION_MINIMUM_RECLAIM,
            "negative eviction minimum reclaim specified for memory.available",
        ),
        (
            &[soft, (EVICTION_SOFT_GRACE_PERIOD, "memory.available=soon")],
            EVICTION_SOFT_GRACE_PERIOD,
            "time: invalid duration \"soon\"",
        ),
        (
            &[(EVICTION_HARD, "memory.available<0")],
            EVICTION_HARD,
            "eviction threshold memory.available must be positive: 0",
        ),
    ];
    for (given, field, why) in cases {
        let e = resolved(given).unwrap_err();
        assert_eq!(
            e,
            ConfigError {
                field,
                why: why.into()
            }
        );
        assert_eq!(
            e.to_string(),
            format!("invalid configuration: {field}: {why}")
        );
    }
}

/// `ValidateKubeletConfiguration`'s rules and texts; `pods` adds the allocatable copy.
#[test]
fn enforce_node_allocatable_is_validated_as_the_kubelets() {
    let enforce = |v: &str| resolved(&[(ENFORCE_NODE_ALLOCATABLE, v)]);
    let copies = |s: Settings| {
        let copy = |t: &&thresholds::Threshold| t.signal.as_str() == "allocatableMemory.available";
        s.pressure.thresholds.iter().filter(copy).count()
    };
    for (v, n) in [
        ("pods", 1),
        ("pods,system-reserved,kube-reserved-compressible", 1),
        ("none", 0),
        ("", 0),
        ("system-reserved-compressible,kube-reserved", 0),
    ] {
        assert_eq!(copies(enforce(v).unwrap()), n, "{v:?}");
    }
    const NAME: &str = "enforceNodeAllocatable (--enforce-node-allocatable)";
    let alone =
        format!("{NAME} may not contain additional enforcements when \"none\" is specified");
    let both =
        |a: &str, b: &str| format!("both {a:?} and {b:?} cannot be specified together in {NAME}");
    let option = |o: &str| {
        format!(
            "option {o:?} specified for {NAME}. Valid options are \"pods\", \"system-reserved\", \
             \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" \
             or \"none\""
        )
    };
    for (v, why) in [
        ("pods,none", alone.clone()),
        // the kubelet's first error: `none` with another entry, before the duplicate
        ("none,none", alone),
        (
            "pods,pods",
            format!("duplicated enforcements \"pods\" in {NAME}"),
        ),
        (
            "system-reserved,system-reserved-compressible",
            both("system-reserved", "system-reserved-compressible"),
        ),
        (
            "kube-reserved-compressible,kube-reserved",
            both("kube-reserved", "kube-reserved-compressible"),
        ),
        // items are not trimmed (a CSV field), nor lower-cased
        ("pods, kube-reserved", option(" kube-reserved")),
        ("Pods", option("Pods")),
    ] {
        let e = enforce(v).unwrap_err();
        assert_eq!(e.field, ENFORCE_NODE_ALLOCATABLE, "{v:?}: {e}");
        assert_eq!(e.why, why, "{v:?}");
    }
}

/// The kubelet's file: maps of strings, a list, an int32, a duration and a boolean, read with
/// the kubelet's types; reported as used; each map replaced whole by a higher layer.
#[test]
fn the_kubelets_file_gives_the_maps_below_reaplets_settings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubelet = write(
        d,
        "kubelet.yaml",
        &format!(
            "{KUBELET_HEADER}evictionHard:\n  memory.available: 200Mi\n  nodefs.available: 5%\n\
             evictionSoft:\n  memory.available: 500Mi\n\
             evictionSoftGracePeriod:\n  memory.available: 30s\n\
             evictionMinimumReclaim:\n  memory.available: 50Mi\n\
             evictionMaxPodGracePeriod: 20\nevictionPressureTransitionPeriod: 1m0s\n\
             mergeDefaultEvictionSettings: false\nenforceNodeAllocatable:\n- pods\n"
        ),
    );
    let l = load(RawSettings::default(), Some(&kubelet)).unwrap();
    assert_eq!(
        thresholds(&l.settings),
        [
            "memory.available<200Mi min=50Mi",
            "nodefs.available<5%",
            "memory.available<500Mi 30s min=50Mi",
            "allocatableMemory.available<200Mi min=50Mi",
        ]
    );
    let p = &l.settings.pressure;
    assert_eq!(
        (
            p.max_pod_grace_period,
            p.pressure_transition_period.as_secs()
        ),
        (20, 60)
    );
    let k = l.kubelet.unwrap();
    // false and [pods] are the kubelet's defaults: read, but they set nothing
    assert_eq!(
        k.used,
        [
            EVICTION_HARD,
            EVICTION_MAX_POD_GRACE_PERIOD,
            EVICTION_MINIMUM_RECLAIM,
            EVICTION_PRESSURE_TRANSITION_PERIOD,
            EVICTION_SOFT,
            EVICTION_SOFT_GRACE_PERIOD,
        ]
    );
    assert_eq!(k.ignored, Vec::<String>::new());
    // a flag replaces the kubelet's map whole (no nodefs.available left), as the kubelet's own
    // flags do; the other maps stay the file's
    let path = kubelet.display().to_string();
    let over = flags(&[
        (EVICTION_HARD, "memory.available<1Gi"),
        ("kubeletConfig", &path),
    ]);
    assert_eq!(
        thresholds(&load(over, None).unwrap().settings),
        [
            "memory.available<1Gi min=50Mi",
            "memory.available<500Mi 30s min=50Mi",
            "allocatableMemory.available<1Gi min=50Mi",
        ]
    );
    // reaplet's own file over the kubelet's: its mapping, list and scalars
    let own = write(
        d,
        "reaplet.yaml",
        &format!(
            "kubeletConfig: {path}\nevictionHard:\n  pid.available: 10%\n\
             evictionMinimumReclaim: {{}}\nenforceNodeAllocatable: []\n\
             evictionMaxPodGracePeriod: -1\nmergeDefaultEvictionSettings: true\n",
        ),
    );
    let s = load(RawSettings::default(), Some(&own)).unwrap().settings;
    let mut want = DEFAULTS.to_vec();
    want.extend(["pid.available<10%", "memory.available<500Mi 30s"]);
    assert_eq!(thresholds(&s), want);
    assert_eq!(s.pressure.max_pod_grace_period, -1);
    // `evictionHard: {}` in the kubelet's file: no hard threshold at all (kept, and used)
    let empty = write(
        d,
        "empty.yaml",
        &format!("{KUBELET_HEADER}evictionHard: {{}}\n"),
    );
    let l = load(RawSettings::default(), Some(&empty)).unwrap();
    assert_eq!(thresholds(&l.settings), Vec::<String>::new());
    assert_eq!(l.kubelet.unwrap().used, [EVICTION_HARD]);
}

/// A value of the wrong type in the kubelet's file names the field and the file.
#[test]
fn the_kubelets_types_are_checked_naming_the_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    // the field is each line's key
    let cases = [
        "evictionHard: [a]",
        "evictionHard: memory.available<1Gi",
        "evictionSoft:\n  memory.available: 1",
        "evictionSoftGracePeriod:\n  memory.available: [1m]",
        "evictionMinimumReclaim: 5",
        "evictionMaxPodGracePeriod: \"30\"",
        "evictionMaxPodGracePeriod: 2147483648",
        "evictionMaxPodGracePeriod: 1.5",
        "evictionPressureTransitionPeriod: 300",
        "evictionPressureTransitionPeriod: soon",
        "mergeDefaultEvictionSettings: \"true\"",
        "enforceNodeAllocatable: pods",
        "enforceNodeAllocatable: [1]",
    ];
    for text in cases {
        let field = &text[..text.find(':').unwrap()];
        let f = write(dir.path(), "k.yaml", &format!("{KUBELET_HEADER}{text}\n"));
        let e = load(RawSettings::default(), Some(&f)).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert!(e.to_string().contains("k.yaml"), "names the file: {e}");
    }
}

/// The kubelet's file is named when it alone holds the fields at fault; a flag at fault is
/// not blamed on it, and reaplet's settings completing the kubelet's are no error.
#[test]
fn an_error_names_the_kubelets_file_when_it_alone_is_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let soft = write(
        d,
        "soft.yaml",
        &format!("{KUBELET_HEADER}evictionSoft:\n  memory.available: 1Gi\n"),
    );
    let path = soft.display().to_string();
    let with = |given: &[(&str, &str)]| {
        let mut given = given.to_vec();
        given.push(("kubeletConfig", &path));
        load(flags(&given), None)
    };
    let e = with(&[]).unwrap_err();
    assert_eq!(e.field, EVICTION_SOFT_GRACE_PERIOD);
    assert_eq!(
        e.why,
        format!(
            "grace period must be specified for the soft eviction threshold memory.available \
             (in {path})"
        )
    );
    // an unrelated flag changes nothing
    let e = with(&[(EVICTION_MAX_POD_GRACE_PERIOD, "10")]).unwrap_err();
    assert!(e.why.contains("soft.yaml"), "{e}");
    // the grace period from a flag completes the kubelet's soft threshold
    let s = with(&[(EVICTION_SOFT_GRACE_PERIOD, "memory.available=1m")])
        .unwrap()
        .settings;
    assert_eq!(thresholds(&s)[5], "memory.available<1Gi 60s");
    // a grace period from a flag that misses the signal: the flag shares the fault
    let e = with(&[(EVICTION_SOFT_GRACE_PERIOD, "pid.available=1m")]).unwrap_err();
    assert_eq!(e.field, EVICTION_SOFT_GRACE_PERIOD);
    assert!(!e.why.contains("soft.yaml"), "{e}");
    // a bad flag over a good file: the flag's fault
    let e = with(&[
        (EVICTION_HARD, "memory.free<1Gi"),
        (EVICTION_SOFT_GRACE_PERIOD, "memory.available=1m"),
    ])
    .unwrap_err();
    assert_eq!(
        (e.field, e.why.as_str()),
        (EVICTION_HARD, "unsupported eviction signal memory.free")
    );
    // the kubelet's own bad values, each naming its field and the file
    for (text, field, why) in [
        (
            "evictionHard:\n  memory.free: 1Gi\n",
            EVICTION_HARD,
            "unsupported eviction signal memory.free",
        ),
        (
            "evictionMinimumReclaim:\n  memory.available: -1Gi\n",
            EVICTION_MINIMUM_RECLAIM,
            "negative eviction minimum reclaim specified for memory.available",
        ),
        (
            "enforceNodeAllocatable: [pods, none]\n",
            ENFORCE_NODE_ALLOCATABLE,
            "enforceNodeAllocatable (--enforce-node-allocatable) may not contain additional \
             enforcements when \"none\" is specified",
        ),
    ] {
        let f = write(d, "bad.yaml", &format!("{KUBELET_HEADER}{text}"));
        let e = load(RawSettings::default(), Some(&f)).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert_eq!(e.why, format!("{why} (in {})", f.display()));
    }
}

/// Reaplet's own file: the kubelet's mappings and list, or the flags' syntax as a string.
#[test]
fn reaplets_own_file_takes_mappings_or_the_flag_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let read = |text: &str| RawSettings::from_file(&write(dir.path(), "c.yaml", text));
    let r = read(
        "evictionHard:\n  memory.available: 1Gi\n  pid.available: 1000\n\
         evictionSoft: memory.available<2Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\n\
         enforceNodeAllocatable: [none]\nevictionPressureTransitionPeriod: 30s\n\
         evictionMaxPodGracePeriod: 15\n",
    )
    .unwrap();
    let map = [("memory.available", "1Gi"), ("pid.available", "1000")];
    let map = map.map(|(k, v)| (k.to_string(), v.to_string()));
    assert_eq!(r.eviction_hard, Some(Given::Value(SignalMap::from(map))));
    assert_eq!(r.eviction_soft, text("memory.available<2Gi"));
    assert_eq!(
        r.enforce_node_allocatable,
        Some(Given::Value(vec!["none".into()]))
    );
    let s = resolve(r).unwrap();
    assert_eq!(
        thresholds(&s),
        [
            "memory.available<1Gi",
            "pid.available<1000",
            "memory.available<2Gi 60s"
        ]
    );
    let p = &s.pressure;
    assert_eq!(
        (
            p.max_pod_grace_period,
            p.pressure_transition_period.as_secs()
        ),
        (15, 30)
    );
    assert_eq!(read("evictionHard: ~\n").unwrap(), RawSettings::default());
    for text in [
        "evictionHard: [a]",
        "evictionSoft:\n  memory.available: [1Gi]",
        "enforceNodeAllocatable: {pods: true}",
        "enforceNodeAllocatable: [[pods]]",
        "evictionMaxPodGracePeriod: [1]",
    ] {
        let field = &text[..text.find(':').unwrap()];
        let e = read(text).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
    }
}

/// The flags as the kubelet's: a repeated map flag adds its pairs, a negative number is a
/// value, the boolean needs no value.
#[test]
fn the_flags_parse_as_the_kubelets() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: super::super::flags::Flags,
    }
    let args = "reaplet|--eviction-hard|memory.available<1Gi|--eviction-hard|pid.available<10%\
                |--eviction-max-pod-grace-period|-5|--eviction-pressure-transition-period=2m\
                |--merge-default-eviction-settings|--enforce-node-allocatable|\
                |--eviction-soft|memory.available<2Gi|--eviction-soft-grace-period\
                |memory.available=1m|--eviction-minimum-reclaim|memory.available=0";
    let raw = Cli::try_parse_from(args.split('|')).unwrap().flags.raw();
    assert_eq!(
        raw.eviction_hard,
        text("memory.available<1Gi,pid.available<10%")
    );
    assert_eq!(raw.eviction_max_pod_grace_period.as_deref(), Some("-5"));
    assert_eq!(raw.merge_default_eviction_settings.as_deref(), Some("true"));
    assert_eq!(
        raw.enforce_node_allocatable,
        Some(Given::Text(String::new()))
    );
    let s = resolve(raw).unwrap();
    let p = &s.pressure;
    assert_eq!(
        (
            p.max_pod_grace_period,
            p.pressure_transition_period.as_secs()
        ),
        (-5, 120)
    );
    let mut want = DEFAULTS.to_vec();
    want[2] = "memory.available<1Gi min=0";
    want.extend(["pid.available<10%", "memory.available<2Gi 60s min=0"]);
    assert_eq!(thresholds(&s), want, "merged, no allocatable copy");
    // none given: nothing set
    let raw = Cli::try_parse_from(["reaplet"]).unwrap().flags.raw();
    assert_eq!(
        (raw.eviction_hard, raw.enforce_node_allocatable),
        (None, None)
    );
}
