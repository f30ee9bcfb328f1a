//! Methods without `->` (and with an explicit `-> ()`) return `()` on both sides.

use futures::executor::block_on;
use std::sync::atomic::{AtomicBool, Ordering};

#[rpc_core::service]
trait Switch {
    async fn turn_on(&self);
    async fn turn_off(&self) -> ();
}

#[derive(Default)]
struct Lamp(AtomicBool);

impl Switch for Lamp {
    async fn turn_on(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    async fn turn_off(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[allow(dead_code)]
async fn client_calls(switch: &SwitchClient) -> Result<(), rpc_core::CallError> {
    let (): () = switch.turn_on().await?;
    switch.turn_off().await
}

fn main() {
    let lamp = Lamp::default();
    block_on(lamp.turn_on());
    assert!(lamp.0.load(Ordering::SeqCst));
    block_on(lamp.turn_off());
    assert!(!lamp.0.load(Ordering::SeqCst));
    assert_eq!(SwitchClient::TURN_ON, rpc_core::__private::method_id("Switch.turn_on()->()"));
    assert_eq!(SwitchClient::TURN_OFF, rpc_core::__private::method_id("Switch.turn_off()->()"));
}
