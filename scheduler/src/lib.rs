//! `scheduler`: continuous batching — queues, token budget, chunked prefill, preemption, and the capacity simulator.
