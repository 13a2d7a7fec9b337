//! `kv-events`: the KV cache's changes published in vLLM's wire format, for prefix-aware routers.
//!
//! - [`KvEventsConfig`]: vLLM's `--kv-events-config` (`enable_kv_cache_events`, `publisher`,
//!   `endpoint`, `replay_endpoint`, `buffer_steps`, `hwm`, `max_queue_size`, `topic`).
//! - [`KvEventBatch`]: one engine step's [`block_alloc::CacheEvent`]s with their [`Medium`],
//!   encoded as vLLM's `KVEventBatch` (msgpack, array-like tagged structs; see `encode.rs`).
//! - [`KvEventPublisher`]: vLLM's `ZmqEventPublisher` — PUB frames `(topic, seq: u64 big-endian,
//!   payload)`, a ROUTER replay socket answering an 8-byte start sequence number with every
//!   buffered batch from there and an end marker `(-1, "")`; the engine thread never blocks.
//!
//! Block hashes: a published hash is the low 64 bits of the pool's chained 128-bit hash
//! ([`block_alloc::external_block_hash`]), the integer form vLLM publishes by default
//! (`int.from_bytes(hash[-8:])`). It is unique among one replica's cached blocks but seeded per
//! process, as vLLM's is without a fixed `PYTHONHASHSEED`, so a router cannot recompute it from
//! tokens: it matches a prompt by walking `(parent_block_hash, token_ids)` from `BlockStored`.

mod config;
mod encode;
mod publisher;

pub use config::KvEventsConfig;
pub use encode::{KvEventBatch, Medium};
pub use publisher::{END_SEQ, KvEventPublisher};

/// What can go wrong configuring or starting a publisher.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// `--kv-events-config` is not valid; the message names the field.
    #[error("--kv-events-config: {0}")]
    Config(String),
    /// A socket could not be bound or connected.
    #[error("--kv-events-config: cannot open {endpoint}: {reason}")]
    Socket { endpoint: String, reason: String },
}
