//! The device part of `rpc-bench doctor` (feature `rdma`): asks
//! `rpc_transport::rdma::inspect_devices` and hands every device to [`super::ports`].

use std::fmt::Write as _;

use rpc_core::transport::rdma::{inspect_devices, RdmaConfig, ENV_GID_INDEX};

use super::ports::examine;
use super::{no_device_fix, Findings, Problem};

pub(super) fn findings(out: &mut String, wanted: Option<&str>, kernel: &[String]) -> Findings {
    let mut f = Findings::default();
    let devices = match inspect_devices() {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(out, "devices: libibverbs cannot list devices: {e}");
            // ENOSYS from ibv_get_device_list: the kernel has no verbs device (or no ib_uverbs).
            let fix = match kernel.is_empty() {
                true => no_device_fix(kernel),
                false => "install rdma-core's libraries and providers (`apt-get install rdma-core \
                          libibverbs1 librdmacm1 ibverbs-providers` / `dnf install rdma-core \
                          libibverbs librdmacm`) and `modprobe ib_uverbs`"
                    .to_string(),
            };
            f.problems.push(Problem::new(format!("no RDMA device can be listed ({e})"), fix));
            return f;
        }
    };
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    let _ = writeln!(
        out,
        "devices (libibverbs): {}   (kernel, sysfs: {})",
        if names.is_empty() { "none".to_string() } else { names.join(", ") },
        if kernel.is_empty() { "none".to_string() } else { kernel.join(", ") }
    );
    if devices.is_empty() {
        f.problems.push(Problem::new("no RDMA device", no_device_fix(kernel)));
        return f;
    }
    if let Some(w) = wanted {
        let _ = writeln!(out, "checking {w} only (--device or RPC_RDMA_DEVICE)");
        if !names.contains(&w) {
            f.problems.push(Problem::new(
                format!("device {w} (--device / RPC_RDMA_DEVICE) is not among {}", names.join(", ")),
                "name one of the listed devices, or unset RPC_RDMA_DEVICE to let rdma_cm pick by address",
            ));
            return f;
        }
    }
    let cfg = RdmaConfig::from_env();
    let gid_set = std::env::var(ENV_GID_INDEX).is_ok();
    for d in devices.iter().filter(|d| wanted.is_none_or(|w| w == d.name)) {
        out.push('\n');
        examine(out, d, cfg.gid_index, gid_set, &mut f);
    }
    f
}
