//! Engine integration tests over a tiny random Llama: request lifecycle and bad input,
//! batch invariance, seeded sampling, parallel samples, and the threaded handle.

mod basics;
mod device;
mod handle;
mod invariance;
mod options;
mod support;
