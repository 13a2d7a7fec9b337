//! Integration tests of attn-kernels against the naive reference.
