//! `block-alloc`: physical KV blocks — pool, free queue, ref counts, block tables, copy-on-write, prefix cache.
