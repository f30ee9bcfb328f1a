//! Where connection timers wait (`ClientConfig::timer_thread`, `ServerConfig::timer_thread`): on
//! the process's timer thread by default, by the system clock; in the tokio runtime's timer wheel
//! when that is turned off, where they follow tokio's paused test clock. (The deadline and
//! keepalive tests of the other files run on the timer thread, the default.)

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Kind;
use rpc_core::{CallError, CallOptions, ClientConfig, ServerConfig};

#[tokio::test(start_paused = true)]
async fn with_runtime_timers_a_deadline_follows_the_paused_clock() {
    let s = common::setup_with(
        Kind::Mem,
        ServerConfig::default().proto(common::proto()).timer_thread(false),
        ClientConfig::default().proto(common::proto()).timer_thread(false),
    )
    .await;
    let real = Instant::now();
    // Two minutes of virtual time (keepalive pings every 2 s included) against an hour-long
    // handler: the deadline fires when the runtime's clock gets there, at once in real time. On
    // the timer thread, which follows the system clock, this fails at once instead: the paused
    // clock jumps the handler's hour first and the call returns Ok.
    let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_secs(120)));
    assert_eq!(hurried.slow(3_600_000).await, Err(CallError::DeadlineExceeded));
    let took = real.elapsed();
    assert!(
        took < Duration::from_secs(60),
        "a 2-minute deadline on the paused clock took {took:?} of real time"
    );
    // The connection outlived the two minutes of pings and still answers.
    assert_eq!(
        s.client.echo(Bytes::from_static(b"after")).await.expect("echo"),
        Bytes::from_static(b"after")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_timer_thread_a_deadline_fires_by_the_system_clock_and_not_before() {
    for kind in [Kind::Mem, Kind::Tcp] {
        let s = common::setup_with(
            kind,
            ServerConfig::default().proto(common::proto()),
            ClientConfig::default().proto(common::proto()),
        )
        .await;
        let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(200)));
        let started = Instant::now();
        assert_eq!(hurried.slow(30_000).await, Err(CallError::DeadlineExceeded), "{kind:?}");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200), "{kind:?}: a 200 ms deadline fired after {took:?}");
        assert!(took < Duration::from_secs(20), "{kind:?}: a 200 ms deadline fired after {took:?}");
        common::eventually("the server dropped the handler", || {
            s.probe.slow_dropped.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
    }
}
