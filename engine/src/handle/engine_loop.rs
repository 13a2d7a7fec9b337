//! The engine thread: `EngineLoop` owns the `Engine`, applies the handles' commands between
//! steps, steps while anything is unfinished, and routes each output to its request's stream.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use super::streams::{Sink, StreamError};
use super::{Command, ShutdownMode};
use crate::engine::Engine;
use crate::kv_map::KvMapPublisher;
use crate::metrics::LiveMetrics;
use crate::output::RequestKey;

/// The engine thread's state: the engine and the stream of each live request, by admission
/// key (an id string can name two requests in a row: an aborted one whose final output is
/// still to come, and its successor).
pub(super) struct EngineLoop {
    engine: Engine,
    streams: HashMap<RequestKey, Sink>,
    draining: bool,
    /// Where `live_metrics` reads from; written after every step.
    published: Arc<Mutex<LiveMetrics>>,
    /// Publishes a KV map between steps when a handle asked for one.
    kv_map: KvMapPublisher,
}

impl EngineLoop {
    pub(super) fn new(engine: Engine, published: Arc<Mutex<LiveMetrics>>, kv_map: KvMapPublisher) -> Self {
        Self { engine, streams: HashMap::new(), draining: false, published, kv_map }
    }

    pub(super) fn run(mut self, rx: &Receiver<Command>) {
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
