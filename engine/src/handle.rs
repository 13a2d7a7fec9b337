//! `EngineHandle`: the engine on its own thread, driven by a command channel it drains between
//! steps. Cheap to clone, `Send + Sync`; a submission is checked and tokenized on the caller's
//! thread and never waits for a step. Each request gets a blocking `RequestStream` or an async
//! `OutputStream` (`futures::Stream`) of outputs; dropping either before it finished aborts
//! its request; `shutdown` drains or aborts cleanly.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::engine::{Engine, Intake, Prepared};
use crate::error::{EngineError, RequestError};
use crate::kv_map::{KvMapPublisher, KvMapShared, KvSnapshot};
use crate::metrics::{LiveMetrics, MetricsSnapshot};
use crate::output::{FinalOutput, RequestKey, RequestOutput};
use crate::request::{Prompt, RequestOptions};
use crate::sampling::SamplingParams;

/// What happens to unfinished requests at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Refuse new requests, finish the admitted ones, then stop.
    Drain,
    /// Abort every unfinished request (their streams get a final `Abort` output), then stop.
    Abort,
}

/// Why a stream ended without its final output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StreamError {
    #[error("engine step failed: {0}")]
    EngineFailed(String),
    #[error("the engine stopped before the request finished")]
    EngineStopped,
    /// The engine thread's half of admission refused the request (its first and last item).
    #[error(transparent)]
    Rejected(#[from] RequestError),
}

type StreamItem = Result<RequestOutput, StreamError>;

/// Where the engine thread sends one request's outputs: a blocking or an async receiver.
#[derive(Debug)]
enum Sink {
    Blocking(Sender<StreamItem>),
    Async(tokio::sync::mpsc::UnboundedSender<StreamItem>),
}

impl Sink {
    /// False once the receiver is gone.
    fn send(&self, item: StreamItem) -> bool {
        match self {
            Self::Blocking(tx) => tx.send(item).is_ok(),
            Self::Async(tx) => tx.send(item).is_ok(),
        }
    }
}

enum Command {
    /// A prepared request (checked, tokenized, id and waiting place reserved) and its sink;
    /// boxed: it is by far the largest command, and the channel's slots are sized by it.
    Add(Box<(Prepared, Sink)>),
    /// A stream was dropped before its end, or a client aborted: abort exactly this
    /// admission, never a later request that took over its id.
    AbortKey(RequestKey),
    /// A handle refused a request before it reached the engine (counted in the metrics).
    Rejected,
    Metrics(Reply<MetricsSnapshot>),
    Idle(Reply<bool>),
    /// Wakes an idle engine thread so it serves a KV-map request (the request itself is the
    /// counter in `KvMapShared`).
    KvMap,
    Shutdown(ShutdownMode),
}

/// A one-shot answer to a blocking or an async caller.
enum Reply<T> {
    Blocking(Sender<T>),
    Async(tokio::sync::oneshot::Sender<T>),
}

impl<T> Reply<T> {
    fn send(self, value: T) {
        match self {
            Self::Blocking(tx) => drop(tx.send(value)),
            Self::Async(tx) => drop(tx.send(value)),
        }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Add(sub) => write!(f, "Add({})", sub.0.id),
            Self::AbortKey(key) => write!(f, "AbortKey({})", key.0),
            Self::Rejected => f.write_str("Rejected"),
            Self::Metrics(_) => f.write_str("Metrics"),
            Self::Idle(_) => f.write_str("Idle"),
            Self::KvMap => f.write_str("KvMap"),
            Self::Shutdown(m) => write!(f, "Shutdown({m:?})"),
        }
    }
}

#[derive(Debug)]
struct Inner {
    tx: Sender<Command>,
    intake: Arc<Intake>,
    /// Set by `shutdown`: later submissions fail at once.
    stopping: AtomicBool,
    /// Written by the engine thread after every step.
    live: Arc<Mutex<LiveMetrics>>,
    /// KV-map requests and the snapshots that answer them.
    kv_map: Arc<KvMapShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
}

impl Inner {
    fn stop(&self, mode: ShutdownMode) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.tx.send(Command::Shutdown(mode));
        if let Some(thread) = self.thread.lock().take()
            && thread.join().is_err()
        {
            tracing::error!(target: "engine", "engine thread panicked");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop(ShutdownMode::Abort);
    }
}

/// A running engine shared across threads and tasks: cheap to clone, `Send + Sync`.
///
/// Submitting never waits for an engine step: the request is checked and tokenized on the
/// caller's thread, then queued for the engine thread, which takes new work between steps.
/// Outputs come back through a blocking [`RequestStream`] or an async [`OutputStream`].
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

impl EngineHandle {
    /// Moves `engine` onto its own thread.
    pub fn spawn(engine: Engine) -> Result<Self, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let intake = engine.intake().clone();
        let live = Arc::new(Mutex::new(engine.live_metrics()));
        let published = live.clone();
        let (kv_publisher, kv_map) = KvMapPublisher::new();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || EngineLoop::new(engine, published, kv_publisher).run(&rx))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                tx,
                intake,
                stopping: AtomicBool::new(false),
                live,
                kv_map,
                thread: Mutex::new(Some(thread)),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// What a request gets for every sampling field it leaves unset (vLLM's defaults with the
    /// model's generation config on top).
    pub fn default_sampling_params(&self) -> &SamplingParams {
        &self.inner.intake.default_params
    }

    /// The name clients use for the model.
    pub fn model_name(&self) -> &str {
        &self.inner.intake.model_name
    }

    /// Longest prompt + output of one request.
    pub fn max_model_len(&self) -> usize {
        self.inner.intake.max_model_len
    }

    pub fn tokenizer(&self) -> &model::Tokenizer {
        &self.inner.intake.tokenizer
    }

    pub fn chat_template(&self) -> Option<&model::ChatTemplate> {
        self.inner.intake.chat_template.as_ref()
    }

    /// Prompt to token ids, exactly as a submission would tokenize it.
    pub fn tokenize(&self, prompt: impl Into<Prompt>) -> Result<Vec<u32>, RequestError> {
        self.inner.intake.tokenize("tokenize", prompt.into())
    }

    /// Requests admitted and not yet scheduled (what `EngineConfig::max_waiting` bounds).
    pub fn num_waiting(&self) -> usize {
        self.inner.intake.num_waiting()
    }

    /// A fresh request id (`req-N`).
    pub fn next_request_id(&self) -> String {
        format!("req-{}", self.inner.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Submits a request under a generated id.
    pub fn add_request(
        &self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<RequestStream, RequestError> {
        self.add_request_with_id(self.next_request_id(), prompt, params)
    }

    /// Submits a request; admission errors come back here, outputs through the stream.
    pub fn add_request_with_id(
        &self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<RequestStream, RequestError> {
        self.add_request_with_options(id, prompt, params, RequestOptions::default())
    }

    /// [`EngineHandle::add_request_with_id`] with a priority and a prefix-cache salt.
    pub fn add_request_with_options(
        &self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        options: RequestOptions,
    ) -> Result<RequestStream, RequestError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ticket = self.submit_to(id.into(), prompt.into(), params, options, Sink::Blocking(tx))?;
        Ok(RequestStream { ticket, rx, done: false })
    }

    /// Submits many requests at once (they reach the engine before its next step, so they
    /// share their first batch); one admission result per request, in order.
    pub fn add_requests(
        &self,
        requests: Vec<(String, Prompt, SamplingParams)>,
    ) -> Vec<Result<RequestStream, RequestError>> {
        requests
            .into_iter()
            .map(|(id, prompt, params)| self.add_request_with_id(id, prompt, params))
            .collect()
    }

    /// The async submission: returns at once (no engine step is awaited) with a
    /// `futures::Stream` of the request's outputs; dropping it aborts the request. Fails at
    /// once with `RequestError::QueueFull` past `EngineConfig::max_waiting`.
    pub fn submit(
        &self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        options: RequestOptions,
    ) -> Result<OutputStream, RequestError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ticket = self.submit_to(id.into(), prompt.into(), params, options, Sink::Async(tx))?;
        Ok(OutputStream { ticket, rx, done: false })
    }

    /// Admission's caller-side half, then the hand-over to the engine thread.
    fn submit_to(
        &self,
        id: String,
        prompt: Prompt,
        params: SamplingParams,
        options: RequestOptions,
        sink: Sink,
    ) -> Result<Ticket, RequestError> {
        if self.inner.stopping.load(Ordering::Acquire) {
            return Err(RequestError::EngineStopped);
        }
        let prepared = self.inner.intake.prepare(id, prompt, params, options).inspect_err(|_| {
            let _ = self.inner.tx.send(Command::Rejected);
        })?;
        let (id, key) = (prepared.id.clone(), prepared.key);
        if let Err(crossbeam_channel::SendError(cmd)) =
            self.inner.tx.send(Command::Add(Box::new((prepared, sink))))
            && let Command::Add(sub) = cmd
        {
            self.inner.intake.release(&sub.0);
            return Err(RequestError::EngineStopped);
        }
        Ok(Ticket { id, key, tx: self.inner.tx.clone(), intake: self.inner.intake.clone() })
    }

    /// Aborts a request (its stream gets a final `Abort` output); unknown ids are reported.
    /// Does not wait: the id is free for a new request at once, and the engine frees the
    /// request's blocks at its next step boundary.
    pub fn abort(&self, id: &str) -> Result<(), RequestError> {
        let intake = &self.inner.intake;
        let key = intake.key_of(id).ok_or_else(|| RequestError::UnknownRequest(id.to_owned()))?;
        intake.forget(id, key);
        self.inner.tx.send(Command::AbortKey(key)).map_err(|_| RequestError::EngineStopped)
    }

    /// A metrics snapshot, taken by the engine thread between two steps (blocks until then).
    pub fn metrics(&self) -> Result<MetricsSnapshot, EngineError> {
        self.ask_blocking(Command::Metrics)
    }

    /// Gauges and token counters as of the engine's last step: never waits (what a metrics
    /// scrape reads).
    pub fn live_metrics(&self) -> LiveMetrics {
        *self.inner.live.lock()
    }

    /// [`EngineHandle::metrics`] for async callers: awaits the engine thread without blocking one.
    pub async fn metrics_async(&self) -> Result<MetricsSnapshot, EngineError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.tx.send(Command::Metrics(Reply::Async(tx))).map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Asks the engine thread for a [`KvSnapshot`] at its next step boundary (never waits; an
    /// idle engine is woken to take it). Returns the generation of the snapshot that answers:
    /// watch [`EngineHandle::kv_map_updates`] for one with at least that `generation`.
    pub fn request_kv_map(&self) -> Result<u64, EngineError> {
        let generation = self.inner.kv_map.request();
        self.inner.tx.send(Command::KvMap).map_err(|_| EngineError::Stopped)?;
        Ok(generation)
    }

    /// The last published [`KvSnapshot`], if any (never waits, asks for nothing).
    pub fn latest_kv_map(&self) -> Option<Arc<KvSnapshot>> {
        self.inner.kv_map.latest()
    }

    /// The channel the snapshots are published in (closed when the engine thread stops).
    pub fn kv_map_updates(&self) -> tokio::sync::watch::Receiver<Option<Arc<KvSnapshot>>> {
        self.inner.kv_map.subscribe()
    }

    /// A [`KvSnapshot`] taken at a step boundary after this call: asks for one and awaits it
    /// without blocking a thread. The engine never holds a step up for it; it is taken between
    /// two steps (or at once by an idle engine).
    pub async fn kv_map(&self) -> Result<Arc<KvSnapshot>, EngineError> {
        let mut updates = self.kv_map_updates();
        let generation = self.request_kv_map()?;
        let snapshot = updates
            .wait_for(|s| s.as_ref().is_some_and(|s| s.generation >= generation))
            .await
            .map_err(|_| EngineError::Stopped)?;
        snapshot.clone().ok_or(EngineError::Stopped)
    }

    /// Whether the engine holds no KV block at all (nothing running, nothing leaked).
    pub fn kv_is_idle(&self) -> Result<bool, EngineError> {
        self.ask_blocking(Command::Idle)
    }

    fn ask_blocking<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.tx.send(command(Reply::Blocking(tx))).map_err(|_| EngineError::Stopped)?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// Stops the engine thread (and waits for it). Later calls on any clone fail with
    /// `EngineStopped`.
    pub fn shutdown(&self, mode: ShutdownMode) {
        self.inner.stop(mode);
    }
}

/// The outputs of one request, in order; ends after the output marked `finished`.
#[derive(Debug)]
pub struct RequestStream {
    ticket: Ticket,
    rx: Receiver<StreamItem>,
    done: bool,
}

impl RequestStream {
    pub fn id(&self) -> &str {
        &self.ticket.id
    }

    /// The engine's key of this admission (outputs carry it as `request_key`).
    pub fn key(&self) -> RequestKey {
        self.ticket.key
    }

    /// Blocks for the next output; `None` once the final one was returned.
    pub fn recv(&mut self) -> Option<Result<RequestOutput, StreamError>> {
        if self.done {
            return None;
        }
        let item = self.rx.recv().unwrap_or(Err(StreamError::EngineStopped));
        self.done = is_last(&item);
        Some(item)
    }

    /// Like `recv`, giving up after `timeout` (`Ok(None)`: nothing yet).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<Result<Option<RequestOutput>, StreamError>> {
        if self.done {
            return None;
        }
        let item = match self.rx.recv_timeout(timeout) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) => return Some(Ok(None)),
            Err(RecvTimeoutError::Disconnected) => Err(StreamError::EngineStopped),
        };
        self.done = is_last(&item);
        Some(item.map(Some))
    }

    /// Waits for the end and folds every delta into the final result.
    pub fn collect_final(mut self) -> Result<FinalOutput, StreamError> {
        let mut fin = FinalOutput::new(self.ticket.id.clone(), 0);
        while let Some(item) = self.recv() {
            let out = item?;
            fin.prompt_tokens = out.prompt_tokens;
            fin.absorb(&out);
        }
        Ok(fin)
    }
}

/// One submitted request as its stream knows it, and how to abort it.
#[derive(Debug)]
struct Ticket {
    id: String,
    key: RequestKey,
    tx: Sender<Command>,
    intake: Arc<Intake>,
}

impl Ticket {
    /// Frees the id at once (so the client may reuse it right away) and has the engine abort
    /// exactly this admission.
    fn abort(&self) {
        self.intake.forget(&self.id, self.key);
        let _ = self.tx.send(Command::AbortKey(self.key));
    }
}

/// Whether a stream item is its request's last (the final output, or an error).
fn is_last(item: &StreamItem) -> bool {
    item.as_ref().map_or(true, |o| o.finished)
}

impl Iterator for RequestStream {
    type Item = Result<RequestOutput, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.ticket.abort();
        }
    }
}

/// The async twin of [`RequestStream`]: a `futures::Stream` of one request's outputs, ending
/// after the output marked `finished` (or an error). Dropping it before the end aborts the
/// request; its blocks are freed at the engine's next step boundary.
#[derive(Debug)]
pub struct OutputStream {
    ticket: Ticket,
    rx: tokio::sync::mpsc::UnboundedReceiver<StreamItem>,
    done: bool,
}

impl OutputStream {
    pub fn id(&self) -> &str {
        &self.ticket.id
    }

    pub fn key(&self) -> RequestKey {
        self.ticket.key
    }

    /// The next output; `None` once the final one was returned.
    pub async fn recv(&mut self) -> Option<Result<RequestOutput, StreamError>> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item.unwrap_or(Err(StreamError::EngineStopped)),
        };
        self.done = is_last(&item);
        Poll::Ready(Some(item))
    }
}

impl futures_core::Stream for OutputStream {
    type Item = Result<RequestOutput, StreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}

impl Drop for OutputStream {
    fn drop(&mut self) {
        if !self.done {
            self.ticket.abort();
        }
    }
}

/// The engine thread's state: the engine and the stream of each live request, by admission
/// key (an id string can name two requests in a row: an aborted one whose final output is
/// still to come, and its successor).
struct EngineLoop {
    engine: Engine,
    streams: HashMap<RequestKey, Sink>,
    draining: bool,
    /// Where `live_metrics` reads from; written after every step.
    published: Arc<Mutex<LiveMetrics>>,
    /// Publishes a KV map between steps when a handle asked for one.
    kv_map: KvMapPublisher,
}

impl EngineLoop {
    fn new(engine: Engine, published: Arc<Mutex<LiveMetrics>>, kv_map: KvMapPublisher) -> Self {
        Self { engine, streams: HashMap::new(), draining: false, published, kv_map }
    }

    fn run(mut self, rx: &Receiver<Command>) {
        let mut stop = false;
        while !stop {
            // Idle: block for work. Busy: take whatever arrived, then step.
            if !self.engine.has_unfinished() {
                if self.draining {
                    return;
                }
                match rx.recv() {
                    Ok(cmd) => stop = self.handle(cmd),
                    Err(_) => return, // every handle and stream is gone
                }
            }
            while !stop && let Ok(cmd) = rx.try_recv() {
                stop = self.handle(cmd);
            }
            // Only a step changes what is published: a pass without one handled commands that
            // either start work (a step follows) or leave the books as they were.
            if !stop && self.engine.has_unfinished() {
                self.step();
                *self.published.lock() = self.engine.live_metrics_of_last_step();
            }
            // Between steps: a KV map, only if one was asked for (else one atomic load).
            self.kv_map.publish_if_asked(&self.engine);
        }
        // Abort shutdown: deliver the abort outputs.
        self.step();
    }

    /// Applies one command; true means "stop now".
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(sub) => {
                let (prepared, sink) = *sub;
                if self.draining {
                    self.engine.intake().release(&prepared);
                    sink.send(Err(StreamError::EngineStopped));
                } else {
                    match self.engine.insert(prepared) {
                        Ok(key) => drop(self.streams.insert(key, sink)),
                        Err(e) => drop(sink.send(Err(e.into()))),
                    }
                }
            }
            Command::AbortKey(key) => {
                // Already finished is fine: the stream was dropped after the engine's last output.
                let _ = self.engine.abort_key(key);
            }
            Command::Rejected => self.engine.record_rejected(),
            Command::Metrics(reply) => reply.send(self.engine.metrics()),
            Command::Idle(reply) => reply.send(self.engine.kv_is_idle()),
            Command::KvMap => {} // served after the commands, by `publish_if_asked`
            Command::Shutdown(ShutdownMode::Drain) => self.draining = true,
            Command::Shutdown(ShutdownMode::Abort) => {
                for id in self.engine.unfinished_ids() {
                    let _ = self.engine.abort(&id);
                }
                return true;
            }
        }
        false
    }

    fn step(&mut self) {
        match self.engine.step() {
            Ok(outputs) => {
                for out in outputs {
                    let finished = out.finished;
                    let key = out.request_key;
                    let delivered = self.streams.get(&key).is_some_and(|s| s.send(Ok(out)));
                    if finished {
                        self.streams.remove(&key);
                    } else if !delivered {
                        // Nobody listens any more: stop spending compute on it.
                        let _ = self.engine.abort_key(key);
                        self.streams.remove(&key);
                    }
                }
            }
            Err(e) => {
                tracing::error!(target: "engine", "step failed: {e}; aborting every request");
                let msg = e.to_string();
                for (_, stream) in self.streams.drain() {
                    stream.send(Err(StreamError::EngineFailed(msg.clone())));
                }
                for id in self.engine.unfinished_ids() {
                    let _ = self.engine.abort(&id);
                }
                // Drop the abort outputs: their streams already got the error.
                let _ = self.engine.step();
            }
        }
    }
}
