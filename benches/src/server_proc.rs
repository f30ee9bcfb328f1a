//! The server as a child process of the same binary, so that client and server are separate
//! processes (as with perftest) even in a one-command run.
//!
//! The child prints `listening on ADDR`, serves, and when its standard input closes (the parent
//! stopped it, or died) prints `counters JSON` and exits.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::counters::Counters;
use crate::target::{ProtoSettings, System};
use crate::BenchError;

/// The line prefix announcing the bound address.
pub const LISTENING: &str = "listening on ";
/// The line prefix carrying the server's counters when it stops.
pub const COUNTERS: &str = "counters ";

/// A running server child; killed if dropped without [`ServerProcess::stop`].
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

/// How to start the child.
#[derive(Debug, Clone)]
pub struct ServerCommand {
    /// The system to serve.
    pub system: System,
    /// The address to bind.
    pub listen: String,
    /// Protocol settings.
    pub settings: ProtoSettings,
    /// CPU to pin the child to.
    pub cpu: Option<usize>,
    /// tokio worker threads.
    pub threads: usize,
}

impl ServerCommand {
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "server".to_string(),
            "--system".into(),
            self.system.name().into(),
            "--listen".into(),
            self.listen.clone(),
            "--threads".into(),
            self.threads.to_string(),
            "--stdin-control".into(),
        ];
        if let Some(cpu) = self.cpu {
            a.extend(["--cpu".to_string(), cpu.to_string()]);
        }
        a.extend(self.settings.to_args());
        a
    }
}

impl ServerProcess {
    /// Starts the child and waits for its address.
    pub fn spawn(cmd: &ServerCommand) -> Result<ServerProcess, BenchError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(cmd.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or_else(|| BenchError::ServerProcess("no stdout".into()))?;
        let mut proc = ServerProcess { child, stdout: BufReader::new(out), addr: String::new() };
        let line = proc.read_line()?;
        proc.addr = line
            .strip_prefix(LISTENING)
            .ok_or_else(|| BenchError::ServerProcess(format!("unexpected first line {line:?}")))?
            .to_string();
        Ok(proc)
    }

    fn read_line(&mut self) -> Result<String, BenchError> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            let status = self.child.try_wait()?;
            return Err(BenchError::ServerProcess(format!("exited early ({status:?})")));
        }
        Ok(line.trim().to_string())
    }

    /// The address it listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Stops the child (closing its stdin) and returns its counters.
    pub fn stop(mut self) -> Result<Option<Counters>, BenchError> {
        drop(self.child.stdin.take());
        let mut counters = None;
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                break;
            }
            if let Some(json) = line.trim().strip_prefix(COUNTERS) {
                counters = serde_json::from_str::<Option<Counters>>(json)
                    .map_err(|e| BenchError::ServerProcess(format!("bad counters line: {e}")))?;
            }
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return match status.success() {
                    true => Ok(counters),
                    false => Err(BenchError::ServerProcess(format!("exited with {status}"))),
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err(BenchError::ServerProcess("did not exit after its stdin closed".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Prints the lines the parent reads (the child side of the protocol above).
pub fn announce(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}
