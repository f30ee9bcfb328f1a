//! Device checks done before and during setup, and the async-event logger of each device.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashSet;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock};

use sideway::ibverbs::device::{DeviceInfo, DeviceList, TransportType};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer};

use super::config::RdmaConfig;
use super::error::RdmaError;
use super::sys;
use crate::TransportError;

/// Fails with [`RdmaError::NoDevice`] when libibverbs is missing or finds no device, and with
/// [`RdmaError::DeviceNotFound`] when the configured device is not among them. Never panics.
pub(crate) fn check_devices(cfg: &RdmaConfig) -> Result<(), TransportError> {
    let list = DeviceList::new().map_err(|e| {
        RdmaError::NoDevice(format!(
            "libibverbs lists no RDMA device ({}); install rdma-core and configure a device, \
             e.g. `rdma link add rxe0 type rxe netdev eth0`",
            std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())
        ))
    })?;
    let names: Vec<String> = list.iter().map(|d| d.name()).collect();
    if names.is_empty() {
        return Err(RdmaError::NoDevice("the RDMA device list is empty".into()).into());
    }
    if let Some(wanted) = &cfg.device {
        if !names.iter().any(|n| n == wanted) {
            return Err(
                RdmaError::DeviceNotFound { wanted: wanted.clone(), available: names.join(", ") }.into()
            );
        }
    }
    Ok(())
}

/// What setup needs to know about the device rdma_cm bound an identifier to.
#[derive(Debug, Clone)]
pub(crate) struct DeviceFacts {
    pub(crate) name: String,
    pub(crate) iwarp: bool,
    pub(crate) max_qp_wr: u32,
    pub(crate) max_qp_rd_atom: u32,
    pub(crate) max_qp_init_rd_atom: u32,
    pub(crate) max_msg_sz: u32,
}

/// Checks the device rdma_cm chose against the configuration (device name, GID index on RoCE)
/// and gathers its limits.
pub(crate) fn inspect(
    ctx: &Arc<DeviceContext>,
    port: u8,
    addr: &str,
    cfg: &RdmaConfig,
) -> Result<DeviceFacts, TransportError> {
    let name = ctx.name();
    if let Some(wanted) = &cfg.device {
        if *wanted != name {
            return Err(RdmaError::WrongDevice {
                addr: addr.to_string(),
                chosen: name,
                wanted: wanted.clone(),
            }
            .into());
        }
    }
    let iwarp = ctx.transport_type() == TransportType::IWarp;
    let attr =
        ctx.query_device().map_err(|e| super::error::verbs("ibv_query_device", super::error::chain(&e)))?;
    let port_attr =
        ctx.query_port(port).map_err(|e| super::error::verbs("ibv_query_port", super::error::chain(&e)))?;
    if !iwarp && port_attr.link_layer() == LinkLayer::Ethernet {
        let missing = |detail: String| RdmaError::GidNotFound {
            device: name.clone(),
            port,
            index: cfg.gid_index,
            detail,
        };
        match ctx.query_gid(port, cfg.gid_index) {
            Ok(gid) if gid.is_zero() => return Err(missing("the entry is empty".into()).into()),
            Ok(_) => {}
            Err(e) => return Err(missing(e.to_string()).into()),
        }
    }
    let limits = sys::query_port_limits(ctx, port)
        .map_err(|e| super::error::verbs("ibv_query_port", super::error::chain(&e)))?;
    if limits.state != 4 {
        tracing::warn!(device = %name, port, state = limits.state, "RDMA port is not ACTIVE");
    }
    watch_async_events(ctx, &name);
    let positive = |v: i32| u32::try_from(v).unwrap_or(0);
    Ok(DeviceFacts {
        name,
        iwarp,
        max_qp_wr: positive(attr.max_qp_wr()).max(1),
        max_qp_rd_atom: positive(attr.max_qp_rd_atom()).max(1),
        max_qp_init_rd_atom: positive(attr.max_qp_init_rd_atom()).max(1),
        max_msg_sz: limits.max_msg_sz,
    })
}

struct AsyncEvents(Arc<DeviceContext>);

impl AsRawFd for AsyncEvents {
    fn as_raw_fd(&self) -> RawFd {
        sys::async_fd(&self.0)
    }
}

static WATCHED: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();

fn watched() -> MutexGuard<'static, HashSet<usize>> {
    WATCHED.get_or_init(Default::default).lock()
}

/// Forgets a watched context when its task ends (e.g. with its runtime), so a later one watches again.
struct Unwatch(usize);

impl Drop for Unwatch {
    fn drop(&mut self) {
        watched().remove(&self.0);
    }
}

/// Starts (once per device context) a task that logs the device's async events through tracing.
fn watch_async_events(ctx: &Arc<DeviceContext>, name: &str) {
    let key = Arc::as_ptr(ctx) as usize;
    if watched().contains(&key) {
        return;
    }
    let events = AsyncEvents(Arc::clone(ctx));
    if let Err(e) = sys::set_nonblocking(events.as_raw_fd()) {
        tracing::warn!(device = name, error = %e, "cannot watch RDMA async events");
        return;
    }
    if !watched().insert(key) {
        return;
    }
    let unwatch = Unwatch(key);
    let fd = match sys::register_readable(events) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(device = name, error = %e, "cannot watch RDMA async events");
            return;
        }
    };
    let name = name.to_string();
    tokio::spawn(async move {
        let _unwatch = unwatch;
        while let Ok(mut guard) = fd.readable().await {
            while let Ok(res) = guard.try_io(|inner| match sys::get_async_event(&inner.get_ref().0) {
                Ok(Some(ev)) => Ok(ev),
                Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e),
            }) {
                match res {
                    Ok(ev) => log_event(&name, &ev),
                    Err(e) => {
                        tracing::warn!(device = %name, error = %e, "RDMA async event channel failed");
                        return;
                    }
                }
            }
        }
    });
}

fn log_event(device: &str, ev: &sys::AsyncEvent) {
    if sys::QP_FATAL_EVENTS.contains(&ev.kind) || ev.kind == 8 {
        tracing::warn!(device, event = %ev.name, qp = ?ev.qp_num, "RDMA async event");
    } else {
        tracing::info!(device, event = %ev.name, qp = ?ev.qp_num, "RDMA async event");
    }
}
