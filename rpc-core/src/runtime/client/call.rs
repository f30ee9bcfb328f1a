//! A call in progress: [`Client::call_since`] starts it at once and returns a [`CallFuture`] that
//! holds only what waiting for its answer needs.
//!
//! Written as an `async fn`, the call kept every argument and local of its start (the payload,
//! the metadata, the deadline, the permit's wait) in its future across its one await: 496 bytes,
//! which a caller moves each time it spawns a call or pushes it into a `FuturesUnordered`, and
//! which the generated stub's future wrapped again. Started synchronously, the call's future
//! holds its end report, its connection and its slot. The one start that must wait (every
//! in-flight permit taken) keeps the rest of the start in a box until a permit comes.
//!
//! [`Client::call_since`] is called from the `async` bodies of [`Client::call_with_info`] and of
//! the generated stubs, so a call is still sent at its future's first poll, not when it is made.

use std::task::ready;

use super::*;

/// What [`Client::call_since`] returns: resolves to the call's response (or error).
pub(crate) struct CallFuture<'a> {
    finish: Finish,
    state: CallState<'a>,
}

enum CallState<'a> {
    /// Every in-flight permit was taken: the rest of the start, waiting for one (boxed: rare).
    Permit(Pin<Box<dyn Future<Output = Result<Running<'a>, CallError>> + Send + 'a>>),
    /// Sent; waiting for its answer.
    Running(Running<'a>),
    /// Ended before it was sent (boxed: a `CallError` is 48 bytes, the other states at most 32).
    Failed(Box<CallError>),
    /// Its result was returned.
    Done,
}

/// One of a connection's in-flight permits, given back when dropped.
struct Permit<'a>(ConnRef<'a>);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.in_flight.release();
    }
}

/// A call that was sent. Dropped before it took its result, it gives back its slot and is
/// cancelled if still in progress (the driver is told, and tells the server). Queueing that
/// command never blocks (beyond a short lock) and spawns nothing.
struct Running<'a> {
    permit: Permit<'a>,
    call_id: u64,
    /// The call's task drives the connection: it stops when the call ends.
    driving: bool,
    /// Its start left the connection armed ([`Conn::start_here`]): the first poll needs no
    /// pass unless a wake-up came since.
    start_armed: bool,
    /// Not answered yet.
    armed: bool,
}

impl Running<'_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(CallResult, tokio::time::Instant)> {
        let start_armed = std::mem::take(&mut self.start_armed);
        let answer = ready!(self.permit.0.poll_call(self.call_id, self.driving, start_armed, cx));
        self.armed = false;
        Poll::Ready(answer)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let conn = &self.permit.0;
        if self.armed && conn.slots.abandon(self.call_id) {
            let _ = conn.commands.send(Command::Cancel { call_id: self.call_id });
        }
        if self.driving {
            // Wake-ups go to the driver task again (with one this task did not handle).
            conn.route.caller_done(self.call_id);
        }
        // Then the permit goes back.
    }
}

/// Reports a call's end once: by [`Finish::report`], or as cancelled when its future is dropped
/// first.
struct Finish {
    span: tracing::Span,
    name: MethodName,
    request_bytes: usize,
    started: tokio::time::Instant,
    reported: bool,
}

impl Finish {
    /// Reports the call's end at `ended`.
    fn report(&mut self, result: &CallResult, ended: tokio::time::Instant) {
        self.reported = true;
        let elapsed = observe::Elapsed::between(self.started, Some(ended));
        observe::client_call_done(&self.span, self.name, self.request_bytes, elapsed, result);
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if !self.reported {
            let elapsed = observe::Elapsed::between(self.started, None);
            observe::client_call_dropped(&self.span, self.name, self.request_bytes, elapsed);
        }
    }
}

impl Future for CallFuture<'_> {
    type Output = CallResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CallResult> {
        let this = &mut *self;
        if let CallState::Permit(start) = &mut this.state {
            this.state = match ready!(start.as_mut().poll(cx)) {
                Ok(running) => CallState::Running(running),
                Err(e) => CallState::Failed(Box::new(e)),
            };
        }
        let (result, ended) = match &mut this.state {
            CallState::Running(call) => {
                let (result, at) = ready!(call.poll(cx));
                (result, Some(at))
            }
            _ => match std::mem::replace(&mut this.state, CallState::Done) {
                CallState::Failed(e) => (Err(*e), None),
                _ => panic!("a call's future was polled after it returned"),
            },
        };
        // The call's permit goes back, and its task stops driving the connection.
        this.state = CallState::Done;
        // A call that ended before it was sent reads the clock; one the driver answered takes
        // its reading.
        this.finish.report(&result, ended.unwrap_or_else(tokio::time::Instant::now));
        Poll::Ready(result)
    }
}

impl Client {
    /// Calls `method` (named `name` in spans, events and metrics), the deadline counting from
    /// `started` (the generated stubs pass the moment they were called, so encoding the
    /// arguments counts). A call whose deadline has passed before it is sent is not sent.
    ///
    /// The call starts here (see the module docs): call this from the `async` body that awaits it.
    pub(crate) fn call_since<'a>(
        &'a self,
        started: tokio::time::Instant,
        method: MethodId,
        name: MethodName,
        payload: Payload,
        opts: &CallOptions,
    ) -> CallFuture<'a> {
        // The span is not entered around the wait (nothing logs inside it): its fields and the
        // end event carry the call's identity, at no cost when it is disabled.
        let span = tracing::debug_span!(
            "call",
            method = %name,
            call_id = Empty,
            peer = %self.shared.peer,
            trace_id = Empty,
        );
        let finish = Finish { span, name, request_bytes: payload.len(), started, reported: false };
        let state = match self.start_call(&finish.span, started, method, payload, opts) {
            Ok(state) => state,
            Err(e) => CallState::Failed(Box::new(e)),
        };
        CallFuture { finish, state }
    }

    /// Takes an in-flight permit and sends the call; if every permit is taken, the rest waits
    /// for one (bounded by the deadline) in the returned state.
    fn start_call<'a>(
        &'a self,
        span: &tracing::Span,
        started: tokio::time::Instant,
        method: MethodId,
        payload: Payload,
        opts: &CallOptions,
    ) -> Result<CallState<'a>, CallError> {
        let metadata = metadata_with_trace(opts, span)?;
        let conn = self.conn();
        if conn.commands.is_closed() {
            return Err(self.not_connected());
        }
        // No reading of the clock here: the driver measures the time left as it starts the
        // call, and does not send one whose deadline has passed (encoding a call's arguments
        // took longer, say).
        let deadline = opts.deadline.or(self.shared.default_deadline);
        if deadline == Some(Duration::ZERO) {
            return Err(CallError::DeadlineExceeded);
        }
        // `Permit` gives it back.
        if conn.in_flight.try_acquire() {
            // A permit free now: no future to build (no timer either).
            let call = self.send(Permit(conn), span, method, payload, metadata, started, deadline)?;
            Ok(CallState::Running(call))
        } else {
            let span = span.clone();
            Ok(CallState::Permit(Box::pin(async move {
                let acquire = conn.in_flight.acquire();
                // One too far away to be a point in time (`Duration::MAX`) is none.
                match deadline.and_then(|d| started.checked_add(d)) {
                    Some(at) => {
                        tokio::time::timeout_at(at, acquire).await.map_err(|_| CallError::DeadlineExceeded)?
                    }
                    None => acquire.await,
                }
                self.send(Permit(conn), &span, method, payload, metadata, started, deadline)
            })))
        }
    }

    /// Sends a call that holds `permit`: started in this task when the connection has no other
    /// call (this task then drives it), else queued for the driver.
    #[allow(clippy::too_many_arguments)]
    fn send<'a>(
        &self,
        permit: Permit<'a>,
        span: &tracing::Span,
        method: MethodId,
        payload: Payload,
        metadata: Bytes,
        started: tokio::time::Instant,
        deadline: Option<Duration>,
    ) -> Result<Running<'a>, CallError> {
        let conn = &permit.0;
        let Some(call_id) = conn.slots.open() else { return Err(self.not_connected()) };
        // A disabled span would still look the field up by name (about 60 instructions a call).
        if !span.is_disabled() {
            span.record("call_id", call_id);
        }
        let command = Command::Call { call_id, method, payload, metadata, started, deadline };
        // Alone on the connection, the call is started here and this task drives it.
        let (driving, start_armed) = match conn.start_here(command) {
            Ok(armed) => (true, armed),
            Err(command) => {
                if conn.commands.send(command).is_err() {
                    conn.slots.abandon(call_id);
                    return Err(self.not_connected());
                }
                (false, false)
            }
        };
        Ok(Running { permit, call_id, driving, start_armed, armed: true })
    }
}
