//! Several services on one server: a [`Router`] is a [`Service`] that dispatches each request to
//! the service that has its method id.
//!
//! ```
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! #[rpc_core::service]
//! pub trait Users {
//!     async fn name(&self, id: u64) -> String;
//! }
//! #[rpc_core::service]
//! pub trait Orders {
//!     async fn count(&self, user: u64) -> u64;
//! }
//! # struct U; impl Users for U { async fn name(&self, id: u64) -> String { id.to_string() } }
//! # struct O; impl Orders for O { async fn count(&self, _user: u64) -> u64 { 0 } }
//!
//! let router = rpc_core::Router::new().add_service(UsersServer::new(U))?.add_service(OrdersServer::new(O))?;
//! let server = rpc_core::Server::bind("tcp://127.0.0.1:0", Default::default(), router).await?;
//! # server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! Method ids hash the service's name with the method's signature, so services with different
//! names never share one in practice; two that do (the same service added twice, or a 32-bit
//! hash collision) are refused by [`Router::add_service`] with a [`RouteCollision`] naming both methods.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use rpc_transport::Received;

use crate::error::ServiceError;
use crate::future_slot::{FutureSlot, ServiceFuture};
use crate::proto::MethodId;
use crate::service::{unknown_method, MethodDesc, Service};

/// Dispatches by method id to the services added to it. Serve it like any service.
#[derive(Default)]
pub struct Router {
    services: Vec<Arc<dyn Service>>,
    /// Method id to index in `services`, sorted by id (a binary search per call).
    routes: Vec<(MethodId, usize)>,
    methods: Vec<MethodDesc>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.services.iter().map(|s| s.name()).collect();
        f.debug_struct("Router").field("services", &names).finish_non_exhaustive()
    }
}

/// Two services added to one [`Router`] have a method id in common.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("method `{second}` has the id {id:#010x} of `{first}`, already routed: rename one of them")]
pub struct RouteCollision {
    /// The shared id.
    pub id: MethodId,
    /// The method already routed (`"Service.method"`).
    pub first: &'static str,
    /// The method being added.
    pub second: &'static str,
}

impl Router {
    /// A router with no service.
    pub fn new() -> Self {
        Router::default()
    }

    /// Adds `service`, or refuses it (nothing added) if one of its method ids is already routed.
    pub fn add_service<S: Service>(mut self, service: S) -> Result<Self, RouteCollision> {
        let index = self.services.len();
        let mut own: Vec<(MethodId, &'static str)> = Vec::new();
        for m in service.methods() {
            let routed = self.route(m.id).map(|i| self.full_name(i, m.id));
            let first = routed.or_else(|| own.iter().find(|(id, _)| *id == m.id).map(|(_, name)| *name));
            if let Some(first) = first {
                return Err(RouteCollision { id: m.id, first, second: m.full_name });
            }
            own.push((m.id, m.full_name));
        }
        self.methods.extend_from_slice(service.methods());
        self.routes.extend(own.into_iter().map(|(id, _)| (id, index)));
        self.routes.sort_unstable_by_key(|(id, _)| *id);
        self.services.push(Arc::new(service));
        Ok(self)
    }

    /// The index of the service that has `method`.
    fn route(&self, method: MethodId) -> Option<usize> {
        self.routes.binary_search_by_key(&method, |(id, _)| *id).ok().map(|i| self.routes[i].1)
    }

    fn full_name(&self, index: usize, id: MethodId) -> &'static str {
        let methods = self.services[index].methods();
        methods.iter().find(|m| m.id == id).map_or("?", |m| m.full_name)
    }
}

impl Service for Router {
    fn name(&self) -> &'static str {
        "router"
    }

    fn methods(&self) -> &[MethodDesc] {
        &self.methods
    }

    fn call(&self, method: MethodId, payload: Received) -> BoxFuture<'static, Result<Bytes, ServiceError>> {
        match self.route(method) {
            Some(i) => self.services[i].call(method, payload),
            None => unknown_method("router", method, crate::service::Boxed),
        }
    }

    fn call_in(&self, method: MethodId, payload: Received, slot: FutureSlot<'_>) -> ServiceFuture {
        match self.route(method) {
            Some(i) => self.services[i].call_in(method, payload, slot),
            None => unknown_method("router", method, slot),
        }
    }
}
