//! A call made while no other is in flight drives its connection from its own task
//! (`ClientConfig::caller_drives`): it posts its request and polls the connection while it
//! waits. The role moves between tasks as calls come and go; none of it may lose a wake-up,
//! whatever mix of lone calls, concurrent calls, cancelled calls and rendezvous payloads. (A
//! lone call whose peer dies: `e2e_failures`.) Calls that end together are followed by calls
//! that leave together: the driver neither lets the first of them go alone from its caller's
//! task nor sends what waited for credits just ahead of them (last tests, mem and tcp).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::{pattern, Kind, THRESHOLD};
use rpc_core::{CallError, CallOptions, ClientConfig, ServerConfig};

async fn setup(kind: Kind, caller_drives: bool) -> common::Setup {
    let client_cfg = ClientConfig::default().proto(common::proto()).caller_drives(caller_drives);
    common::setup_with(kind, ServerConfig::default().proto(common::proto()), client_cfg).await
}

over_all_transports! {
    async fn lone_calls_are_driven_by_their_callers(kind: Kind) {
        // On one thread: with two worker threads the driver task may still be running the
        // previous call's confirming rounds (it holds the connection's state) when the next call
        // starts, and that call then goes through the queue, as designed. That happened on rxe0
        // (38 of 50 calls drove). On one thread no other task runs while a call starts, so every
        // lone call starts, and drives, in its caller's task.
        common::on_one_thread(move || async move {
            const CALLS: u64 = 50;
            let s = setup(kind, true).await;
            let before = s.client.client().stats().await.expect("stats");
            for i in 0..CALLS {
                // Eager and rendezvous (both directions) in turn.
                let len = if i % 3 == 0 { THRESHOLD * 2 } else { 32 };
                let data = pattern(len, i as u8);
                assert_eq!(s.client.echo(data.clone()).await.expect("echo"), data);
            }
            let after = s.client.client().stats().await.expect("stats");
            let passes = after.caller_passes - before.caller_passes;
            assert!(passes >= CALLS, "every lone call drives its connection at least once: {passes} passes");
            // Over verbs the driver task is polled about once per call (it runs the rounds the
            // caller left once it had its answer: they re-arm the CQ, a system call, off the
            // call's path), not once per message. Over mem and tcp, where arming is a look at a
            // queue in memory, the caller's pass arms the connection itself at the end of the
            // round that took its answer (`driver::settle`): the task is not woken for lone
            // calls at all (the one poll is for the `stats` command).
            let task_polls = after.driver_polls - before.driver_polls;
            eprintln!("{kind:?}: {passes} caller passes, {task_polls} driver task polls for {CALLS} calls");
            let bound = if matches!(kind, Kind::Rdma) { 2 * CALLS } else { 2 };
            assert!(task_polls <= bound, "{task_polls} driver task polls for {CALLS} lone calls");
        })
        .await;
    }

    async fn a_lone_call_on_an_idle_connection_needs_only_its_answers_pass(kind: Kind) {
        // The pass that ended the last call found nothing more and left the connection armed, so
        // the next call's first poll needs no pass of its own (`Conn::start_here`): one pass per
        // call, the one that takes its answer. Over verbs the caller's pass stops at its answer
        // and leaves the confirming rounds to the driver task, so the next call finds the
        // connection not yet armed and polls it first, as before.
        common::on_one_thread(move || async move {
            const CALLS: u64 = 40;
            let s = setup(kind, true).await;
            // Deadlines of their own on half the calls: a start arms the timer for them itself.
            let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_secs(30)));
            let before = s.client.client().stats().await.expect("stats");
            for i in 0..CALLS {
                let data = pattern(32, i as u8);
                let echoed = if i % 2 == 0 { s.client.echo(data.clone()).await } else { hurried.echo(data.clone()).await };
                assert_eq!(echoed.expect("echo"), data);
            }
            let after = s.client.client().stats().await.expect("stats");
            let passes = after.caller_passes - before.caller_passes;
            eprintln!("{kind:?}: {passes} caller passes for {CALLS} lone calls");
            assert!(passes >= CALLS, "every call's answer is taken by its caller's pass: {passes}");
            if !matches!(kind, Kind::Rdma) {
                // A stray wake-up (a SEND the socket did not take at once) may cost a pass more.
                assert!(passes <= CALLS + CALLS / 4, "{passes} passes for {CALLS} lone calls");
            }
        })
        .await;
    }

    async fn a_lone_calls_deadline_fires_on_its_own_timer(kind: Kind) {
        // Keepalive once a minute: nothing but the call's own deadline timer can end it soon.
        // The driver asks for the next timeout only when one earlier than its timer was added
        // (`ProtoEnd::take_added_timeout`); a start that did not report its deadline would leave
        // the timer armed for the keepalive.
        let quiet = common::proto().keepalive_interval(Duration::from_secs(60)).idle_timeout(Duration::from_secs(240));
        let client_cfg = ClientConfig::default().proto(quiet.clone()).caller_drives(true);
        let s = common::setup_with(kind, ServerConfig::default().proto(quiet), client_cfg).await;
        for round in 0..3 {
            let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(50)));
            let started = tokio::time::Instant::now();
            assert_eq!(hurried.slow(30_000).await, Err(CallError::DeadlineExceeded), "round {round}");
            let took = started.elapsed();
            assert!(took < Duration::from_secs(20), "round {round}: a 50 ms deadline fired after {took:?}");
        }
        assert_eq!(s.client.echo(Bytes::from_static(b"after")).await.expect("echo"), Bytes::from_static(b"after"));
    }

    async fn an_earlier_deadline_re_arms_the_timer_of_a_busy_connection(kind: Kind) {
        // Keepalive once a minute, and a call in flight whose deadline is a minute away: both
        // drivers' timers are armed about a minute out. A call with a 50 ms deadline, started
        // next (through the driver task: another call is in flight), must re-arm them (the
        // client's ends the call, the server's drops its handler); calls with later deadlines
        // before it must not have disarmed anything.
        let quiet = common::proto().keepalive_interval(Duration::from_secs(60)).idle_timeout(Duration::from_secs(240));
        let client_cfg = ClientConfig::default().proto(quiet.clone());
        let s = common::setup_with(kind, ServerConfig::default().proto(quiet), client_cfg).await;
        let patient = s.client.with_options(CallOptions::new().deadline(Duration::from_secs(60)));
        // Both methods answered once: the server knows their answers are small, so no call of
        // either waits for the connection's rendezvous budget (an unknown method's first call
        // takes all of it, and one of its would wait for the long call's).
        assert_eq!(patient.slow(1).await, Ok(1));
        assert_eq!(patient.echo(pattern(32, 0)).await.expect("echo"), pattern(32, 0));
        let long = tokio::spawn({
            let patient = patient.clone();
            async move { patient.slow(30_000).await }
        });
        common::eventually("the long call runs", || s.server.stats().calls_in_flight == 1).await;
        // Later deadlines: each is answered, none moves the timers.
        for i in 0..3u8 {
            let data = pattern(32, i);
            assert_eq!(patient.echo(data.clone()).await.expect("echo"), data);
        }
        let hurried = s.client.with_options(CallOptions::new().deadline(Duration::from_millis(50)));
        let started = tokio::time::Instant::now();
        assert_eq!(hurried.slow(30_000).await, Err(CallError::DeadlineExceeded));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(20), "a 50 ms deadline fired after {took:?}");
        common::eventually("the hurried call's handler was dropped", || s.probe.slow_dropped.load(Ordering::SeqCst) == 1).await;
        long.abort();
        common::eventually("the long call's handler was dropped", || s.probe.slow_dropped.load(Ordering::SeqCst) == 2).await;
        assert_eq!(s.probe.slow_finished.load(Ordering::SeqCst), 1, "only the warm-up finished");
        assert_eq!(s.client.echo(Bytes::from_static(b"after")).await.expect("echo"), Bytes::from_static(b"after"));
    }

    async fn with_caller_drives_off_every_call_goes_through_the_driver_task(kind: Kind) {
        // On one thread, as above: with two worker threads one driver poll, still running on one
        // thread, may take the next call's command sent from the other, so two calls can share a
        // poll (seen once on siw0). On one thread each call's command needs a wake-up of its own.
        common::on_one_thread(move || async move {
            const CALLS: u64 = 20;
            let s = setup(kind, false).await;
            let before = s.client.client().stats().await.expect("stats");
            for i in 0..CALLS {
                let data = pattern(32, i as u8);
                assert_eq!(s.client.echo(data.clone()).await.expect("echo"), data);
            }
            let after = s.client.client().stats().await.expect("stats");
            assert_eq!(after.caller_passes, 0);
            let polls = after.driver_polls - before.driver_polls;
            assert!(polls >= CALLS, "the driver task ran every call: {polls} polls for {CALLS} calls");
        })
        .await;
    }

    async fn the_role_moves_between_many_tasks_and_every_call_completes(kind: Kind) {
        // 8 tasks on 2 worker threads, each alternating lone-looking and overlapping calls of
        // both paths: a call starts alone (driving) or queued, depending on the others.
        const TASKS: usize = 8;
        const CALLS: usize = 60;
        let s = setup(kind, true).await;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let client = s.client.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..CALLS {
                    let len = if (t + i) % 7 == 0 { THRESHOLD + 100 } else { 16 + i };
                    let data = pattern(len, (t * CALLS + i) as u8);
                    assert_eq!(client.echo(data.clone()).await.expect("echo"), data, "task {t} call {i}");
                    if i % 5 == t % 5 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for task in tasks {
            task.await.expect("caller task");
        }
        let stats = s.client.client().stats().await.expect("stats");
        assert_eq!(stats.calls_in_flight, 0);
    }

    async fn a_driving_call_dropped_mid_flight_leaves_the_connection_to_the_others(kind: Kind) {
        let s = setup(kind, true).await;
        for round in 0..5u64 {
            // Alone, so it drives; dropped while the server still works on it.
            let slow = s.client.slow(300);
            assert!(tokio::time::timeout(Duration::from_millis(20), slow).await.is_err(), "round {round}");
            // The cancelled call may still count as in flight, so these go through the queue:
            // they complete only if the dropped caller handed its wake-ups back to the driver.
            let (a, b) = tokio::join!(s.client.echo(pattern(40, 1)), s.client.echo(pattern(THRESHOLD * 2, 2)));
            assert_eq!(a.expect("echo a"), pattern(40, 1));
            assert_eq!(b.expect("echo b"), pattern(THRESHOLD * 2, 2));
            // And a lone call drives again.
            assert_eq!(s.client.echo(Bytes::from_static(b"again")).await.expect("echo"), "again");
        }
    }
}

/// A caller that keeps more calls in flight than the server's receives (16, `common::proto`)
/// can take: every batch of answers brings credits for requests that waited, and those leave
/// together with the calls the answers' callers start next (`ClientDriver::hold_sends`), not
/// alone just ahead of them: one post of SENDs to the transport per batch (tcp: one write
/// system call; `TransportCounters::send_posts`), not two.
async fn requests_that_waited_for_credits_leave_with_the_next_calls(kind: Kind) {
    common::on_one_thread(move || async move {
        use futures::stream::{FuturesUnordered, StreamExt};
        const CALLS: usize = 600;
        const OUTSTANDING: usize = 24;
        let s = setup(kind, true).await;
        let before = s.client.client().stats().await.expect("stats");
        let mut in_flight = FuturesUnordered::new();
        let mut started = 0;
        let echo = |i: usize| {
            let client = &s.client;
            async move { (i, client.echo(pattern(32, i as u8)).await) }
        };
        while started < OUTSTANDING {
            in_flight.push(echo(started));
            started += 1;
        }
        while let Some((i, echoed)) = in_flight.next().await {
            assert_eq!(echoed.expect("echo"), pattern(32, i as u8), "call {i}");
            if started < CALLS {
                in_flight.push(echo(started));
                started += 1;
            }
        }
        let after = s.client.client().stats().await.expect("stats");
        let stalls = after.proto.credit_stalls - before.proto.credit_stalls;
        let sends = after.transport.sends - before.transport.sends;
        let posts = after.transport.send_posts - before.transport.send_posts;
        eprintln!("{kind:?}: {stalls} requests waited for credits; {sends} SENDs in {posts} posts");
        assert!(stalls >= 10, "the test needs requests that wait for credits: {stalls}");
        // A round's requests leave in one post: as many posts as rounds, about CALLS / 15.
        assert!(posts * 10 <= sends, "{sends} SENDs in {posts} posts");
        assert_eq!(after.calls_in_flight, 0);
    })
    .await;
}

/// Rounds of 8 concurrent calls from one task: each round's calls end in one pass of the driver,
/// and the next round's first call, alone in flight when it starts, goes through the queue with
/// the other 7 (one SEND batch: one system call, one wake-up of the peer) instead of leaving
/// alone ahead of them from its caller's task (`Conn::start_here`). Only the first round's first
/// call drives (it follows no round). Not over verbs: there the answers of a round may come out
/// of the completion queue in several passes, and the last of them may end one call alone (the
/// next call then drives, as it should), so the count depends on timing.
async fn calls_that_end_together_are_followed_by_calls_sent_together(kind: Kind) {
    common::on_one_thread(move || async move {
        const ROUNDS: u64 = 20;
        let s = setup(kind, true).await;
        let before = s.client.client().stats().await.expect("stats");
        for round in 0..ROUNDS {
            let calls = (0..8u8).map(|i| s.client.echo(pattern(32, i)));
            for (i, echoed) in futures::future::join_all(calls).await.into_iter().enumerate() {
                assert_eq!(echoed.expect("echo"), pattern(32, i as u8), "round {round}");
            }
        }
        let after = s.client.client().stats().await.expect("stats");
        let passes = after.caller_passes - before.caller_passes;
        eprintln!("{kind:?}: {passes} caller passes in {ROUNDS} rounds");
        assert!(passes <= 4, "{passes} caller passes in {ROUNDS} rounds of calls sent together");
        // Whatever it asks of the driver task, every call still ends.
        assert_eq!(after.calls_in_flight, 0);
    })
    .await;
}

/// A test module per `async fn(Kind)` named, with its `mem` and `tcp` tests (each bounded by
/// `common::LIMIT`), for the tests that do not run over verbs.
macro_rules! over_mem_and_tcp {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::{common, Kind};

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mem() {
                tokio::time::timeout(common::LIMIT, super::$name(Kind::Mem)).await.expect("test timed out");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcp() {
                tokio::time::timeout(common::LIMIT, super::$name(Kind::Tcp)).await.expect("test timed out");
            }
        }
    )*};
}

over_mem_and_tcp!(
    requests_that_waited_for_credits_leave_with_the_next_calls,
    calls_that_end_together_are_followed_by_calls_sent_together,
);
