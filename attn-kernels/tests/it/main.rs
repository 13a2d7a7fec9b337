//! Integration tests of attn-kernels: property tests against the naive `reference`, dtype
//! cross-checks, chunked-prefill equivalence, block copy/swap round trips and bad-input errors.

mod attention;
mod block_ops;
mod errors;
mod support;
