//! The `#[service]` attribute of rpc-core (re-exported as `rpc_core::service`; use it from there).
//!
//! The expansion is deliberately thin: it parses the trait into `model::ServiceDef`, validates every
//! signature (span-accurate errors), and emits a few items that delegate all behaviour (encoding,
//! calls, dispatch) to `rpc_core::__private`.

#![forbid(unsafe_code)]

mod args;
mod errors;
mod expand;
mod method_id;
mod model;
mod validate;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Turns an `async` trait into an RPC service: a `Send` trait to implement, a typed client stub and a
/// server dispatcher.
///
/// ```text
/// #[rpc_core::service]
/// pub trait Kv {
///     /// Looks a key up.
///     async fn get(&self, key: String) -> Option<Vec<u8>>;
///     async fn put(&self, key: String, value: Vec<u8>) -> u64;
///     async fn ping(&self);
/// }
/// ```
///
/// expands to:
///
/// - **the trait**, as `pub trait Kv: Send + Sync + 'static` whose methods return
///   `impl Future<Output = T> + Send`. Implement it with `async fn`s as written. Attributes, docs,
///   visibility and supertraits are kept.
/// - **`KvClient`** (same visibility, `Clone + Debug`): `KvClient::new(rpc_core::Client)`,
///   `with_options(&self, CallOptions) -> Self` (e.g. a deadline), `client(&self)`, and for every
///   method `pub async fn get(&self, key: String) -> Result<Option<Vec<u8>>, rpc_core::CallError>`.
///   Arguments travel as one tuple (`()`, `(a,)`, `(a, b)`, ..). Each stub passes `"Kv.get"` (a
///   `static` holding its name and metric handles) along with the id, for spans and metrics.
/// - **method ids** as associated consts of the client: `KvClient::GET`, `KvClient::PUT`,
///   `KvClient::PING` (the method name in upper case), each
///   `rpc_core::__private::method_id("Kv.get(key:String)->Option<Vec<u8>>")` — the FNV-1a hash of the
///   method's signature (trait and method names, argument names and types in order, output type, as
///   written), never of its position. A client and a server built from different signatures get
///   `UnknownMethod` instead of misreading each other's positional encoding. Two methods whose ids
///   collide are a compile error.
/// - **`KvServer<S>`** (same visibility, `Clone + Debug` for any `S`): `KvServer::new(impl)` or
///   `KvServer::from_arc(arc)`, and `impl<S: Kv> rpc_core::Service for KvServer<S>` that dispatches on
///   the method id and answers unknown ids with `rpc_core::__private::unknown_method`. One private
///   dispatcher, generic over where the handler's future goes, serves both `Service::call` (a box of
///   its own) and `Service::call_in` (the box the server lends: no allocation per call).
///   `Service::methods` lists `MethodDesc { name: "get", full_name: "Kv.get", id: KvClient::GET,
///   max_response: rpc_core::response_bound::<Option<Vec<u8>>>(), inline: false }`, ..
///   Handlers read their call's context (peer, deadline, metadata) with `rpc_core::context::current()`.
///
/// Every generated public item is documented; a client method copies the docs of its trait method.
///
/// # Arguments
///
/// `#[service(crate = "path")]` names the path to rpc-core when it is not reachable as `::rpc_core`
/// (the crate was renamed in `Cargo.toml`, or it is re-exported): e.g. `crate = "::my_rpc"`.
///
/// # Method options
///
/// `#[rpc(inline)]` on a method of the trait marks a handler that answers without waiting: the
/// server polls it first in the connection's driver (`MethodDesc::inline`; the server's
/// `inline_handlers` setting can turn that off, or on for every method), so a small call to it
/// costs no task, channel or extra wake-up; if it does wait, it moves to a task and carries on
/// there. Whatever it computes before its first `.await` stalls its connection meanwhile: mark
/// only methods that answer at once. The attribute is the macro's: the trait as emitted does not
/// carry it. Any other option is a compile error at its token.
///
/// ```text
/// #[rpc_core::service]
/// pub trait Kv {
///     #[rpc(inline)]
///     async fn get(&self, key: String) -> Option<Vec<u8>>;
/// }
/// ```
///
/// # Supported signatures
///
/// Only `async fn name(&self, arg: Type, ..) -> Type;` with owned, serde-serializable argument and
/// result types; optionally, as in tarpc, the call's context first: `async fn name(&self, ctx:
/// rpc_core::Context, arg: Type, ..)`. It is recognised when written as `rpc_core::Context` or
/// `rpc_core::context::Context` (with or without a leading `::`, under the `crate = ".."` path when
/// given); the server passes it, the client stub has no such parameter, and it is not part of the
/// method id. A bare `Context` is an ordinary argument (the macro cannot tell it from a type of
/// yours); the context anywhere but first is a compile error. Compile errors, at the offending token, for: non-`async` methods; a receiver other than
/// `&self`; generic traits or methods; where clauses; argument patterns other than a plain identifier;
/// `impl Trait`; references, lifetimes (other than `'static`), `_` or `Self` in signatures; variadics;
/// `const`/`unsafe`/`extern` methods; default bodies; associated types, consts and macros; `#[cfg]` on
/// methods; methods named `new`, `with_options` or `client` (they'd clash with the client's own);
/// and two method names whose ids collide.
#[proc_macro_attribute]
pub fn service(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::service(attr.into(), item.into()).unwrap_or_else(syn::Error::into_compile_error).into()
}
