//! A locked-memory limit too low for the connection's registrations is reported as
//! `RdmaError::MemlockTooLow`, with the limit and how to raise it, instead of a bare ENOMEM.
//!
//! Needs an RDMA device (run inside the VM like `rdma_seam.rs`, with `RPC_RDMA_TEST_ADDR`). The
//! test re-runs itself under `setpriv` without CAP_IPC_LOCK (root ignores the limit otherwise) and
//! with `ulimit -l 64`.
#![cfg(feature = "rdma")]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use rpc_transport::rdma::{self, RdmaConfig, RdmaError};
use rpc_transport::ConnParams;

const CHILD: &str = "RPC_RDMA_MEMLOCK_CHILD";
const MARKER: &str = "memlock error reported:";

#[test]
#[ignore = "needs an RDMA device: run inside scripts/vm/run.sh with RPC_RDMA_TEST_ADDR"]
fn memlock_limit_too_low_is_reported() {
    let ip = std::env::var("RPC_RDMA_TEST_ADDR").unwrap_or_else(|_| {
        panic!("RPC_RDMA_TEST_ADDR is not set: run inside scripts/vm/run.sh (see rdma_seam.rs)")
    });
    if std::env::var_os(CHILD).is_some() {
        return child(&ip);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new("setpriv")
        .args(["--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", "--", "sh", "-c"])
        .arg("ulimit -l 64 && exec \"$0\" --ignored --exact --nocapture memlock_limit_too_low_is_reported")
        .arg(&exe)
        .env(CHILD, "1")
        .output()
        .expect("run setpriv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let line = stdout.lines().chain(stderr.lines()).find(|l| l.contains(MARKER));
    let line = line.unwrap_or_else(|| panic!("child did not run the check:\n{stdout}\n{stderr}"));
    eprintln!("{line}");
}

/// Runs without CAP_IPC_LOCK and with a 64 KiB limit: the receive pool (65 x 8 KiB) cannot be
/// registered. Nothing needs to listen: registration happens before the connect request is sent.
fn child(ip: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let addr = SocketAddr::new(ip.parse().expect("RPC_RDMA_TEST_ADDR"), 17999);
    let mut cfg = RdmaConfig::from_env();
    cfg.setup_timeout = Duration::from_secs(30);
    let err = rt
        .block_on(rdma::connect_with(addr, ConnParams::default(), cfg))
        .expect_err("the registrations exceed a 64 KiB memlock limit");
    match RdmaError::find(&err) {
        Some(e @ RdmaError::MemlockTooLow { limit_kib, .. }) => {
            assert_eq!(limit_kib, "64");
            let msg = e.to_string();
            assert!(msg.contains("ulimit -l") && msg.contains("65536 bytes"), "{msg}");
            eprintln!("{MARKER} {msg}");
        }
        _ => panic!("expected MemlockTooLow, got {err:?}"),
    }
}
