//! The capacity simulator ("KV cache calculator"): runs a request trace through the real
//! scheduler and allocator (paged) or through contiguous-reservation baselines, with a cost
//! model instead of a model, and measures KV utilization and concurrency over time.

pub mod buddy;
pub mod compare;
pub mod contiguous;
pub mod cost;
pub mod metrics;
pub mod paged;
pub mod trace;

pub use buddy::Buddy;
pub use compare::{Comparison, compare};
pub use contiguous::{ContiguousConfig, FirstFit, Placement, Reservation, simulate_contiguous};
pub use cost::{CostModel, Hardware, ModelShape};
pub use metrics::{Recorder, SimReport, StepSample};
pub use paged::{SimSetup, simulate_paged};
pub use trace::{Trace, TraceError, TraceRequest, TraceShape};
