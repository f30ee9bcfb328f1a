//! `rpc-bench server`: serves until interrupted, or until stdin closes (`--stdin-control`).

use tokio::sync::oneshot;

use crate::cli::ServerArgs;
use crate::peers::RunningServer;
use crate::server_proc::{announce, COUNTERS, LISTENING};
use crate::BenchError;

pub(super) async fn serve(args: ServerArgs) -> Result<(), BenchError> {
    let server = RunningServer::start(args.system, &args.listen, &args.proto).await?;
    announce(&format!("{LISTENING}{}", server.local_addr()))?;
    if args.stdin_control {
        stdin_closed().await;
    } else {
        tokio::signal::ctrl_c().await?;
    }
    let counters = server.counters();
    server.stop().await;
    let json = serde_json::to_string(&counters).map_err(|e| BenchError::ServerProcess(e.to_string()))?;
    announce(&format!("{COUNTERS}{json}"))?;
    Ok(())
}

/// Resolves when standard input reaches its end (the parent closed it or died).
async fn stdin_closed() {
    let (tx, rx) = oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    let _ = rx.await;
}
