//! Criterion benchmarks of the block allocator hot paths (group `block_alloc`).
use criterion::{Criterion, criterion_group, criterion_main};

fn placeholder(c: &mut Criterion) {
    let _ = c;
}

criterion_group!(block_alloc, placeholder);
criterion_main!(block_alloc);
