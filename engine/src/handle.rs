//! `EngineHandle`: the engine on its own thread, driven by a crossbeam command channel.
//! Cheap to clone, `Send + Sync`; each request gets a `RequestStream` of outputs. Dropping
//! a stream before it finished aborts its request; `shutdown` drains or aborts cleanly.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::engine::Engine;
use crate::error::{EngineError, RequestError};
use crate::metrics::MetricsSnapshot;
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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("engine step failed: {0}")]
    EngineFailed(String),
    #[error("the engine stopped before the request finished")]
    EngineStopped,
}

type StreamItem = Result<RequestOutput, StreamError>;

/// A request on its way to the engine thread (boxed in [`Command`]: it is by far the largest
/// command, and the channel's slots are sized by the largest variant).
struct Submission {
    id: String,
    prompt: Prompt,
    params: SamplingParams,
    options: RequestOptions,
    stream: Sender<StreamItem>,
    reply: Sender<Result<RequestKey, RequestError>>,
}

/// A submission sent to the engine thread, its admission still to come.
struct Pending {
    id: String,
    rx: Receiver<StreamItem>,
    reply: Receiver<Result<RequestKey, RequestError>>,
    sent: bool,
}

enum Command {
    Add(Box<Submission>),
    Abort {
        id: String,
        reply: Option<Sender<Result<(), RequestError>>>,
    },
    /// A stream was dropped before its end: abort exactly its admission, never a later
    /// request that took over its id.
    AbortKey(RequestKey),
    Metrics(Sender<MetricsSnapshot>),
    Idle(Sender<bool>),
    Shutdown(ShutdownMode),
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Add(sub) => write!(f, "Add({})", sub.id),
            Self::Abort { id, .. } => write!(f, "Abort({id})"),
            Self::AbortKey(key) => write!(f, "AbortKey({})", key.0),
            Self::Metrics(_) => f.write_str("Metrics"),
            Self::Idle(_) => f.write_str("Idle"),
            Self::Shutdown(m) => write!(f, "Shutdown({m:?})"),
        }
    }
}

#[derive(Debug)]
struct Inner {
    tx: Sender<Command>,
    /// The engine's `default_sampling_params`, readable without a round trip.
    default_params: SamplingParams,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
}

impl Inner {
    fn stop(&self, mode: ShutdownMode) {
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

/// A running engine shared across threads.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

impl EngineHandle {
    /// Moves `engine` onto its own thread.
    pub fn spawn(engine: Engine) -> Result<Self, EngineError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let default_params = engine.default_sampling_params().clone();
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || EngineLoop::new(engine).run(&rx))
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                tx,
                default_params,
                thread: Mutex::new(Some(thread)),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// What a request gets for every sampling field it leaves unset (vLLM's defaults with the
    /// model's generation config on top).
    pub fn default_sampling_params(&self) -> &SamplingParams {
        &self.inner.default_params
    }

    /// Submits a request under a generated id.
    pub fn add_request(
        &self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
    ) -> Result<RequestStream, RequestError> {
        let id = format!("req-{}", self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        self.add_request_with_id(id, prompt, params)
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
        let pending = self.send(id.into(), prompt.into(), params, options);
        self.admitted(pending)
    }

    /// Submits many requests at once (they reach the engine before its next step, so they
    /// share their first batch); one admission result per request, in order.
    pub fn add_requests(
        &self,
        requests: Vec<(String, Prompt, SamplingParams)>,
    ) -> Vec<Result<RequestStream, RequestError>> {
        let pending: Vec<Pending> = requests
            .into_iter()
            .map(|(id, prompt, params)| self.send(id, prompt, params, RequestOptions::default()))
            .collect();
        pending.into_iter().map(|p| self.admitted(p)).collect()
    }

    /// Sends one submission without waiting for its admission.
    fn send(&self, id: String, prompt: Prompt, params: SamplingParams, options: RequestOptions) -> Pending {
        let (stream, rx) = crossbeam_channel::unbounded();
        let (reply, reply_rx) = crossbeam_channel::bounded(1);
        let sub = Submission { id: id.clone(), prompt, params, options, stream, reply };
        let sent = self.inner.tx.send(Command::Add(Box::new(sub))).is_ok();
        Pending { id, rx, reply: reply_rx, sent }
    }

    /// Waits for a sent submission's admission.
    fn admitted(&self, p: Pending) -> Result<RequestStream, RequestError> {
        if !p.sent {
            return Err(RequestError::EngineStopped);
        }
        let key = p.reply.recv().map_err(|_| RequestError::EngineStopped)??;
        Ok(RequestStream { id: p.id, key, rx: p.rx, tx: self.inner.tx.clone(), done: false })
    }

    /// Aborts a request (its stream gets a final `Abort` output); unknown ids are reported.
    pub fn abort(&self, id: &str) -> Result<(), RequestError> {
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        self.inner
            .tx
            .send(Command::Abort { id: id.to_owned(), reply: Some(reply_tx) })
            .map_err(|_| RequestError::EngineStopped)?;
        reply_rx.recv().map_err(|_| RequestError::EngineStopped)?
    }

    pub fn metrics(&self) -> Result<MetricsSnapshot, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.tx.send(Command::Metrics(tx)).map_err(|_| EngineError::Stopped)?;
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// Whether the engine holds no KV block at all (nothing running, nothing leaked).
    pub fn kv_is_idle(&self) -> Result<bool, EngineError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.inner.tx.send(Command::Idle(tx)).map_err(|_| EngineError::Stopped)?;
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
    id: String,
    key: RequestKey,
    rx: Receiver<StreamItem>,
    tx: Sender<Command>,
    done: bool,
}

impl RequestStream {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The engine's key of this admission (outputs carry it as `request_key`).
    pub fn key(&self) -> RequestKey {
        self.key
    }

    /// Blocks for the next output; `None` once the final one was returned.
    pub fn recv(&mut self) -> Option<Result<RequestOutput, StreamError>> {
        if self.done {
            return None;
        }
        let item = self.rx.recv().unwrap_or(Err(StreamError::EngineStopped));
        self.done = item.as_ref().map_or(true, |o| o.finished);
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
        self.done = item.as_ref().map_or(true, |o| o.finished);
        Some(item.map(Some))
    }

    /// Waits for the end and folds every delta into the final result.
    pub fn collect_final(mut self) -> Result<FinalOutput, StreamError> {
        let mut fin = FinalOutput::new(self.id.clone(), 0);
        while let Some(item) = self.recv() {
            let out = item?;
            fin.prompt_tokens = out.prompt_tokens;
            fin.absorb(&out);
        }
        Ok(fin)
    }
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
            let _ = self.tx.send(Command::AbortKey(self.key));
        }
    }
}

/// The engine thread's state: the engine and the stream of each live request, by admission
/// key (an id string can name two requests in a row: an aborted one whose final output is
/// still to come, and its successor).
struct EngineLoop {
    engine: Engine,
    streams: HashMap<RequestKey, Sender<StreamItem>>,
    draining: bool,
}

impl EngineLoop {
    fn new(engine: Engine) -> Self {
        Self { engine, streams: HashMap::new(), draining: false }
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
            if !stop && self.engine.has_unfinished() {
                self.step();
            }
        }
        // Abort shutdown: deliver the abort outputs.
        self.step();
    }

    /// Applies one command; true means "stop now".
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(sub) => {
                let Submission { id, prompt, params, options, stream, reply } = *sub;
                let result = if self.draining {
                    Err(RequestError::EngineStopped)
                } else {
                    self.engine.add_request_with_options(id.clone(), prompt, params, options)
                };
                if let Ok(key) = result {
                    self.streams.insert(key, stream);
                }
                let _ = reply.send(result);
            }
            Command::Abort { id, reply } => {
                let result = self.engine.abort(&id);
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
            Command::AbortKey(key) => {
                // Already finished is fine: the stream was dropped after the engine's last output.
                let _ = self.engine.abort_key(key);
            }
            Command::Metrics(reply) => {
                let _ = reply.send(self.engine.metrics());
            }
            Command::Idle(reply) => {
                let _ = reply.send(self.engine.kv_is_idle());
            }
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
                    let delivered = self.streams.get(&key).is_some_and(|s| s.send(Ok(out)).is_ok());
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
                    let _ = stream.send(Err(StreamError::EngineFailed(msg.clone())));
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
