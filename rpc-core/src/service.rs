//! What `#[service]` plugs into: the [`Service`] trait and the helpers its expansion calls.
//! Behaviour lives here, not in the expansion.

use std::future::Future;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{CallError, ServiceError};
use crate::proto::MethodId;
use crate::runtime::{CallOptions, Client};

/// A method of a service, for logs and introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodDesc {
    /// The method's name.
    pub name: &'static str,
    /// Its stable id: [`method_id`] of `"Service.method"`.
    pub id: MethodId,
}

/// A server-side service: what `#[service]` implements for `FooServer<S>`.
pub trait Service: Send + Sync + 'static {
    /// The service's name (the trait's name).
    fn name(&self) -> &'static str;
    /// Its methods.
    fn methods(&self) -> &'static [MethodDesc];
    /// Runs one request: decodes the arguments, runs the method, encodes its result.
    fn call(&self, method: MethodId, payload: Bytes) -> BoxFuture<'static, Result<Bytes, ServiceError>>;
}

/// The stable id of a method: FNV-1a (32 bit) of `"Service.method"`. Ids depend on names only,
/// never on declaration order, so reordering a trait keeps clients and servers compatible.
pub const fn method_id(qualified_name: &str) -> MethodId {
    let bytes = qualified_name.as_bytes();
    let mut hash: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u32;
        hash = hash.wrapping_mul(0x0100_0193);
        i += 1;
    }
    hash
}

/// Fails constant evaluation (a compile error in the expansion) when two ids collide.
pub const fn assert_unique_ids(ids: &[MethodId]) {
    let mut i = 0;
    while i < ids.len() {
        let mut j = i + 1;
        while j < ids.len() {
            if ids[i] == ids[j] {
                panic!("two methods of this service hash to the same method id: rename one");
            }
            j += 1;
        }
        i += 1;
    }
}

/// Client side of a generated method: encodes `args`, calls, decodes the response. The deadline
/// counts from here, so encoding the arguments counts against it.
pub async fn call<Args, Resp>(
    client: &Client,
    opts: &CallOptions,
    method: MethodId,
    args: &Args,
) -> Result<Resp, CallError>
where
    Args: Serialize,
    Resp: DeserializeOwned,
{
    let started = tokio::time::Instant::now();
    let payload = crate::codec::encode_in(client.pool(), args)
        .map_err(|e| CallError::Codec(format!("encoding arguments: {e}")))?;
    let (response, _) = client.call_since(started, method, payload, opts).await?;
    crate::codec::decode(&response).map_err(|e| CallError::Codec(format!("decoding the response: {e}")))
}

/// Server side of a generated method: decodes `Args`, runs `f`, encodes its output.
pub fn serve<Args, Resp, F, Fut>(payload: Bytes, f: F) -> BoxFuture<'static, Result<Bytes, ServiceError>>
where
    Args: DeserializeOwned + Send + 'static,
    Resp: Serialize,
    F: FnOnce(Args) -> Fut + Send + 'static,
    Fut: Future<Output = Resp> + Send + 'static,
{
    let args: Args = match crate::codec::decode(&payload) {
        Ok(a) => a,
        Err(e) => return futures::future::ready(Err(ServiceError::BadRequest(e.to_string()))).boxed(),
    };
    drop(payload);
    async move {
        let resp = f(args).await;
        crate::codec::encode(&resp).map_err(|e| ServiceError::Handler(format!("encoding the response: {e}")))
    }
    .boxed()
}

/// Server side, for a method id the service does not have.
pub fn unknown_method(
    service: &'static str,
    method: MethodId,
) -> BoxFuture<'static, Result<Bytes, ServiceError>> {
    futures::future::ready(Err(ServiceError::UnknownMethod { service, method })).boxed()
}
