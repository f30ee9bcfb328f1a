//! The tcp backend's settings given in `ClientConfig::tcp` and `ServerConfig::tcp` reach each
//! side's transport: a side that announces no push window is pushed nothing and READs from its
//! peer, while its peer, which kept the default window, still READs from pushed bytes; a side
//! given a busy-poll window spins, the other does not.

mod common;

use std::time::Instant;

use common::{pattern, proto, setup_with, Kind, LIMIT, THRESHOLD};
use rpc_core::transport::{TcpSettings, TransportCounters};
use rpc_core::{ClientConfig, ServerConfig};

const CALLS: u64 = 3;

/// Echoes `CALLS` payloads of `size` bytes; returns the client's and the server's transport
/// counters once the server's say `published` (it publishes them at the end of a poll, which may
/// come after the client has its answer).
async fn echoes(
    server: ServerConfig,
    client: ClientConfig,
    size: usize,
    published: impl Fn(&TransportCounters) -> bool,
) -> (TransportCounters, TransportCounters) {
    let s = setup_with(Kind::Tcp, server.proto(proto()), client.proto(proto())).await;
    for i in 0..CALLS {
        let data = pattern(size, i as u8);
        assert_eq!(s.client.echo(data.clone()).await.expect("echo"), data);
    }
    let client = s.client.client().stats().await.expect("stats").transport;
    let began = Instant::now();
    loop {
        let server = s.server.stats().transport;
        if published(&server) || began.elapsed() > LIMIT {
            return (client, server);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_push_window_set_in_a_config_reaches_its_side_transport() {
    let no_window = TcpSettings::default().push_window(0);
    let (client, server) =
        echoes(ServerConfig::default(), ClientConfig::default().tcp(no_window.clone()), 4 * THRESHOLD, |s| {
            s.reads_issued >= CALLS && s.reads_served >= CALLS
        })
        .await;
    // The client announced no window: the server pushed none of its answers, and the client's
    // READs of them went to the server.
    assert_eq!((server.regions_pushed, client.reads_served_from_push), (0, 0), "{client:?}\n{server:?}");
    assert_eq!((client.reads_issued, server.reads_served), (CALLS, CALLS));
    // The server kept the default window: the client pushed its requests, and the server's
    // READs of them completed from those bytes.
    assert_eq!(
        (client.regions_pushed, server.reads_issued, server.reads_served_from_push),
        (CALLS, CALLS, CALLS)
    );
    assert_eq!(client.reads_served, 0);

    // The other way round.
    let (client, server) =
        echoes(ServerConfig::default().tcp(no_window), ClientConfig::default(), 4 * THRESHOLD, |s| {
            s.reads_issued >= CALLS && s.regions_pushed >= CALLS
        })
        .await;
    assert_eq!((client.regions_pushed, server.reads_served_from_push), (0, 0), "{client:?}\n{server:?}");
    assert_eq!((server.reads_issued, client.reads_served), (CALLS, CALLS));
    assert_eq!((server.regions_pushed, client.reads_served_from_push), (CALLS, CALLS));
}

/// A busy-poll window set in either config makes that side's reader spin (and only that side's),
/// and calls still complete with both sides on one thread: a spin yields to the other tasks.
#[tokio::test]
async fn a_busy_poll_window_set_in_a_config_reaches_its_side_transport() {
    let window = TcpSettings::default().busy_poll(std::time::Duration::from_millis(20));
    let (client, server) =
        echoes(ServerConfig::default(), ClientConfig::default().tcp(window.clone()), 64, |s| {
            s.recvs >= CALLS
        })
        .await;
    assert!(client.busy_poll_spins > 0, "{client:?}");
    assert_eq!(server.busy_poll_spins, 0, "{server:?}");

    let (client, server) =
        echoes(ServerConfig::default().tcp(window), ClientConfig::default(), 64, |s| s.busy_poll_spins > 0)
            .await;
    assert_eq!(client.busy_poll_spins, 0, "{client:?}");
    assert!(server.busy_poll_spins > 0, "{server:?}");
}
