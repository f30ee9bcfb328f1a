//! Methods taking only `&self`, and a service with no methods at all.

use futures::executor::block_on;
use rpc_core::Service;

#[rpc_core::service]
trait Clock {
    async fn now(&self) -> u64;
}

struct Fixed(u64);

impl Clock for Fixed {
    async fn now(&self) -> u64 {
        self.0
    }
}

#[rpc_core::service]
trait Nothing {}

struct Empty;

impl Nothing for Empty {}

#[allow(dead_code)]
async fn client_calls(clock: &ClockClient) -> Result<u64, rpc_core::CallError> {
    clock.now().await
}

fn main() {
    assert_eq!(block_on(Fixed(7).now()), 7);
    let server = ClockServer::new(Fixed(7));
    assert_eq!(server.methods().len(), 1);
    assert_eq!(server.methods()[0].id, ClockClient::NOW);

    let nothing = NothingServer::new(Empty);
    assert_eq!(nothing.name(), "Nothing");
    assert!(nothing.methods().is_empty());
    assert!(block_on(nothing.call(ClockClient::NOW, rpc_core::__private::Received::new())).is_err());
}
