//! Integration tests of `block-alloc`: exact-order tests and the model-based property test.
