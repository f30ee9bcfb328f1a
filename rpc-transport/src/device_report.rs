//! Plain facts about the machine's RDMA devices, as `rdma::inspect_devices` gathers them
//! (feature `rdma`), and the pure rules that read them (which GID is RoCE v2 over IPv4, what
//! transport a port speaks). Compiled without the `rdma` feature too, so that tools can interpret
//! and test reports anywhere.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The sysfs GID type string of a RoCE v2 entry (`.../gid_attrs/types/<index>`).
pub const GID_TYPE_ROCE_V2: &str = "RoCE v2";

/// The transport a device's node speaks (`ibv_node_type` / `transport_type`), before the link
/// layer of a port is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeTransport {
    /// InfiniBand transport: native InfiniBand, or RoCE on an Ethernet port.
    InfiniBand,
    /// iWARP (RDMA over TCP).
    IWarp,
    /// Anything else (usNIC, unknown), as the library names it.
    Other(String),
}

/// A port's link layer (`ibv_port_attr.link_layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand fabric.
    InfiniBand,
    /// Ethernet (RoCE, iWARP).
    Ethernet,
    /// Not reported by the driver (raw value).
    Unspecified(u8),
}

impl LinkLayer {
    /// From the raw `ibv_port_attr.link_layer` (1 InfiniBand, 2 Ethernet).
    pub fn from_raw(raw: u8) -> LinkLayer {
        match raw {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Unspecified(other),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Unspecified(raw) => write!(f, "unspecified ({raw})"),
        }
    }
}

/// What a port actually carries: the node transport combined with the port's link layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Native InfiniBand.
    InfiniBand,
    /// RDMA over Converged Ethernet (InfiniBand transport on an Ethernet port), e.g. rxe.
    Roce,
    /// iWARP (RDMA over TCP), e.g. siw.
    IWarp,
    /// Anything else.
    Other(String),
}

impl Transport {
    /// The transport of a port of a `node` device whose link layer is `link`.
    pub fn of(node: &NodeTransport, link: LinkLayer) -> Transport {
        match (node, link) {
            (NodeTransport::IWarp, _) => Transport::IWarp,
            (NodeTransport::InfiniBand, LinkLayer::Ethernet) => Transport::Roce,
            (NodeTransport::InfiniBand, _) => Transport::InfiniBand,
            (NodeTransport::Other(name), _) => Transport::Other(name.clone()),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::InfiniBand => f.write_str("InfiniBand"),
            Transport::Roce => f.write_str("RoCE"),
            Transport::IWarp => f.write_str("iWARP"),
            Transport::Other(name) => f.write_str(name),
        }
    }
}

/// A port's logical state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// The link is down (no cable, netdev down).
    Down,
    /// The physical link is up; on InfiniBand, no subnet manager configured it yet.
    Init,
    /// Configured by the subnet manager, not yet active.
    Armed,
    /// Usable.
    Active,
    /// Active, deferring (rare).
    ActiveDefer,
    /// Any other raw value.
    Other(u32),
}

impl PortState {
    /// From the raw `ibv_port_attr.state`.
    pub fn from_raw(raw: u32) -> PortState {
        match raw {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Down => f.write_str("DOWN"),
            PortState::Init => f.write_str("INIT"),
            PortState::Armed => f.write_str("ARMED"),
            PortState::Active => f.write_str("ACTIVE"),
            PortState::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            PortState::Other(raw) => write!(f, "state {raw}"),
        }
    }
}

/// One populated entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidReport {
    /// Index in the table (what `RPC_RDMA_GID_INDEX` names).
    pub index: u32,
    /// The 16 bytes of the GID.
    pub raw: [u8; 16],
    /// The sysfs type string (`IB/RoCE v1`, `RoCE v2`), when readable (iWARP has none).
    pub gid_type: Option<String>,
    /// The network device the entry belongs to (sysfs `ndevs`), when readable.
    pub netdev: Option<String>,
}

impl GidReport {
    /// The GID as an IPv6 address.
    pub fn addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.raw)
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.addr().to_ipv4_mapped()
    }

    /// Whether this is the entry RoCE v2 routes IPv4 with: IPv4-mapped, and typed `RoCE v2` by
    /// sysfs. An IPv4-mapped entry whose type cannot be read is not counted (see
    /// [`GidReport::maybe_roce_v2_ipv4`]).
    pub fn is_roce_v2_ipv4(&self) -> bool {
        self.ipv4().is_some() && self.gid_type.as_deref().map(str::trim) == Some(GID_TYPE_ROCE_V2)
    }

    /// IPv4-mapped with an unreadable type: RoCE v2 over IPv4 if the port is RoCE v2 only (rxe).
    pub fn maybe_roce_v2_ipv4(&self) -> bool {
        self.ipv4().is_some() && self.gid_type.is_none()
    }
}

impl fmt::Display for GidReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", self.addr()),
        }
    }
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortReport {
    /// Port number (from 1).
    pub port: u8,
    /// Transport of this port (node transport and link layer).
    pub transport: Transport,
    /// Logical state; only ACTIVE ports carry traffic.
    pub state: PortState,
    /// Raw physical state (`ibv_port_phys_state`, 5 = LinkUp).
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Active MTU in bytes (256..=4096).
    pub active_mtu: u32,
    /// Largest message the port carries (`max_msg_sz`): larger READs are split.
    pub max_msg_sz: u32,
    /// Size of the GID table.
    pub gid_tbl_len: u32,
    /// The populated GID entries (all-zero and unreadable ones are left out).
    pub gids: Vec<GidReport>,
}

impl PortReport {
    /// The GID entry RoCE v2 over IPv4 uses, if the table has one.
    pub fn roce_v2_ipv4(&self) -> Option<&GidReport> {
        self.gids
            .iter()
            .find(|g| g.is_roce_v2_ipv4())
            .or_else(|| self.gids.iter().find(|g| g.maybe_roce_v2_ipv4()))
    }

    /// The populated entry at `index`, if any.
    pub fn gid(&self, index: u32) -> Option<&GidReport> {
        self.gids.iter().find(|g| g.index == index)
    }
}

/// Active MTU in bytes from the raw `ibv_mtu` value (1 = 256 ... 5 = 4096); 0 if unknown.
pub fn mtu_bytes(raw: u32) -> u32 {
    match raw {
        1..=5 => 128 << raw,
        _ => 0,
    }
}

/// One device, as far as it could be queried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    /// Device name (`rxe0`, `siw0`, `mlx5_0`).
    pub name: String,
    /// Node transport.
    pub node_transport: NodeTransport,
    /// Why the device could not be opened or queried (then the fields below are empty or 0).
    pub problem: Option<String>,
    /// Firmware version string.
    pub firmware: String,
    /// Largest work-queue depth of a QP.
    pub max_qp_wr: u32,
    /// READs a QP may have outstanding as responder (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u32,
    /// READs a QP may have outstanding as initiator (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// The ports, from 1.
    pub ports: Vec<PortReport>,
    /// Ports that could not be queried: (port, why).
    pub port_problems: Vec<(u8, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u32, addr: &str, gid_type: Option<&str>) -> GidReport {
        GidReport {
            index,
            raw: addr.parse::<Ipv6Addr>().unwrap().octets(),
            gid_type: gid_type.map(str::to_string),
            netdev: Some("eth0".into()),
        }
    }

    #[test]
    fn ipv4_mapped_roce_v2_entry_is_found() {
        let link_local = gid(0, "fe80::5054:ff:fe12:3456", Some("RoCE v2\n"));
        let v1 = gid(2, "::ffff:10.0.2.15", Some("IB/RoCE v1"));
        let v2 = gid(3, "::ffff:10.0.2.15", Some("RoCE v2\n"));
        assert_eq!(v2.ipv4(), Some(Ipv4Addr::new(10, 0, 2, 15)));
        assert!(v2.is_roce_v2_ipv4());
        assert!(!v1.is_roce_v2_ipv4(), "a RoCE v1 entry is not RoCE v2");
        assert!(!link_local.is_roce_v2_ipv4(), "fe80:: is not IPv4-mapped");
        assert_eq!(link_local.ipv4(), None);
        assert_eq!(v2.to_string(), "::ffff:10.0.2.15");
        assert_eq!(link_local.to_string(), "fe80::5054:ff:fe12:3456");

        let port = PortReport {
            port: 1,
            transport: Transport::Roce,
            state: PortState::Active,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
            active_mtu: 1024,
            max_msg_sz: 1 << 23,
            gid_tbl_len: 1024,
            gids: vec![link_local, v1, v2],
        };
        assert_eq!(port.roce_v2_ipv4().map(|g| g.index), Some(3));
        assert_eq!(port.gid(2).map(|g| g.index), Some(2));
        assert!(port.gid(1).is_none());
    }

    #[test]
    fn untyped_ipv4_entry_is_only_a_maybe() {
        let untyped = gid(1, "::ffff:192.168.1.2", None);
        assert!(!untyped.is_roce_v2_ipv4());
        assert!(untyped.maybe_roce_v2_ipv4());
        let port = PortReport {
            port: 1,
            transport: Transport::Roce,
            state: PortState::Active,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
            active_mtu: 1024,
            max_msg_sz: 1 << 23,
            gid_tbl_len: 16,
            gids: vec![gid(0, "fe80::1", None), untyped],
        };
        assert_eq!(port.roce_v2_ipv4().map(|g| g.index), Some(1));
    }

    #[test]
    fn transport_combines_node_and_link_layer() {
        assert_eq!(Transport::of(&NodeTransport::InfiniBand, LinkLayer::Ethernet), Transport::Roce);
        assert_eq!(Transport::of(&NodeTransport::InfiniBand, LinkLayer::InfiniBand), Transport::InfiniBand);
        assert_eq!(Transport::of(&NodeTransport::IWarp, LinkLayer::Ethernet), Transport::IWarp);
        assert_eq!(LinkLayer::from_raw(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_raw(0), LinkLayer::Unspecified(0));
    }

    #[test]
    fn raw_values_decode() {
        assert_eq!(PortState::from_raw(4), PortState::Active);
        assert_eq!(PortState::from_raw(1).to_string(), "DOWN");
        assert_eq!(PortState::from_raw(9), PortState::Other(9));
        assert_eq!(mtu_bytes(1), 256);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
    }
}
