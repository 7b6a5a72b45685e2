//! The VM test's accelerator (`tests/vm`): KVM when `/dev/kvm` is usable, TCG otherwise, and
//! the fallback from a KVM that opens but does not work. No kubelet counterpart: the test bed's
//! own.

use std::path::Path;
use std::time::Duration;

/// How the VM test's qemu runs its guest: with KVM when `/dev/kvm` is usable, with TCG (software
/// emulation, several times slower) otherwise. The VM test says which, and why not KVM.
///
/// A `/dev/kvm` that opens is not always a KVM that works (nested virtualisation: qemu may
/// abort on an MSR the outer hypervisor refuses, or the guest may never get past the boot
/// loader), so a KVM boot that fails or does not start its guest within [`Accel::start_limit`]
/// falls back to TCG ([`Accel::fallback`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through `/dev/kvm` (`-accel kvm`, qemu's default CPU model:
    /// `-cpu host` makes qemu abort under some nested hypervisors).
    Kvm,
    /// Software emulation (`-accel tcg,thread=multi`); the reason KVM is not used.
    Tcg(String),
}

/// The device qemu opens for KVM.
pub const KVM_DEVICE: &str = "/dev/kvm";

/// The environment variable that forces an accelerator (`kvm` or `tcg`; `auto` or unset probes).
pub const ACCEL_ENV: &str = "REAPLET_VM_ACCEL";

impl Accel {
    /// Probes `device` (see [`probe_kvm`]) unless `forced` (the value of [`ACCEL_ENV`]) decides.
    pub fn detect(device: &Path, forced: Option<&str>) -> Result<Accel, String> {
        Accel::choose(forced, || probe_kvm(device))
    }

    /// The decision alone: a forced value wins; otherwise KVM exactly when the probe succeeds.
    /// The probe is not run when the choice is forced.
    pub fn choose(
        forced: Option<&str>,
        probe: impl FnOnce() -> Result<(), String>,
    ) -> Result<Accel, String> {
        match forced.map(str::trim) {
            Some("kvm") => Ok(Accel::Kvm),
            Some("tcg") => Ok(Accel::Tcg(format!("{ACCEL_ENV}=tcg"))),
            None | Some("" | "auto") => Ok(match probe() {
                Ok(()) => Accel::Kvm,
                Err(why) => Accel::Tcg(why),
            }),
            Some(other) => Err(format!("{ACCEL_ENV}={other:?}: expected kvm, tcg or auto")),
        }
    }

    /// qemu's arguments for this accelerator.
    pub fn qemu_args(&self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-accel", "kvm"],
            Accel::Tcg(_) => &["-accel", "tcg,thread=multi"],
        }
    }

    /// How long a guest may take to start (to reach its runner) before the boot counts as
    /// stuck: under KVM a few seconds are normal (under TCG about 11 s), so 30 s means a broken
    /// KVM; under TCG only the test's overall limit applies.
    pub fn start_limit(&self) -> Option<Duration> {
        match self {
            Accel::Kvm => Some(Duration::from_secs(30)),
            Accel::Tcg(_) => None,
        }
    }

    /// What to boot with after a boot with `self` failed for reason `why` (qemu failed, or the
    /// guest did not start): TCG after KVM; nothing after TCG (the failure is the test's).
    pub fn fallback(&self, why: &str) -> Option<Accel> {
        match self {
            Accel::Kvm => Some(Accel::Tcg(format!(
                "{KVM_DEVICE} opens, but under KVM {why}"
            ))),
            Accel::Tcg(_) => None,
        }
    }

    /// One phrase for the test's output, e.g. `KVM (/dev/kvm)` or
    /// `TCG (software emulation; no KVM: /dev/kvm: No such file or directory (os error 2))`.
    pub fn describe(&self) -> String {
        match self {
            Accel::Kvm => format!("KVM ({KVM_DEVICE})"),
            Accel::Tcg(why) => format!("TCG (software emulation; no KVM: {why})"),
        }
    }
}

/// Whether `device` is usable for KVM the way qemu uses it: a character device this process can
/// open read-write (existing but owned by another group, or read-only, is not usable).
pub fn probe_kvm(device: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
    if !meta.file_type().is_char_device() {
        return Err(format!("{} is not a character device", device.display()));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map(drop)
        .map_err(|e| format!("{} cannot be opened read-write: {e}", device.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_means_tcg_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("kvm");
        let a = Accel::detect(&dev, None).unwrap();
        let Accel::Tcg(why) = &a else {
            panic!("expected TCG, got {a:?}")
        };
        assert!(why.contains(&dev.display().to_string()), "{why}");
        assert!(
            a.describe()
                .starts_with("TCG (software emulation; no KVM: ")
        );
        assert_eq!(a.qemu_args(), ["-accel", "tcg,thread=multi"]);
    }

    #[test]
    fn a_regular_file_is_not_kvm() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let a = Accel::detect(f.path(), Some("auto")).unwrap();
        assert!(
            matches!(&a, Accel::Tcg(why) if why.contains("not a character device")),
            "{a:?}"
        );
    }

    #[test]
    fn a_character_device_opened_read_write_is_used() {
        // /dev/null stands in for a usable /dev/kvm: the probe is the open qemu does
        assert_eq!(probe_kvm(Path::new("/dev/null")), Ok(()));
        let a = Accel::detect(Path::new("/dev/null"), None).unwrap();
        assert_eq!(a, Accel::Kvm);
        assert_eq!(a.qemu_args(), ["-accel", "kvm"]);
        assert_eq!(a.describe(), "KVM (/dev/kvm)");
    }

    #[test]
    fn the_probe_decides_unless_forced() {
        let denied = || Err("/dev/kvm cannot be opened read-write: Permission denied".to_string());
        assert_eq!(
            Accel::choose(None, denied),
            Ok(Accel::Tcg(
                "/dev/kvm cannot be opened read-write: Permission denied".into()
            ))
        );
        assert_eq!(Accel::choose(Some("auto"), || Ok(())), Ok(Accel::Kvm));
        let never = || -> Result<(), String> { panic!("a forced choice must not probe") };
        assert_eq!(Accel::choose(Some("kvm"), never), Ok(Accel::Kvm));
        assert_eq!(
            Accel::choose(Some("tcg"), never),
            Ok(Accel::Tcg("REAPLET_VM_ACCEL=tcg".into()))
        );
        assert!(Accel::choose(Some("hvf"), never).is_err());
    }

    #[test]
    fn a_failed_kvm_boot_falls_back_to_tcg_once() {
        let kvm = Accel::Kvm;
        assert_eq!(kvm.start_limit(), Some(Duration::from_secs(30)));
        let tcg = kvm
            .fallback("the guest did not start within 30 s")
            .expect("TCG after KVM");
        assert_eq!(
            tcg.describe(),
            "TCG (software emulation; no KVM: /dev/kvm opens, but under KVM the guest did not \
             start within 30 s)"
        );
        assert_eq!(tcg.qemu_args(), ["-accel", "tcg,thread=multi"]);
        assert_eq!(tcg.start_limit(), None);
        assert_eq!(tcg.fallback("qemu failed"), None);
    }
}
