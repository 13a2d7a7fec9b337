//! `kv-cache`: device memory for the KV cache — dtypes, devices, the per-layer K/V tensors in vLLM layout, sizing, swap space.
