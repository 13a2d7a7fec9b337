//! Integration tests of `block-alloc`: exact-order tests of the free queue and eviction,
//! bad-input (all-or-nothing) tests, swap plans, and the model-based property test.

mod bad_input;
mod exact_order;
mod model_based;
mod support;
mod swap;
