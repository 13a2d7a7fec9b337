//! `attn-kernels`: kernels over the paged KV layout — write-to-cache, paged attention, copy/swap (CPU; CUDA behind `cuda`).
