//! The live KV map of the engine: [`KvSnapshot`] (the scheduler's [`KvMap`] plus each table's
//! request id) and how the engine thread publishes one between steps, only when asked.
//!
//! A subscriber bumps a request counter ([`KvMapShared::request`]); the engine thread compares
//! it with the generation it last served after every step (one atomic load: an engine nobody
//! watches pays nothing else), takes a snapshot when they differ, and publishes it in a
//! `tokio::sync::watch` channel. The snapshot's buffers are reused whenever no reader still
//! holds the previous one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use scheduler::{BlockState, KvCounters, KvMap, KvTable};

use crate::engine::Engine;

/// The engine's block pools as of one step boundary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvSnapshot {
    /// Which request (of [`KvMapShared::request`]) this snapshot answers: it was taken after
    /// that request was made. 0 for a snapshot taken directly with [`Engine::kv_snapshot_into`].
    pub generation: u64,
    pub map: KvMap,
    /// The client id of each of `map.tables`' requests (same index).
    pub request_ids: Vec<String>,
}

impl Engine {
    /// Fills `out` (reusing its buffers) with the scheduler's [`KvMap`] and the tables'
    /// request ids. Call between steps.
    pub fn kv_snapshot_into(&self, out: &mut KvSnapshot) {
        self.scheduler().kv_map_into(&mut out.map);
        let n = out.map.tables.len();
        out.request_ids.truncate(n);
        out.request_ids.resize_with(n, String::new);
        for (id, table) in out.request_ids.iter_mut().zip(&out.map.tables) {
            id.clear();
            if let Some(name) = self.request_id_of(table.request) {
                id.push_str(name);
            }
        }
    }

    /// A fresh [`KvSnapshot`] (see [`Engine::kv_snapshot_into`]).
    pub fn kv_snapshot(&self) -> KvSnapshot {
        let mut out = KvSnapshot::default();
        self.kv_snapshot_into(&mut out);
        out
    }
}

/// What handles share with the engine thread: the generation asked for and the channel the
/// snapshots arrive in.
#[derive(Debug)]
pub(crate) struct KvMapShared {
    requested: AtomicU64,
    rx: tokio::sync::watch::Receiver<Option<Arc<KvSnapshot>>>,
}

impl KvMapShared {
    /// Asks for a snapshot at the next step boundary; returns the generation that will answer.
    pub(crate) fn request(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn latest(&self) -> Option<Arc<KvSnapshot>> {
        self.rx.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<Arc<KvSnapshot>>> {
        self.rx.clone()
    }
}

/// The engine thread's half: publishes a snapshot when one was asked for since the last.
#[derive(Debug)]
pub(crate) struct KvMapPublisher {
    shared: Arc<KvMapShared>,
    served: u64,
    tx: tokio::sync::watch::Sender<Option<Arc<KvSnapshot>>>,
    /// The previous snapshot's buffers, when no reader kept it.
    spare: Option<KvSnapshot>,
}

impl KvMapPublisher {
    pub(crate) fn new() -> (Self, Arc<KvMapShared>) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let shared = Arc::new(KvMapShared { requested: AtomicU64::new(0), rx });
        (Self { shared: shared.clone(), served: 0, tx, spare: None }, shared)
    }

    /// Between steps: takes and publishes a snapshot if one was asked for (else one load).
    pub(crate) fn publish_if_asked(&mut self, engine: &Engine) {
        let wanted = self.shared.requested.load(Ordering::Acquire);
        if wanted == self.served {
            return;
        }
        self.served = wanted;
        let mut snapshot = self.spare.take().unwrap_or_default();
        engine.kv_snapshot_into(&mut snapshot);
        snapshot.generation = wanted;
        let previous = self.tx.send_replace(Some(Arc::new(snapshot)));
        self.spare = previous.and_then(|p| Arc::try_unwrap(p).ok());
    }
}
