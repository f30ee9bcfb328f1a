//! A typical service: the trait is implemented with `async fn`, the server dispatches by id, and the
//! ids, names and method table are what the docs promise.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::executor::block_on;
use rpc_core::codec::{decode, encode};
use rpc_core::{CallError, Service};

#[rpc_core::service]
pub trait Kv {
    async fn get(&self, key: String) -> Option<Vec<u8>>;
    async fn put(&self, key: String, value: Vec<u8>) -> u64;
    async fn ping(&self);
}

#[derive(Default)]
struct MemKv {
    entries: Mutex<Vec<(String, Vec<u8>)>>,
    pings: AtomicU64,
}

impl Kv for MemKv {
    async fn get(&self, key: String) -> Option<Vec<u8>> {
        let entries = self.entries.lock().unwrap();
        entries.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone())
    }

    async fn put(&self, key: String, value: Vec<u8>) -> u64 {
        let mut entries = self.entries.lock().unwrap();
        entries.push((key, value));
        entries.len() as u64
    }

    async fn ping(&self) {
        self.pings.fetch_add(1, Ordering::Relaxed);
    }
}

fn require_send<F: Future + Send>(future: F) -> F {
    future
}

/// Type-checks the client stub's signatures (never called: it needs a live connection).
#[allow(dead_code)]
async fn client_calls(kv: &KvClient) -> Result<(), CallError> {
    let value: Option<Vec<u8>> = require_send(kv.get("k".to_string())).await?;
    let count: u64 = kv.put("k".to_string(), value.unwrap_or_default()).await?;
    let (): () = kv.ping().await?;
    let with_deadline =
        kv.with_options(rpc_core::CallOptions::new().deadline(std::time::Duration::from_secs(1)));
    let _: &rpc_core::Client = with_deadline.client();
    let _ = (count, KvClient::new(kv.client().clone()));
    Ok(())
}

fn main() {
    // The rewritten trait is still implementable and callable with `async fn`s.
    let kv = MemKv::default();
    assert_eq!(block_on(kv.put("a".into(), vec![1])), 1);
    assert_eq!(block_on(kv.get("a".into())), Some(vec![1]));
    block_on(kv.ping());
    assert_eq!(kv.pings.load(Ordering::Relaxed), 1);

    // Ids hash "Trait.method".
    assert_eq!(KvClient::GET, rpc_core::__private::method_id("Kv.get(key:String)->Option<Vec<u8>>"));
    assert_eq!(KvClient::PUT, rpc_core::__private::method_id("Kv.put(key:String,value:Vec<u8>)->u64"));
    assert_eq!(KvClient::PING, rpc_core::__private::method_id("Kv.ping()->()"));

    let kv = std::sync::Arc::new(kv);
    let server = KvServer::from_arc(kv.clone());
    assert_eq!(server.name(), "Kv");
    let table: Vec<(&str, rpc_core::MethodId)> = server.methods().iter().map(|m| (m.name, m.id)).collect();
    assert_eq!(table, [("get", KvClient::GET), ("put", KvClient::PUT), ("ping", KvClient::PING)]);

    // Requests are dispatched by id: arguments decoded as a tuple, the result encoded.
    let put =
        block_on(server.call(KvClient::PUT, encode(&("b".to_string(), vec![2u8, 3])).unwrap().into())).unwrap();
    assert_eq!(decode::<u64>(&put).unwrap(), 2);
    let get = block_on(server.call(KvClient::GET, encode(&("b".to_string(),)).unwrap().into())).unwrap();
    assert_eq!(decode::<Option<Vec<u8>>>(&get).unwrap(), Some(vec![2, 3]));
    let missing = block_on(server.call(KvClient::GET, encode(&("zz".to_string(),)).unwrap().into())).unwrap();
    assert_eq!(decode::<Option<Vec<u8>>>(&missing).unwrap(), None);
    let ping = block_on(server.call(KvClient::PING, encode(&()).unwrap().into())).unwrap();
    decode::<()>(&ping).unwrap();
    block_on(server.call(KvClient::PING, encode(&()).unwrap().into())).unwrap();
    assert_eq!(kv.pings.load(Ordering::Relaxed), 3, "the server ran the implementation's `ping`");

    // A payload that isn't the method's arguments is refused without running the method.
    assert!(block_on(server.call(KvClient::PUT, encode(&(1u8,)).unwrap().into())).is_err());
    assert_eq!(kv.entries.lock().unwrap().len(), 2);
    // So is an id that is no method of the service.
    let unknown = KvClient::GET ^ KvClient::PUT ^ KvClient::PING;
    assert!(block_on(server.call(unknown, encode(&()).unwrap().into())).is_err());

    // Clone and Debug don't require anything of the implementation.
    let copy = KvServer::new(MemKv::default()).clone();
    assert_eq!(format!("{copy:?}"), "KvServer { .. }");
    fn is_service<S: Service>(_: &S) {}
    is_service(&copy);
}
