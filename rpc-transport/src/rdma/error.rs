//! Typed setup errors of the verbs backend and how they map onto [`TransportError`].

use std::io;

use crate::TransportError;

/// Why the verbs backend could not set up a connection or a registration.
///
/// These reach the caller inside a [`TransportError`]: [`RdmaError::NoDevice`] as
/// [`TransportError::Unavailable`]; [`RdmaError::Unreachable`] and [`RdmaError::Rejected`] as the
/// `source` of [`TransportError::Connect`]; the others as the `source` of
/// [`TransportError::Io`]. Get them back with `std::error::Error::source` + `downcast_ref`, or
/// [`RdmaError::find`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaError {
    /// libibverbs / librdmacm are missing, or there is no RDMA device.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// The configured device is not in the device list.
    #[error("RDMA device {wanted:?} not found (devices: {available})")]
    DeviceNotFound {
        /// `RPC_RDMA_DEVICE`.
        wanted: String,
        /// The devices that exist.
        available: String,
    },
    /// rdma_cm bound the address to another device than the configured one.
    #[error(
        "rdma_cm bound {addr} to device {chosen}, but {wanted} was requested (RPC_RDMA_DEVICE); \
         rdma_cm picks the first device carrying the address: remove the other link or use an \
         address only {wanted} carries"
    )]
    WrongDevice {
        /// The address.
        addr: String,
        /// The device rdma_cm chose.
        chosen: String,
        /// The configured device.
        wanted: String,
    },
    /// The configured GID index does not exist (or is empty) on the port.
    #[error("GID index {index} not found on {device} port {port} ({detail}); set RPC_RDMA_GID_INDEX")]
    GidNotFound {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// GID index.
        index: u32,
        /// What the query said.
        detail: String,
    },
    /// Registering memory failed and the memlock limit is the likely cause.
    #[error(
        "registering {len} bytes failed ({source}): the locked-memory limit is {limit} \
         (`ulimit -l` shows {limit_kib}); raise it with `ulimit -l unlimited`, a `memlock` line \
         in /etc/security/limits.conf, or LimitMEMLOCK=infinity for a systemd service"
    )]
    MemlockTooLow {
        /// Bytes we tried to register.
        len: usize,
        /// RLIMIT_MEMLOCK in bytes, as text ("unlimited" or a number).
        limit: String,
        /// The same limit as `ulimit -l` prints it (KiB).
        limit_kib: String,
        /// The error of ibv_reg_mr.
        source: io::Error,
    },
    /// The peer's address or route could not be resolved, or it did not answer.
    #[error("RDMA peer {addr} unreachable ({stage}): {detail}")]
    Unreachable {
        /// The peer address.
        addr: String,
        /// Which step failed (address resolution, route resolution, connect).
        stage: &'static str,
        /// Status or errno.
        detail: String,
    },
    /// The peer rejected the connection (nothing listening on that port, or refused).
    #[error("RDMA peer {addr} rejected the connection (status {status})")]
    Rejected {
        /// The peer address.
        addr: String,
        /// The rdma_cm status.
        status: i32,
    },
}

impl RdmaError {
    /// Finds an [`RdmaError`] inside a [`TransportError`] (in its source chain), if there is one.
    pub fn find(err: &TransportError) -> Option<&RdmaError> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cur {
            if let Some(r) = e.downcast_ref::<RdmaError>() {
                return Some(r);
            }
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if let Some(inner) = io.get_ref() {
                    if let Some(r) = inner.downcast_ref::<RdmaError>() {
                        return Some(r);
                    }
                }
            }
            cur = e.source();
        }
        None
    }

    /// Wraps this error into the [`TransportError`] variant documented on [`RdmaError`].
    pub(crate) fn into_transport(self) -> TransportError {
        match self {
            RdmaError::NoDevice(_) => TransportError::Unavailable(self.to_string()),
            RdmaError::Unreachable { ref addr, .. } | RdmaError::Rejected { ref addr, .. } => {
                let addr = addr.clone();
                let kind = match self {
                    RdmaError::Rejected { .. } => io::ErrorKind::ConnectionRefused,
                    _ => io::ErrorKind::HostUnreachable,
                };
                TransportError::Connect { addr, source: io::Error::new(kind, self) }
            }
            other => TransportError::Io(io::Error::other(other)),
        }
    }
}

impl From<RdmaError> for TransportError {
    fn from(e: RdmaError) -> Self {
        e.into_transport()
    }
}

/// The full error text of a library error (its source chain).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

/// A verbs call failed: `TransportError::Verbs` with the call's name.
pub(crate) fn verbs(call: &'static str, detail: impl std::fmt::Display) -> TransportError {
    TransportError::Verbs { call, detail: detail.to_string() }
}

/// Turns an `ibv_reg_mr` failure into [`RdmaError::MemlockTooLow`] when the memlock limit is
/// finite (the usual cause), else into a plain verbs error.
pub(crate) fn registration_failed(len: usize, source: io::Error) -> TransportError {
    let likely_memlock = matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN));
    match memlock_limit() {
        Some(limit) if likely_memlock => RdmaError::MemlockTooLow {
            len,
            limit: format!("{limit} bytes"),
            limit_kib: format!("{}", limit / 1024),
            source,
        }
        .into(),
        _ => verbs("ibv_reg_mr", format!("{len} bytes: {source}")),
    }
}

/// RLIMIT_MEMLOCK's soft limit in bytes, or `None` when unlimited.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the valid local struct.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if ret != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_maps_to_unavailable() {
        let e: TransportError = RdmaError::NoDevice("none".into()).into();
        assert!(matches!(e, TransportError::Unavailable(ref m) if m.contains("no RDMA device")));
    }

    #[test]
    fn unreachable_is_found_in_connect_error() {
        let e: TransportError =
            RdmaError::Unreachable { addr: "10.0.0.1:1".into(), stage: "route", detail: "x".into() }.into();
        assert!(matches!(e, TransportError::Connect { .. }));
        assert!(matches!(RdmaError::find(&e), Some(RdmaError::Unreachable { stage: "route", .. })));
    }

    #[test]
    fn memlock_message_tells_how_to_raise_it() {
        let e = RdmaError::MemlockTooLow {
            len: 4096,
            limit: "65536 bytes".into(),
            limit_kib: "64".into(),
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let msg = e.to_string();
        assert!(msg.contains("ulimit -l"), "{msg}");
        assert!(msg.contains("64"), "{msg}");
        let t: TransportError = e.into();
        assert!(matches!(RdmaError::find(&t), Some(RdmaError::MemlockTooLow { .. })));
    }
}
