//! `EngineHandle`: the engine on its own thread, driven by a command channel it drains between
//! steps. Cheap to clone, `Send + Sync`; a submission is checked and tokenized on the caller's
//! thread and never waits for a step. Each request gets a blocking `RequestStream` or an async
//! `OutputStream` (`futures::Stream`) of outputs; dropping either before it finished aborts
//! its request; `shutdown` drains or aborts cleanly.
//!
//! Three concerns, one file each: this file is the caller's side (the handle and the commands
//! it sends), `streams.rs` what a caller receives a request's outputs through, and
//! `engine_loop.rs` the engine thread that executes the commands between steps.

mod engine_loop;
mod streams;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::engine::{Engine, Intake, Prepared};
use crate::error::{EngineError, RequestError};
use crate::kv_map::{KvMapPublisher, KvMapShared, KvSnapshot};
use crate::metrics::{LiveMetrics, MetricsSnapshot};
use crate::output::{RequestKey, Sink};
use crate::request::{Prompt, RequestOptions};
use crate::sampling::{IntoValidParams, SamplingParams};

use engine_loop::EngineLoop;
use streams::Ticket;
pub use streams::{AbortHandle, OutputStream, RequestStream};

/// What happens to unfinished requests at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Refuse new requests, finish the admitted ones, then stop.
    Drain,
    /// Abort every unfinished request (their streams get a final `Abort` output), then stop.
    Abort,
}

/// What a handle (or a stream) asks of the engine thread.
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
    CachedBlockHashes(Reply<(Vec<u64>, Vec<u64>)>),
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
            Self::CachedBlockHashes(_) => f.write_str("CachedBlockHashes"),
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
    /// The KV events publisher's addresses, fixed when the engine was built.
    kv_events: Option<(String, Option<String>)>,
    thread: Mutex<Option<JoinHandle<()>>>,
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
        let kv_events = engine.kv_events_endpoints();
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
                kv_events,
                thread: Mutex::new(Some(thread)),
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

    /// The scheduling policy: under FCFS a request's priority means nothing.
    pub fn policy(&self) -> crate::Policy {
        self.inner.intake.policy
    }

    pub fn tokenizer(&self) -> &model::Tokenizer {
        &self.inner.intake.tokenizer
    }

    /// The LoRA adapters requests may name (load, unload, list), usable from any thread.
    pub fn loras(&self) -> &crate::LoraRegistry {
        &self.inner.intake.lora
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

    /// A fresh request id (`req-N`, N from the engine's one key counter).
    pub fn next_request_id(&self) -> String {
        format!("req-{}", self.inner.intake.issue_key().0)
    }

    /// Submits a request under a generated id.
    pub fn add_request(
        &self,
        prompt: impl Into<Prompt>,
        params: impl IntoValidParams,
    ) -> Result<RequestStream, RequestError> {
        self.add_request_with_id(self.next_request_id(), prompt, params)
    }

    /// Submits a request; admission errors come back here, outputs through the stream.
    pub fn add_request_with_id(
        &self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: impl IntoValidParams,
    ) -> Result<RequestStream, RequestError> {
        self.add_request_with_options(id, prompt, params, RequestOptions::default())
    }

    /// [`EngineHandle::add_request_with_id`] with a priority and a prefix-cache salt.
    pub fn add_request_with_options(
        &self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: impl IntoValidParams,
        options: RequestOptions,
    ) -> Result<RequestStream, RequestError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ticket = self.submit_to(id.into(), prompt.into(), params, options, Sink::Blocking(tx))?;
        Ok(RequestStream::new(ticket, rx))
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
        params: impl IntoValidParams,
        options: RequestOptions,
    ) -> Result<OutputStream, RequestError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ticket = self.submit_to(id.into(), prompt.into(), params, options, Sink::Async(tx))?;
        Ok(OutputStream::new(ticket, rx))
    }

    /// Admission's caller-side half, then the hand-over to the engine thread.
    fn submit_to(
        &self,
        id: String,
        prompt: Prompt,
        params: impl IntoValidParams,
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

    /// The KV events publisher's PUB and replay addresses (see [`Engine::kv_events_endpoints`]).
    pub fn kv_events_endpoints(&self) -> Option<(String, Option<String>)> {
        self.inner.kv_events.clone()
    }

    /// The block hashes of the device prefix cache and of the host swap space between two
    /// steps (see [`Engine::cached_block_hashes`], [`Engine::host_block_hashes`]); blocks until then.
    pub fn cached_block_hashes(&self) -> Result<(Vec<u64>, Vec<u64>), EngineError> {
        self.ask_blocking(Command::CachedBlockHashes)
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
