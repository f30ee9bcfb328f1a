//! Judging one device's ports from its report (pure: tested without a device): ACTIVE, the
//! RoCE v2 IPv4 GID, the configured GID index; and what to fix when one is off.

use std::fmt::Write as _;

use rpc_core::transport::device_report::{DeviceReport, LinkLayer, PortReport, PortState, Transport};

use super::{human_bytes, Findings, Problem};

/// GID entries printed per port (the rest are counted).
const GIDS_SHOWN: usize = 16;
/// The variable naming the GID index setup checks (`rpc_transport::rdma::ENV_GID_INDEX`).
const ENV_GID_INDEX: &str = "RPC_RDMA_GID_INDEX";

/// Prints one device and judges its ports.
pub(crate) fn examine(out: &mut String, d: &DeviceReport, gid_index: u32, gid_set: bool, f: &mut Findings) {
    let transports: Vec<String> = d.ports.iter().map(|p| p.transport.to_string()).collect();
    let transport = transports.first().cloned().unwrap_or_else(|| format!("{:?}", d.node_transport));
    let _ = writeln!(
        out,
        "{}: {transport}, firmware {}",
        d.name,
        if d.firmware.is_empty() { "?" } else { &d.firmware }
    );
    if let Some(why) = &d.problem {
        let _ = writeln!(out, "  CANNOT QUERY: {why}");
        f.problems.push(Problem::port(
            format!("device {} cannot be opened or queried: {why}", d.name),
            "check that ib_uverbs is loaded (`modprobe ib_uverbs`) and that this user may open \
             /dev/infiniband/uverbs* (group `rdma`, or a udev rule)",
        ));
        return;
    }
    let _ = writeln!(
        out,
        "  limits: max_qp_wr {}, max_qp_rd_atom {}, max_qp_init_rd_atom {}, max_mr_size {}",
        d.max_qp_wr,
        d.max_qp_rd_atom,
        d.max_qp_init_rd_atom,
        human_bytes(d.max_mr_size)
    );
    for (port, why) in &d.port_problems {
        let _ = writeln!(out, "  port {port}: CANNOT QUERY: {why}");
        f.problems
            .push(Problem::port(format!("{} port {port} cannot be queried: {why}", d.name), "see dmesg"));
    }
    for p in &d.ports {
        examine_port(out, &d.name, p, gid_index, gid_set, f);
    }
}

fn phys_state_name(raw: u8) -> &'static str {
    match raw {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "?",
    }
}

fn netdev_of(p: &PortReport) -> String {
    p.gids.iter().find_map(|g| g.netdev.clone()).unwrap_or_else(|| "<its netdev>".to_string())
}

fn examine_port(
    out: &mut String,
    dev: &str,
    p: &PortReport,
    gid_index: u32,
    gid_set: bool,
    f: &mut Findings,
) {
    let here = format!("{dev} port {}", p.port);
    let _ = writeln!(
        out,
        "  port {}: {} (physical: {}), link layer {}, active MTU {}, max_msg_sz {} ({})",
        p.port,
        p.state,
        phys_state_name(p.phys_state),
        p.link_layer,
        p.active_mtu,
        p.max_msg_sz,
        human_bytes(u64::from(p.max_msg_sz))
    );
    let _ = writeln!(out, "    GID table: {} of {} entries populated", p.gids.len(), p.gid_tbl_len);
    let v2 = p.roce_v2_ipv4().map(|g| g.index);
    for g in p.gids.iter().take(GIDS_SHOWN) {
        let mark = match (Some(g.index) == v2, g.ipv4()) {
            (true, Some(v4)) if g.is_roce_v2_ipv4() => format!("  <- RoCE v2 over IPv4 ({v4})"),
            (true, Some(v4)) => {
                format!("  <- IPv4 {v4} (type unreadable: RoCE v2 if the port is v2-only, as rxe)")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "      [{}] {:<40} {:<11} {}{mark}",
            g.index,
            g.to_string(),
            g.gid_type.as_deref().unwrap_or("(no type)"),
            g.netdev.as_deref().unwrap_or("")
        );
    }
    if p.gids.len() > GIDS_SHOWN {
        let _ = writeln!(out, "      ... {} more", p.gids.len() - GIDS_SHOWN);
    }

    let mut usable = true;
    if p.state != PortState::Active {
        usable = false;
        f.problems.push(Problem::port(format!("{here} is {}, not ACTIVE", p.state), not_active_fix(p)));
    }
    match p.transport {
        Transport::Roce => {
            match v2 {
                Some(i) => {
                    let _ = writeln!(out, "    RoCE v2 over IPv4: GID index {i}");
                }
                None => {
                    usable = false;
                    f.problems.push(Problem::port(
                        format!("{here} has no RoCE v2 IPv4 GID (rdma:// addresses are IPv4)"),
                        format!(
                            "give its network device an IPv4 address: `ip addr add A.B.C.D/24 dev {}` \
                             (the kernel adds the ::ffff:A.B.C.D GID entries by itself)",
                            netdev_of(p)
                        ),
                    ));
                }
            }
            let source = if gid_set { "set" } else { "default" };
            match p.gid(gid_index) {
                Some(g) => {
                    let _ = writeln!(
                        out,
                        "    {ENV_GID_INDEX}={gid_index} ({source}): populated ({g}){}",
                        if Some(gid_index) == v2 { ", the RoCE v2 IPv4 entry" } else { "" }
                    );
                }
                None => {
                    usable = false;
                    f.problems.push(Problem::port(
                        format!(
                            "{here}: {ENV_GID_INDEX}={gid_index} ({source}) names an empty GID entry: \
                             connection setup checks it and fails"
                        ),
                        match v2 {
                            Some(i) => format!("`export {ENV_GID_INDEX}={i}` (the RoCE v2 IPv4 entry)"),
                            None => {
                                "first give the port an IPv4 GID (above), then set it to that index".into()
                            }
                        },
                    ));
                }
            }
        }
        Transport::IWarp => {
            let _ = writeln!(out, "    iWARP: rdma_cm connects over TCP/IP; no GID index to choose");
        }
        Transport::InfiniBand => {
            let _ = writeln!(
                out,
                "    InfiniBand: rdma:// needs IP over InfiniBand (an ib0 address) for rdma_cm"
            );
        }
        Transport::Other(ref t) => {
            usable = false;
            f.problems.push(Problem::port(
                format!("{here}: transport {t} is not supported"),
                "use a RoCE, iWARP or InfiniBand device",
            ));
        }
    }
    if p.link_layer == LinkLayer::Ethernet && p.active_mtu != 0 && p.active_mtu < 1024 {
        let _ = writeln!(
            out,
            "    note: active MTU {} is small: raise the netdev's MTU (`ip link set {} mtu 1500`)",
            p.active_mtu,
            netdev_of(p)
        );
    }
    let _ = writeln!(out, "    verdict: {}", if usable { "usable" } else { "NOT usable (see problems)" });
    if usable {
        f.usable.push(here);
    }
}

fn not_active_fix(p: &PortReport) -> String {
    match (&p.transport, p.state) {
        (Transport::InfiniBand, PortState::Init) | (Transport::InfiniBand, PortState::Armed) => {
            "no subnet manager has configured the port: run `opensm` on one node of the fabric (or enable the switch's SM)".into()
        }
        (Transport::InfiniBand, _) => "check the cable and the switch port (`ibstat`, `ibstatus`)".into(),
        _ => format!(
            "its network device is down or has no carrier: `ip link set {} up` (`rdma link show` names it; \
             soft devices follow their netdev)",
            netdev_of(p)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_core::transport::device_report::{GidReport, NodeTransport};

    fn gid(index: u32, addr: &str, gid_type: &str) -> GidReport {
        GidReport {
            index,
            raw: addr.parse::<std::net::Ipv6Addr>().unwrap().octets(),
            gid_type: Some(gid_type.to_string()),
            netdev: Some("eth0".to_string()),
        }
    }

    fn port(transport: Transport, state: PortState, gids: Vec<GidReport>) -> PortReport {
        PortReport {
            port: 1,
            transport,
            state,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
            active_mtu: 1024,
            max_msg_sz: 1 << 23,
            gid_tbl_len: 1024,
            gids,
        }
    }

    fn device(name: &str, node: NodeTransport, ports: Vec<PortReport>) -> DeviceReport {
        DeviceReport {
            name: name.to_string(),
            node_transport: node,
            problem: None,
            firmware: "0.0.0".to_string(),
            max_qp_wr: 1 << 20,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_mr_size: u64::MAX,
            ports,
            port_problems: Vec::new(),
        }
    }

    fn rxe_gids() -> Vec<GidReport> {
        vec![gid(0, "fe80::5054:ff:fe12:3456", "RoCE v2"), gid(1, "::ffff:10.0.2.15", "RoCE v2")]
    }

    fn judge(d: &DeviceReport, gid_index: u32) -> (String, Findings) {
        let mut out = String::new();
        let mut f = Findings::default();
        examine(&mut out, d, gid_index, false, &mut f);
        (out, f)
    }

    #[test]
    fn active_roce_port_with_ipv4_gid_is_usable() {
        let d = device(
            "rxe0",
            NodeTransport::InfiniBand,
            vec![port(Transport::Roce, PortState::Active, rxe_gids())],
        );
        let (out, f) = judge(&d, 1);
        assert_eq!(f.usable, vec!["rxe0 port 1".to_string()]);
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        assert!(out.contains("RoCE v2 over IPv4: GID index 1"), "{out}");
        assert!(out.contains("max_qp_rd_atom 128") && out.contains("max_msg_sz 8388608"), "{out}");
    }

    #[test]
    fn down_port_is_not_usable_and_names_its_netdev() {
        let d = device(
            "rxe0",
            NodeTransport::InfiniBand,
            vec![port(Transport::Roce, PortState::Down, rxe_gids())],
        );
        let (_, f) = judge(&d, 1);
        assert!(f.usable.is_empty());
        assert_eq!(f.problems.len(), 1, "{:?}", f.problems);
        assert!(f.problems[0].what.contains("DOWN") && f.problems[0].fix.contains("ip link set eth0 up"));
        assert!(f.problems[0].one_port);
    }

    #[test]
    fn empty_gid_index_points_at_the_roce_v2_entry() {
        let d = device(
            "rxe0",
            NodeTransport::InfiniBand,
            vec![port(Transport::Roce, PortState::Active, rxe_gids())],
        );
        let (_, f) = judge(&d, 3);
        assert!(f.usable.is_empty());
        assert!(f.problems.iter().any(|p| p.fix.contains("RPC_RDMA_GID_INDEX=1")), "{:?}", f.problems);
    }

    #[test]
    fn roce_port_without_ipv4_gid_asks_for_an_address() {
        let only_v6 = vec![gid(0, "fe80::5054:ff:fe12:3456", "RoCE v2")];
        let d = device(
            "rxe0",
            NodeTransport::InfiniBand,
            vec![port(Transport::Roce, PortState::Active, only_v6)],
        );
        let (_, f) = judge(&d, 0);
        assert!(f.usable.is_empty());
        assert!(
            f.problems.iter().any(|p| p.fix.contains("ip addr add") && p.fix.contains("eth0")),
            "{:?}",
            f.problems
        );
    }

    #[test]
    fn iwarp_port_needs_no_gid_index() {
        let siw = vec![gid(0, "5254:12:3456::", "IB/RoCE v1")];
        let d = device("siw0", NodeTransport::IWarp, vec![port(Transport::IWarp, PortState::Active, siw)]);
        let (out, f) = judge(&d, 1);
        assert_eq!(f.usable, vec!["siw0 port 1".to_string()]);
        assert!(out.starts_with("siw0: iWARP"), "{out}");
    }

    #[test]
    fn unopenable_device_is_a_problem_of_that_device() {
        let mut d = device("mlx5_0", NodeTransport::InfiniBand, Vec::new());
        d.problem = Some("ibv_open_device: Permission denied".into());
        let (_, f) = judge(&d, 1);
        assert!(f.usable.is_empty());
        assert!(f.problems[0].one_port && f.problems[0].fix.contains("uverbs"));
    }
}
