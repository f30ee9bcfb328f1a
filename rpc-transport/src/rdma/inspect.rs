//! [`inspect_devices`]: what `rpc-bench doctor` shows about every RDMA device, read through
//! sideway's safe queries and sysfs (no unsafe code here).

use std::path::Path;

use sideway::ibverbs::device::{DeviceInfo, DeviceList, TransportType};
use sideway::ibverbs::device_context::DeviceContext;

use super::error::{chain, RdmaError};
use crate::device_report::{
    mtu_bytes, DeviceReport, GidReport, LinkLayer, NodeTransport, PortReport, PortState, Transport,
};

/// GID entries read per port at most (rxe's table has 1024; real NICs 128..256).
const MAX_GIDS: u32 = 4096;

/// Lists every RDMA device with its limits, ports and populated GID entries.
///
/// Fails with [`RdmaError::NoDevice`] only when libibverbs cannot be loaded or cannot list
/// devices at all; an empty list is `Ok(vec![])`. A device or port that cannot be opened or
/// queried is reported in its `problem` / `port_problems`, never as an error, never a panic.
pub fn inspect_devices() -> Result<Vec<DeviceReport>, RdmaError> {
    let list =
        DeviceList::new().map_err(|e| RdmaError::NoDevice(format!("listing RDMA devices: {}", chain(&e))))?;
    let mut out = Vec::with_capacity(list.len());
    for device in list.iter() {
        let name = device.name();
        let node_transport = node_transport(device.transport_type());
        let mut report = DeviceReport {
            name,
            node_transport,
            problem: None,
            firmware: String::new(),
            max_qp_wr: 0,
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_mr_size: 0,
            ports: Vec::new(),
            port_problems: Vec::new(),
        };
        match device.open() {
            Ok(ctx) => fill(&ctx, &mut report),
            Err(e) => report.problem = Some(format!("ibv_open_device: {}", chain(&e))),
        }
        out.push(report);
    }
    Ok(out)
}

fn node_transport(t: TransportType) -> NodeTransport {
    match t {
        TransportType::InfiniBand => NodeTransport::InfiniBand,
        TransportType::IWarp => NodeTransport::IWarp,
        other => NodeTransport::Other(other.to_string()),
    }
}

fn fill(ctx: &DeviceContext, report: &mut DeviceReport) {
    let attr = match ctx.query_device() {
        Ok(attr) => attr,
        Err(e) => {
            report.problem = Some(format!("ibv_query_device: {}", chain(&e)));
            return;
        }
    };
    let positive = |v: i32| u32::try_from(v).unwrap_or(0);
    report.firmware = attr.firmware_version();
    report.max_qp_wr = positive(attr.max_qp_wr());
    report.max_qp_rd_atom = positive(attr.max_qp_rd_atom());
    report.max_qp_init_rd_atom = positive(attr.max_qp_init_rd_atom());
    report.max_mr_size = attr.max_mr_size();
    for port in 1..=attr.phys_port_cnt() {
        match ctx.query_port(port) {
            // The raw fields, not sideway's enum conversions (which panic on values they do not know).
            Ok(p) => {
                let link_layer = LinkLayer::from_raw(p.attr.link_layer);
                let gid_tbl_len = positive(p.attr.gid_tbl_len);
                report.ports.push(PortReport {
                    port,
                    transport: Transport::of(&report.node_transport, link_layer),
                    state: PortState::from_raw(p.attr.state),
                    phys_state: p.attr.phys_state,
                    link_layer,
                    active_mtu: mtu_bytes(p.attr.active_mtu),
                    max_msg_sz: p.attr.max_msg_sz,
                    gid_tbl_len,
                    gids: gids(ctx, &report.name, port, gid_tbl_len),
                });
            }
            Err(e) => report.port_problems.push((port, format!("ibv_query_port: {}", chain(&e)))),
        }
    }
}

/// The populated GID entries of a port; unreadable and all-zero entries are skipped.
fn gids(ctx: &DeviceContext, device: &str, port: u8, len: u32) -> Vec<GidReport> {
    let attrs = Path::new("/sys/class/infiniband")
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs");
    let read = |kind: &str, index: u32| {
        std::fs::read_to_string(attrs.join(kind).join(index.to_string()))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    (0..len.min(MAX_GIDS))
        .filter_map(|index| {
            let gid = ctx.query_gid(port, index).ok().filter(|g| !g.is_zero())?;
            Some(GidReport {
                index,
                raw: gid.raw,
                gid_type: read("types", index),
                netdev: read("ndevs", index),
            })
        })
        .collect()
}
