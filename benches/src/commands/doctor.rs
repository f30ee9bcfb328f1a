//! `rpc-bench doctor`: is this machine ready for `rdma://`? Per device and port it shows the
//! transport, state, MTU, link layer, GID table (and which entry is RoCE v2 over IPv4), the
//! limits the transport depends on; then the memlock limit and rdma_cm, and for every problem
//! found what to do about it. Exit status 0 when at least one device has a usable ACTIVE port,
//! memlock is sufficient and rdma_cm is there; 1 otherwise (and always without the `rdma` feature).

use std::fmt::Write as _;
use std::path::Path;

use crate::cli::DoctorArgs;
use crate::BenchError;

#[cfg(feature = "rdma")]
mod devices;
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
mod ports;

/// Locked memory below which registrations of a few connections' pools fail (bytes).
pub(crate) const MIN_MEMLOCK: u64 = 64 << 20;

const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
const SYSFS_DEVICES: &str = "/sys/class/infiniband";
/// CAP_IPC_LOCK: lets a process lock memory beyond RLIMIT_MEMLOCK (root has it).
const CAP_IPC_LOCK: u32 = 14;

/// One thing that keeps rdma:// from working here, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) what: String,
    pub(crate) fix: String,
    /// A problem of one device or port: another usable port keeps the verdict READY (the report
    /// still lists it). Problems of the host (memlock, rdma_cm, the build) always count.
    pub(crate) one_port: bool,
}

impl Problem {
    /// A problem of the whole host.
    pub(crate) fn new(what: impl Into<String>, fix: impl Into<String>) -> Problem {
        Problem { what: what.into(), fix: fix.into(), one_port: false }
    }

    /// A problem of one device or port.
    pub(crate) fn port(what: impl Into<String>, fix: impl Into<String>) -> Problem {
        Problem { one_port: true, ..Problem::new(what, fix) }
    }

    /// Whether this problem leaves nothing usable.
    fn blocks_all(&self, usable: &[String]) -> bool {
        !self.one_port || usable.is_empty()
    }
}

/// What the device part found: usable ports ("rxe0 port 1") and problems.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) usable: Vec<String>,
    pub(crate) problems: Vec<Problem>,
}

/// RLIMIT_MEMLOCK, soft or hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    Unlimited,
    Bytes(u64),
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Bytes(b) => write!(f, "{} (`ulimit -l`: {})", human_bytes(*b), b / 1024),
        }
    }
}

/// Whether the memlock limit lets the transport register its pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemlockVerdict {
    /// Unlimited, or at least [`MIN_MEMLOCK`].
    Enough,
    /// Below [`MIN_MEMLOCK`], but the process has CAP_IPC_LOCK (root): registrations ignore it.
    Privileged,
    /// Below [`MIN_MEMLOCK`] without CAP_IPC_LOCK: registrations fail early.
    TooLow,
}

pub(crate) fn memlock_verdict(soft: Limit, cap_ipc_lock: bool) -> MemlockVerdict {
    match soft {
        Limit::Unlimited => MemlockVerdict::Enough,
        Limit::Bytes(b) if b >= MIN_MEMLOCK => MemlockVerdict::Enough,
        Limit::Bytes(_) if cap_ipc_lock => MemlockVerdict::Privileged,
        Limit::Bytes(_) => MemlockVerdict::TooLow,
    }
}

/// Whether `CapEff` in a /proc/<pid>/status text has CAP_IPC_LOCK.
pub(crate) fn has_cap_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// 64 MiB, 1.5 KiB, 100 B: the largest binary unit, one decimal unless it divides evenly;
/// `u64::MAX` (what drivers report for "no limit") as "no limit".
pub(crate) fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    if b == u64::MAX {
        return "no limit".to_string();
    }
    for (unit, size) in UNITS {
        if b >= size {
            return match b % size {
                0 => format!("{} {unit}", b / size),
                _ => format!("{:.1} {unit}", b as f64 / size as f64),
            };
        }
    }
    format!("{b} B")
}

fn memlock_limits() -> Result<(Limit, Limit), String> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK).map_err(|e| format!("getrlimit: {e}"))?;
    let limit = |v| if v == RLIM_INFINITY { Limit::Unlimited } else { Limit::Bytes(v) };
    Ok((limit(soft), limit(hard)))
}

/// The memlock part of the report; pushes a problem when registrations would fail.
fn check_memlock(out: &mut String, problems: &mut Vec<Problem>) {
    let (soft, hard) = match memlock_limits() {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(out, "memlock (RLIMIT_MEMLOCK): cannot read it: {e}");
            problems
                .push(Problem::new(format!("cannot read RLIMIT_MEMLOCK: {e}"), "check `ulimit -l` by hand"));
            return;
        }
    };
    let cap = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| has_cap_ipc_lock(&s));
    let _ = writeln!(out, "memlock (RLIMIT_MEMLOCK): {soft} (hard limit: {hard})");
    match memlock_verdict(soft, cap) {
        MemlockVerdict::Enough => {
            let _ = writeln!(out, "  ok: at least {} may be registered", human_bytes(MIN_MEMLOCK));
        }
        MemlockVerdict::Privileged => {
            let _ = writeln!(
                out,
                "  ok for this process: it has CAP_IPC_LOCK (root), so registrations ignore the limit;\n  \
                 WARNING: run by a user without it, the same program could lock only {soft}"
            );
        }
        MemlockVerdict::TooLow => problems.push(Problem::new(
            format!(
                "the locked-memory limit is {soft}, below {}: registering the connections' pools fails",
                human_bytes(MIN_MEMLOCK)
            ),
            format!(
                "raise it: `ulimit -l unlimited` in this shell (works up to the hard limit, {hard}; \
                 beyond that as root), or for good `* - memlock unlimited` in \
                 /etc/security/limits.conf (then log in again), `LimitMEMLOCK=infinity` in a systemd \
                 unit, `--ulimit memlock=-1` for docker"
            ),
        )),
    }
}

/// The rdma_cm / uverbs device files part of the report.
fn check_device_files(out: &mut String, problems: &mut Vec<Problem>) {
    let module = Path::new("/sys/module/rdma_ucm").exists();
    if Path::new(RDMA_CM).exists() {
        let _ = writeln!(
            out,
            "rdma_cm: {RDMA_CM} present (rdma_ucm {}): ok",
            if module { "loaded" } else { "built in or loaded" }
        );
    } else {
        let _ = writeln!(out, "rdma_cm: {RDMA_CM} MISSING");
        problems.push(Problem::new(
            format!("{RDMA_CM} is missing: rdma:// connects through rdma_cm and cannot work without it"),
            "`modprobe rdma_ucm` (as root; udev loads it at boot where rdma-core is installed)",
        ));
    }
    let uverbs: Vec<String> = std::fs::read_dir("/dev/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("uverbs"))
                .collect()
        })
        .unwrap_or_default();
    match uverbs.is_empty() {
        true => {
            let _ = writeln!(out, "user verbs: no /dev/infiniband/uverbs* (ib_uverbs not loaded?)");
        }
        false => {
            let _ = writeln!(out, "user verbs: /dev/infiniband/{}", uverbs.join(", "));
        }
    }
}

/// Devices the kernel has (sysfs), whatever libibverbs says.
fn kernel_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(SYSFS_DEVICES)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The fix for "no RDMA device at all".
pub(crate) fn no_device_fix(kernel: &[String]) -> String {
    if kernel.is_empty() {
        "add a software device (as root): soft-RoCE `modprobe crc32_generic; modprobe rdma_rxe; \
         rdma link add rxe0 type rxe netdev eth0`, or soft-iWARP `modprobe siw; rdma link add siw0 \
         type siw netdev eth0` (crc32_generic must be loaded first or `rdma link add` fails with \
         ENOENT; name a real interface with an IPv4 address: rxe will not attach to lo; then \
         `modprobe ib_uverbs rdma_ucm` if udev does not). No rdma_rxe module in this kernel (many \
         cloud kernels): scripts/vm/ runs one in a qemu VM"
            .to_string()
    } else {
        format!(
            "the kernel has {} but libibverbs lists none: install the user-space provider \
             (`apt-get install ibverbs-providers` / `dnf install libibverbs`) and load ib_uverbs \
             (`modprobe ib_uverbs`)",
            kernel.join(", ")
        )
    }
}

pub(super) fn doctor(args: DoctorArgs) -> Result<(), BenchError> {
    let wanted =
        args.device.or_else(|| std::env::var("RPC_RDMA_DEVICE").ok().filter(|d| !d.trim().is_empty()));
    let mut out = String::from("rpc-bench doctor: is this machine ready for rdma:// ?\n\n");
    let kernel = kernel_devices();
    let findings = device_findings(&mut out, wanted.as_deref(), &kernel);
    let mut problems = findings.problems;
    out.push('\n');
    check_memlock(&mut out, &mut problems);
    check_device_files(&mut out, &mut problems);
    out.push('\n');
    if problems.is_empty() {
        out.push_str("problems: none\n");
    } else {
        out.push_str("problems, and what to do:\n");
        for (i, p) in problems.iter().enumerate() {
            let _ = writeln!(out, "  {}. {}\n     fix: {}", i + 1, p.what, p.fix);
        }
    }
    let ready = !findings.usable.is_empty() && problems.iter().all(|p| !p.blocks_all(&findings.usable));
    if ready {
        let _ = writeln!(out, "\nREADY: usable: {}", findings.usable.join(", "));
    } else {
        let _ = writeln!(out, "\nNOT READY: {}", verdict_reason(&findings.usable, &problems));
    }
    print!("{out}");
    match ready {
        true => Ok(()),
        false => Err(BenchError::NotReady(verdict_reason(&findings.usable, &problems))),
    }
}

fn verdict_reason(usable: &[String], problems: &[Problem]) -> String {
    let blocking = problems.iter().filter(|p| p.blocks_all(usable)).count();
    match usable.is_empty() {
        true => format!("no usable ACTIVE port; {} problem(s) listed above", problems.len()),
        false => format!("{blocking} problem(s) listed above"),
    }
}

#[cfg(feature = "rdma")]
fn device_findings(out: &mut String, wanted: Option<&str>, kernel: &[String]) -> Findings {
    devices::findings(out, wanted, kernel)
}

#[cfg(not(feature = "rdma"))]
fn device_findings(out: &mut String, _wanted: Option<&str>, kernel: &[String]) -> Findings {
    let _ = writeln!(
        out,
        "devices: NOT CHECKED: this rpc-bench was built without the `rdma` feature, so it has no verbs \
         backend at all.\n  kernel devices (sysfs): {}",
        if kernel.is_empty() { "none".to_string() } else { kernel.join(", ") }
    );
    let mut problems = vec![Problem::new(
        "this binary was built without the `rdma` feature: rdma:// addresses are unavailable",
        "build with it: `cargo build --release -p benches --features benches/rdma --bin rpc-bench` \
             (needs cmake clang libclang-dev pkg-config libibverbs-dev librdmacm-dev; \
             scripts/vm/setup.sh installs them), then run target/release/rpc-bench doctor",
    )];
    if kernel.is_empty() {
        problems.push(Problem::new("the kernel has no RDMA device either", no_device_fix(kernel)));
    }
    Findings { usable: Vec::new(), problems }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_verdicts() {
        assert_eq!(memlock_verdict(Limit::Unlimited, false), MemlockVerdict::Enough);
        assert_eq!(memlock_verdict(Limit::Bytes(MIN_MEMLOCK), false), MemlockVerdict::Enough);
        assert_eq!(memlock_verdict(Limit::Bytes(8 << 20), false), MemlockVerdict::TooLow);
        assert_eq!(memlock_verdict(Limit::Bytes(8 << 20), true), MemlockVerdict::Privileged);
        assert_eq!(memlock_verdict(Limit::Bytes(MIN_MEMLOCK - 1), false), MemlockVerdict::TooLow);
    }

    #[test]
    fn cap_ipc_lock_is_read_from_cap_eff() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        let user = "CapPrm:\t0000000000004000\nCapEff:\t0000000000000000\n";
        let only_lock = "CapEff:\t0000000000004000\n";
        assert!(has_cap_ipc_lock(root));
        assert!(!has_cap_ipc_lock(user), "CapPrm is not what counts");
        assert!(has_cap_ipc_lock(only_lock));
        assert!(!has_cap_ipc_lock("garbage"));
    }

    #[test]
    fn limits_print_as_ulimit_would() {
        assert_eq!(human_bytes(64 << 20), "64 MiB");
        assert_eq!(human_bytes(8192 * 1024), "8 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100), "100 B");
        assert_eq!(human_bytes(u64::MAX), "no limit");
        assert_eq!(human_bytes(3 << 40), "3 TiB");
        assert_eq!(Limit::Bytes(8 << 20).to_string(), "8 MiB (`ulimit -l`: 8192)");
        assert_eq!(Limit::Unlimited.to_string(), "unlimited");
    }

    #[test]
    fn port_problems_do_not_block_another_usable_port() {
        let port = Problem::port("siw0 port 1 is DOWN", "ip link set eth0 up");
        let host = Problem::new("the locked-memory limit is 8 MiB", "ulimit -l unlimited");
        let usable = vec!["rxe0 port 1".to_string()];
        assert!(!port.blocks_all(&usable));
        assert!(port.blocks_all(&[]));
        assert!(host.blocks_all(&usable));
    }

    #[test]
    fn no_device_fix_names_the_cause() {
        let none = no_device_fix(&[]);
        assert!(none.contains("rdma link add rxe0 type rxe netdev eth0") && none.contains("crc32_generic"));
        assert!(none.contains("lo"));
        let kernel_only = no_device_fix(&["mlx5_0".to_string()]);
        assert!(kernel_only.contains("mlx5_0") && kernel_only.contains("ibverbs-providers"));
    }
}
