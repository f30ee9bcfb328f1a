//! The harness end to end: in-process over mem, and the binary with a child-process server over
//! tcp. Every wait is bounded.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use benches::commands::{execute, listen_address, Group, ServerSpec};
use benches::env::Placement;
use benches::load::{Budget, Concurrency, PointSpec};
use benches::target::{ProtoSettings, System};
use benches::workload::Workload;

const LIMIT: Duration = Duration::from_secs(120);

fn point(workload: Workload, size: usize, concurrency: Concurrency, calls: u64) -> PointSpec {
    PointSpec { workload, size, concurrency, warmup: Budget::Calls(2), budget: Budget::Calls(calls) }
}

#[tokio::test(flavor = "current_thread")]
async fn mem_points_take_the_expected_paths_and_balance_the_counters() {
    let settings = ProtoSettings { eager_threshold: 1024, recv_depth: 8, ..ProtoSettings::default() };
    let busy = Concurrency { connections: 2, tasks: 2, outstanding: 4 };
    let points = vec![
        point(Workload::Echo, 32, Concurrency::SERIAL, 25),
        point(Workload::Upload, 4096, Concurrency::SERIAL, 25),
        point(Workload::Download, 4096, Concurrency::SERIAL, 25),
        point(Workload::Echo, 4096, busy, 64),
    ];
    let groups =
        vec![Group { system: System::RpcCore, server: ServerSpec::InProcess(listen_address("mem")), points }];
    let outcome = tokio::time::timeout(LIMIT, execute(&groups, &Placement::default(), &settings))
        .await
        .expect("bounded")
        .expect("every call succeeds");
    let labels: Vec<&str> = outcome.points.iter().map(|p| p.paths.label()).collect();
    assert_eq!(labels, ["E/E", "R/E", "E/R", "R/R"]);
    let calls: Vec<u64> = outcome.points.iter().map(|p| p.calls).collect();
    assert_eq!(calls, [25, 25, 25, 64]);
    assert!(outcome.points.iter().all(|p| p.transport == "mem" && p.latency_us.p50 > 0.0));
    let run = &outcome.servers[0];
    let (client, server) = (run.client.expect("client counters"), run.server.expect("server counters"));
    // Warm-up calls count too: 2 per point.
    assert_eq!(client.calls_completed, 25 * 3 + 64 + 2 * 4);
    assert_eq!(server.calls_completed, client.calls_completed);
    assert_eq!(client.recv_unexpected + server.recv_unexpected, 0);
    assert_eq!(client.regions_registered, client.keys_revoked);
    assert_eq!(server.regions_registered, server.keys_revoked);
    assert_eq!(client.reads_issued, server.reads_served);
    assert!(client.rendezvous_sent > 0 && server.rendezvous_sent > 0);
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rpc-bench"))
}

/// Runs to completion within [`LIMIT`] (killed otherwise); returns status and stdout.
fn run_bounded(mut cmd: Command) -> (ExitStatus, String) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn rpc-bench");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rpc-bench did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().expect("reader"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rpc-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn one_command_tcp_run_uses_a_child_server_and_writes_results() {
    let dir = temp_dir("tcp");
    let mut cmd = bin();
    cmd.args(["run", "--listen", "tcp", "--sizes", "32,16K", "--iters", "30", "--eager-threshold", "4096"])
        .args(["--workload", "echo,download", "--out"])
        .arg(&dir);
    let (status, stdout) = run_bounded(cmd);
    assert!(status.success(), "{stdout}");
    assert!(stdout.contains("server child process"), "{stdout}");
    assert!(stdout.contains("recv unexpected"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).expect("run.json"))
            .expect("valid JSON");
    let points = json["points"].as_array().expect("points");
    assert_eq!(points.len(), 4);
    assert!(points.iter().all(|p| p["calls"] == 30 && p["transport"] == "tcp"));
    assert_eq!(points[1]["paths"]["rendezvous_rendezvous"], 30);
    assert_eq!(points[3]["paths"]["eager_rendezvous"], 30);
    let server = &json["servers"][0]["server"];
    assert_eq!(server["recv_unexpected"], 0);
    assert!(server["calls_completed"].as_u64().expect("server counters from the child") >= 120);
    assert!(json["environment"]["cpu_model"].is_string());
    let csv = std::fs::read_to_string(dir.join("run.csv")).expect("run.csv");
    assert_eq!(csv.lines().count(), 5);
    assert!(dir.join("run-latency-vs-size.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_whose_calls_cannot_happen_exits_non_zero() {
    let dir = temp_dir("fail");
    let mut cmd = bin();
    // Port 1 on loopback: nothing listens there, connecting fails.
    cmd.args(["run", "--connect", "tcp://127.0.0.1:1", "--sizes", "32", "--iters", "5", "--out"]).arg(&dir);
    let (status, _) = run_bounded(cmd);
    assert!(!status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
