//! What `#[service]` plugs into: the [`Service`] trait and the helpers its expansion calls.
//! Behaviour lives here, not in the expansion.

use std::future::Future;

use bytes::Bytes;
use futures::future::BoxFuture;
use rpc_transport::Received;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{CallError, Detail, ServiceError};
use crate::future_slot::{FutureSlot, ServiceFuture};
use crate::proto::MethodId;
use crate::runtime::observe::{ClientMethod, MethodName};
use crate::runtime::{CallOptions, Client};

/// A method of a service, for logs, metrics, routing and introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodDesc {
    /// The method's name.
    pub name: &'static str,
    /// `"Service.method"`, as spans, events and metrics name it.
    pub full_name: &'static str,
    /// Its stable id: [`method_id`] of its signature `"Service.method(arg:Type,..)->Output"`.
    pub id: MethodId,
    /// The most bytes its answer can take encoded, when its type tells ([`response_bound`]);
    /// `None`: not known until the server has seen its answers. A server reserves a handler's
    /// expected answer in the connection's rendezvous budget before the handler runs, and an
    /// unknown answer takes the whole budget: the first call of such a method on a connection
    /// runs alone among those of large or unknown answers. A method whose answer is known to be
    /// small never waits for them.
    pub max_response: Option<u64>,
    /// Its handler answers without waiting (`#[rpc(inline)]` on the trait's method): the server
    /// polls it first in the connection's driver (unless [`ServerConfig::inline_handlers`] is
    /// [`InlineHandlers::Never`](crate::InlineHandlers::Never)). A handler that finishes in that
    /// first poll is answered at once: no task, channel or extra wake-up (a small call's
    /// instructions over tcp ~16.8k -> ~13.7k, see BENCHMARKS.md). One that waits moves to a task
    /// and carries on there. The cost: whatever it computes before its first `.await` stalls its
    /// whole connection that long (its other calls, its keepalive answers). Only small calls
    /// are polled there: a request over the eager limit, or a call of a method whose answers
    /// lately went over it, runs in a task (its copies would stall the connection). `false` for
    /// methods not marked.
    ///
    /// [`ServerConfig::inline_handlers`]: crate::ServerConfig::inline_handlers
    pub inline: bool,
}

/// The most bytes an answer of type `T` can take encoded, when its type tells: a type that
/// owns no heap data (no drop glue) and takes at most 64 bytes in memory, such as the integers,
/// floats, `bool`, `char`, `()`, and small tuples, arrays, `Option`s and plain structs and enums
/// of them. Their bincode encoding takes at most a few bytes more than their size in memory
/// (a varint, an enum tag): the bound allows eight times that, at most 576 bytes. `None`
/// otherwise (`String`, `Vec`, `Bytes`, anything that owns a heap allocation): unknown. A type
/// whose own `Serialize` writes more than it holds would exceed the bound, and its answers then
/// take their real size from the budget when they are made, once past the reservation.
/// `#[service]` sets [`MethodDesc::max_response`] with this.
pub const fn response_bound<T>() -> Option<u64> {
    let size = std::mem::size_of::<T>();
    if !std::mem::needs_drop::<T>() && size <= 64 {
        Some(8 * size as u64 + 64)
    } else {
        None
    }
}

/// A server-side service: what `#[service]` implements for `FooServer<S>`.
pub trait Service: Send + Sync + 'static {
    /// The service's name (the trait's name).
    fn name(&self) -> &'static str;
    /// Its methods.
    fn methods(&self) -> &[MethodDesc];
    /// Runs one request: decodes the arguments, runs the method, encodes its result.
    /// The payload is the request as it lies in its receive buffer (or READ destination):
    /// decoding it with [`serve`] freezes it only if the arguments keep a slice of it.
    fn call(&self, method: MethodId, payload: Received) -> BoxFuture<'static, Result<Bytes, ServiceError>>;

    /// Runs one request like [`Service::call`], its future put in `slot`: a box the
    /// connection lends, reused from call to call when the future has the size and alignment of
    /// an earlier one. The server calls this method. By default it puts there the future
    /// `call` boxed (one allocation per call, `call`'s). `#[service]` implements it without a
    /// box of its own, so a call whose arguments and result hold no `Bytes` allocates nothing on
    /// the server; a hand-written service (or a wrapper of one, like [`Router`](crate::Router))
    /// does the same with [`FutureSlot::put`].
    fn call_in(&self, method: MethodId, payload: Received, slot: FutureSlot<'_>) -> ServiceFuture {
        slot.put(self.call(method, payload))
    }
}

/// Where a generated dispatcher puts a handler's future: a box of its own ([`Boxed`], for
/// [`Service::call`]) or the box the server lends ([`FutureSlot`], for [`Service::call_in`]).
pub trait Place {
    /// The placed future.
    type Placed;
    /// Places `future`.
    fn place<F>(self, future: F) -> Self::Placed
    where
        F: Future<Output = Result<Bytes, ServiceError>> + Send + 'static;
}

/// A box of the future's own.
#[derive(Debug, Clone, Copy)]
pub struct Boxed;

impl Place for Boxed {
    type Placed = BoxFuture<'static, Result<Bytes, ServiceError>>;

    fn place<F>(self, future: F) -> Self::Placed
    where
        F: Future<Output = Result<Bytes, ServiceError>> + Send + 'static,
    {
        Box::pin(future)
    }
}

impl Place for FutureSlot<'_> {
    type Placed = ServiceFuture;

    #[inline(always)]
    fn place<F>(self, future: F) -> Self::Placed
    where
        F: Future<Output = Result<Bytes, ServiceError>> + Send + 'static,
    {
        self.put(future)
    }
}

/// The stable id of a method: FNV-1a (32 bit) of its signature as `#[service]` writes it,
/// `"Service.method(arg:Type,..)->Output"` (argument names, their types and the output type as
/// written, whitespace removed). Ids never depend on declaration order, so reordering a trait
/// keeps clients and servers compatible; renaming, reordering or retyping arguments, or changing
/// the output type, changes the id, so a client and a server built from different signatures get
/// `UnknownMethod` instead of silently misreading each other's bytes.
pub const fn method_id(signature: &str) -> MethodId {
    let bytes = signature.as_bytes();
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

/// Client side of a generated method (`name` holds `"Service.method"` and its metric handles, a
/// `static` of the stub): encodes `args`, calls, decodes the response. The deadline counts from
/// here, so encoding the arguments counts against it.
pub async fn call<Args, Resp>(
    client: &Client,
    opts: &CallOptions,
    method: MethodId,
    name: &'static ClientMethod,
    args: &Args,
) -> Result<Resp, CallError>
where
    Args: Serialize,
    Resp: DeserializeOwned,
{
    let started = tokio::time::Instant::now();
    // An eager request is encoded behind room for the frame header and goes out as this very
    // buffer.
    let (pool, eager_limit) = client.request_memory();
    let payload = crate::codec::encode_request(&pool, args, eager_limit)
        .map_err(|e| CallError::Codec(Detail::caused_by("encoding arguments", e)))?;
    let (response, _) = client
        .call_since(started, method, MethodName::Stub(name), payload, opts)
        .await
        .map_err(|e| explain(e, name))?;
    crate::codec::decode_received(response)
        .map_err(|e| CallError::Codec(Detail::caused_by("decoding the response", e)))
}

/// An `UnknownMethod` answer names the method and the likely cause.
fn explain(e: CallError, name: &ClientMethod) -> CallError {
    match e {
        CallError::Remote(mut r) if r.code == crate::WireErrorCode::UnknownMethod => {
            r.message = format!(
                "{} (the server has no `{}` with this client's signature: a different build of the \
                 service, or another service)",
                r.message,
                name.name()
            );
            CallError::Remote(r)
        }
        other => other,
    }
}

/// Server side of a generated method: decodes `Args`, runs `f`, encodes its output; the
/// future is put where `place` says.
pub fn serve<Args, Resp, F, Fut, P>(payload: Received, place: P, f: F) -> P::Placed
where
    Args: DeserializeOwned + Send + 'static,
    Resp: Serialize,
    F: FnOnce(Args) -> Fut + Send + 'static,
    Fut: Future<Output = Resp> + Send + 'static,
    P: Place,
{
    // `Bytes` arguments (decoded as `SharedBytes` by the generated code) of more than 1 KiB are
    // slices of the payload: no copy. Arguments without any leave the receive buffer unfrozen.
    let mut payload = payload;
    let (args, sliced) = match crate::codec::decode_in_place::<Args>(&mut payload) {
        Ok(a) => a,
        Err(e) => {
            return place.place(std::future::ready(Err(ServiceError::BadRequest(Detail::from_error(e)))))
        }
    };
    // Arguments that hold slices of a payload of more than 1 KiB keep it alive anyway: the
    // payload is kept too (until the handler returns), so that a response made of an argument
    // as it came (an echo) is that slice of the payload, not a copy. Otherwise the payload goes
    // now (its buffer back to the pool); a small response is encoded afresh (less work than
    // matching it against the payload).
    let source = (sliced && payload.len() > crate::arena::SMALL).then(|| payload.into_bytes());
    place.place(async move {
        let resp = f(args).await;
        let encoded = match &source {
            Some(source) => crate::codec::encode_reusing(&resp, source),
            None => crate::codec::encode(&resp),
        };
        encoded.map_err(|e| ServiceError::Handler(Detail::caused_by("encoding the response", e)))
    })
}

/// Server side, for a method id the service does not have.
pub fn unknown_method<P: Place>(service: &'static str, method: MethodId, place: P) -> P::Placed {
    place.place(std::future::ready(Err(ServiceError::UnknownMethod { service, method })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode, SharedBytes};

    fn run<T>(f: BoxFuture<'static, T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn answer_types_without_heap_data_are_bounded_and_their_encodings_fit_the_bound() {
        #[derive(serde::Serialize)]
        enum Tag {
            A,
            B(u16, Option<bool>),
        }
        fn fits<T: Serialize>(value: T) {
            let bound = response_bound::<T>().expect("bounded");
            let len = encode(&value).unwrap().len() as u64;
            assert!(len <= bound, "{len} bytes encoded, bound {bound}");
        }
        fits(u64::MAX);
        fits(i128::MIN);
        fits(());
        fits(true);
        fits('\u{10ffff}');
        fits(f64::MAX);
        fits((u32::MAX, Some(u64::MAX), [u16::MAX; 4]));
        fits(Some(Some(Some(false))));
        fits([Tag::A, Tag::B(u16::MAX, Some(true))]);
        fits(Ok::<u64, u32>(u64::MAX));
        for unknown in [
            response_bound::<String>(),
            response_bound::<Vec<u8>>(),
            response_bound::<Bytes>(),
            response_bound::<Option<Vec<u8>>>(),
            response_bound::<Result<u64, String>>(),
            response_bound::<[u64; 9]>(),
        ] {
            assert_eq!(unknown, None);
        }
    }

    #[test]
    fn an_echo_answers_with_its_request_payload_and_other_handlers_encode() {
        let payload = encode(&(Bytes::from(vec![7u8; 20_000]),)).unwrap();
        let echoed =
            run(serve(payload.clone().into(), Boxed, |(b,): (SharedBytes,)| async move { b.0 })).unwrap();
        assert_eq!(echoed, payload);
        assert_eq!(echoed.as_ptr(), payload.as_ptr(), "the request payload itself, not a copy");
        // A handler that answers something else gets its own encoding.
        let half =
            run(serve(
                payload.clone().into(),
                Boxed,
                |(b,): (SharedBytes,)| async move { b.0.slice(..10_000) },
            ))
            .unwrap();
        assert_eq!(half, encode(&Bytes::from(vec![7u8; 10_000])).unwrap());
        let len =
            run(serve(payload.clone().into(), Boxed, |(b,): (SharedBytes,)| async move { b.0.len() as u64 }))
                .unwrap();
        assert_eq!(len, encode(&20_000u64).unwrap());
    }
}
