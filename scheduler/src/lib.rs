//! `scheduler`: continuous batching — queues, token budget, chunked prefill, preemption.
//!
//! vLLM V1-style: every `schedule()` builds one step under a token budget and a sequence cap —
//! running decodes first, then partial prefills, then swapped and waiting requests, prefills
//! chunked to fit — over a `block_alloc::BlockPool`. Prefix-cache hits count as computed
//! tokens. Memory pressure preempts the worst-keyed running request (recompute or swap).
//! Requests with `n > 1` share their prompt blocks by fork; divergence copies on write.
//! `update()` applies the sampled tokens. The `sim` crate runs it on traces with a cost model.
//!
//! A step's `SchedulerOutput` names each sequence's row of the worker's persistent block table and
//! carries only the ids that row lacks (`rows.rs`), so a decode step costs O(1) per sequence
//! rather than a copy of its whole table.
//!
//! `kv_map.rs`: [`KvMap`], a between-steps snapshot of the pools (a state byte per block), the
//! running and swapped tables and the counters, for a live view of the cache.

mod config;
mod draft;
mod emit;
mod error;
mod fit;
mod group;
mod kv_map;
mod output;
mod preempt;
mod queue;
mod request;
mod rows;
mod schedule;
mod scheduler;
mod tables;
mod update;

pub use block_alloc::{BlockId, BlockPool, BlockState, PoolConfig};
pub use config::{MAX_KV_GROUPS, Policy, PreemptionMode, SchedulerConfig};
pub use error::SchedulerError;
pub use fit::{ExceedsPool, GroupFit, RequestFit, blocks_for_request, max_new_tokens_within};
pub use kv_map::{KvCounters, KvMap, KvTable};
pub use output::{FinishedSeq, SampledToken, ScheduledSeq, SchedulerOutput, StepResult};
pub use request::{Request, RequestKey, SeqFinish, SeqId, TokenId};
pub use scheduler::{Scheduler, SchedulerStats};
pub use tables::{GroupWindows, SeqTables, group_salt};
