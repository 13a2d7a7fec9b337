//! The engine thread: `EngineLoop` owns the `Engine`, applies the handles' commands between
//! steps and steps while anything is unfinished. Each request's stream is in its record, so
//! the engine's outputs reach their streams without passing through here.

use std::sync::Arc;

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use super::{Command, ShutdownMode};
use crate::engine::Engine;
use crate::kv_map::KvMapPublisher;
use crate::metrics::LiveMetrics;
use crate::output::StreamError;

/// The engine thread's state: the engine and what it publishes between steps.
pub(super) struct EngineLoop {
    engine: Engine,
    draining: bool,
    /// Where `live_metrics` reads from; written after every step.
    published: Arc<Mutex<LiveMetrics>>,
    /// Publishes a KV map between steps when a handle asked for one.
    kv_map: KvMapPublisher,
}

impl EngineLoop {
    pub(super) fn new(engine: Engine, published: Arc<Mutex<LiveMetrics>>, kv_map: KvMapPublisher) -> Self {
        Self { engine, draining: false, published, kv_map }
    }

    pub(super) fn run(mut self, rx: &Receiver<Command>) {
        let mut stop = false;
        while !stop {
            // Idle: block for work. Busy: take whatever arrived, then step.
            let mut handled = false;
            if !self.engine.has_unfinished() {
                if self.draining {
                    return;
                }
                match rx.recv() {
                    Ok(cmd) => (stop, handled) = (self.handle(cmd), true),
                    Err(_) => return, // every handle and stream is gone
                }
            }
            while !stop && let Ok(cmd) = rx.try_recv() {
                (stop, handled) = (self.handle(cmd), true);
            }
            if !stop && self.engine.has_unfinished() {
                self.step();
                *self.published.lock() = self.engine.live_metrics_of_last_step();
            } else if !stop && handled {
                // Commands finished work without a step (aborts of every request, refusals):
                // the published gauges must not stay those of the last step.
                *self.published.lock() = self.engine.live_metrics_now();
            }
            // Between steps: a KV map, only if one was asked for (else one atomic load).
            self.kv_map.publish_if_asked(&self.engine);
        }
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
                    // A refusal reaches the stream through its sink.
                    let _ = self.engine.insert(prepared, Some(sink));
                }
            }
            Command::AbortKey(key) => {
                // Already finished is fine: the stream was dropped after the engine's last output.
                let _ = self.engine.abort_key(key);
            }
            Command::Rejected => self.engine.record_rejected(),
            Command::Metrics(reply) => reply.send(self.engine.metrics()),
            Command::Idle(reply) => reply.send(self.engine.kv_is_idle()),
            Command::CachedBlockHashes(reply) => {
                reply.send((self.engine.cached_block_hashes(), self.engine.host_block_hashes()))
            }
            Command::KvMap => {} // served after the commands, by `publish_if_asked`
            Command::Shutdown(ShutdownMode::Drain) => self.draining = true,
            Command::Shutdown(ShutdownMode::Abort) => {
                // Each stream gets its final `Abort` output at once.
                self.engine.abort_all();
                return true;
            }
        }
        false
    }

    /// One step; every request here has a stream, so the outputs went there and none come back.
    fn step(&mut self) {
        if let Err(e) = self.engine.step() {
            tracing::error!(target: "engine", "step failed: {e}; aborting every request");
            self.engine.fail_all(&StreamError::EngineFailed(e.to_string()));
        }
    }
}
