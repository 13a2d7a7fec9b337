//! `sim`: the capacity simulator ("KV cache calculator" behind `cargo xtask plan`): runs a
//! request trace through the real scheduler and allocator (paged) or through contiguous-reservation baselines, with a cost
//! model instead of a model, and measures KV utilization and concurrency over time.
//!
//! Modelling choices, checked against the PagedAttention paper (§6.1, Fig. 2 and 13):
//! - Traces (`trace`): log-normal input and output lengths with the datasets' means (ShareGPT
//!   161 / 338), heavy-tailed (ShareGPT output p50 ≈ 216, p99 ≈ 1 900) and cut so input + output
//!   fits the model's max length; Poisson arrivals.
//! - Paged (`paged`): the real `Scheduler` and `block-alloc` pool. Like vLLM's block manager it
//!   admits a waiting request only when its whole remaining prompt fits above the watermark,
//!   and on memory pressure preempts the latest arrival (recompute).
//! - KV cache groups (`groups`): a model with sliding-window layers runs the engine's hybrid
//!   layout (a table per group, blocks freed as they leave a window), its memory counted in
//!   the smaller blocks of that layout.
//! - Cluster sizing (`cluster`): a replica's capacity is the highest Poisson rate at which its
//!   normalized latency (seconds per output token, the paper's metric) stays under a bound;
//!   a target rate needs its ceiling in replicas, checked by simulating one replica's share.
//! - Baselines (`contiguous`): Orca with iteration-level batching, each request reserving for
//!   its whole lifetime — Max: `max_model_len`; Pow2: the prompt plus the next power of two of
//!   the output; Oracle: the true length — placed by a buddy allocator as the paper assumes,
//!   so every reservation is rounded to a power of two. First fit over exact sizes
//!   (`Placement::FirstFit`) is a stronger baseline than the paper's and is reported beside it.

pub mod buddy;
pub mod cluster;
pub mod compare;
pub mod contiguous;
pub mod cost;
pub mod groups;
pub mod metrics;
pub mod paged;
pub mod trace;

pub use buddy::Buddy;
pub use cluster::{ClusterError, ClusterPlan, ReplicaCapacity, plan_cluster, replica_capacity};
pub use compare::{Comparison, compare};
pub use contiguous::{ContiguousConfig, FirstFit, Placement, Reservation, simulate_contiguous};
pub use cost::{CostModel, Hardware, ModelShape};
pub use groups::KvGroups;
pub use metrics::{Recorder, SimReport, StepSample};
pub use paged::{SimSetup, simulate_paged};
pub use trace::{Trace, TraceError, TraceRequest, TraceShape};
