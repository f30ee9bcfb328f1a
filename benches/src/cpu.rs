//! CPU time per call: what the client's process and the server's process spent on a CPU (user
//! and kernel time, every thread) over a point's measured phase, divided by its calls.
//!
//! Latency says how long a caller waits; CPU time per call says what a call costs the machine,
//! which is what a service pays for at load, and what two processes sharing one CPU add up to
//! in a round trip. It is also steadier than a latency percentile where scheduling moves the
//! latency from run to run (a shared vCPU, the project's emulated VM): the work done per call
//! changes little when the order the processes run in does.
//!
//! Read on Linux from `/proc/<pid>/task/<tid>/schedstat` (its first field: nanoseconds on a
//! CPU, the scheduler's own account), summed over the process's threads. A thread that ends
//! inside the phase takes its time with it (the figure is then low); the harness's processes
//! keep their threads for a whole run. Elsewhere, or for a server in another host, there is no
//! figure.

use std::time::Duration;

use serde::Serialize;

/// CPU time per call of one measured phase, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuPerCall {
    /// This process: the client (and the server too when it runs in-process).
    pub client_us: f64,
    /// The server's child process (`None`: in-process, remote, or not readable).
    pub server_us: Option<f64>,
}

impl CpuPerCall {
    /// Both processes together (`None` without the server's figure).
    pub fn total_us(&self) -> Option<f64> {
        self.server_us.map(|s| s + self.client_us)
    }
}

/// Nanoseconds `pid` has spent on a CPU, summed over its threads (`None` if unreadable).
pub fn on_cpu(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        // A thread that ended since the listing has no file any more: it is skipped.
        if let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += parse_schedstat(&text)?;
        }
    }
    Some(Duration::from_nanos(total))
}

/// The first field of a `schedstat` line: nanoseconds on a CPU.
fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The CPU time of this process and of the server's process at the start of a phase.
#[derive(Debug, Clone, Copy)]
pub struct CpuProbe {
    client: Option<Duration>,
    server: Option<(u32, Duration)>,
}

impl CpuProbe {
    /// Reads both now; `server_pid`: the server's child process, if it has one.
    pub fn start(server_pid: Option<u32>) -> CpuProbe {
        CpuProbe {
            client: on_cpu(std::process::id()),
            server: server_pid.and_then(|pid| on_cpu(pid).map(|t| (pid, t))),
        }
    }

    /// CPU time per call since [`CpuProbe::start`], over `calls` calls (`None` if this process's
    /// time is unreadable or no call was made).
    pub fn per_call(&self, calls: u64) -> Option<CpuPerCall> {
        let client = on_cpu(std::process::id())?.checked_sub(self.client?)?;
        let server =
            self.server.and_then(|(pid, before)| on_cpu(pid).and_then(|now| now.checked_sub(before)));
        per_call(client, server, calls)
    }
}

fn per_call(client: Duration, server: Option<Duration>, calls: u64) -> Option<CpuPerCall> {
    if calls == 0 {
        return None;
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
    Some(CpuPerCall { client_us: us(client), server_us: server.map(us) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_its_first_field() {
        assert_eq!(parse_schedstat("123456789 2000 17\n"), Some(123_456_789));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn per_call_divides_each_side_by_the_calls() {
        let c = per_call(Duration::from_millis(10), Some(Duration::from_millis(5)), 1000).unwrap();
        assert!((c.client_us - 10.0).abs() < 1e-9 && (c.server_us.unwrap() - 5.0).abs() < 1e-9);
        assert_eq!(c.total_us().map(|t| (t * 1e6).round()), Some(15e6));
        assert_eq!(per_call(Duration::from_millis(1), None, 10).unwrap().total_us(), None);
        assert_eq!(per_call(Duration::ZERO, None, 0), None);
    }

    /// This process's time grows with the work its threads do on a CPU.
    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_charged_for_its_work() {
        let me = std::process::id();
        let before = on_cpu(me).expect("readable on Linux");
        // Work until 20 ms more are counted (bounded: a reading that never grows fails).
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        let grown = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let now = on_cpu(me).expect("readable");
            if now >= before + Duration::from_millis(20) {
                break true;
            }
            if std::time::Instant::now() > give_up {
                break false;
            }
        };
        assert!(grown, "10 s of spinning did not add 20 ms of CPU time");
        assert_eq!(on_cpu(u32::MAX), None, "no such process");
    }
}
