//! Bad input: a typed error, and the output and cache untouched.

use attn_kernels::{AttnError, AttnOptions, AttnScores, PagedAttnMetadata, SplitPolicy, paged_attention};
use kv_cache::{CacheGeometry, DType, LayerCache};

const SENTINEL: f32 = 12345.0;

fn cache(head_size: usize, block_size: usize) -> LayerCache {
    let g = CacheGeometry { num_blocks: 4, num_kv_heads: 2, head_size, block_size, dtype: DType::F16 };
    LayerCache::new(g).expect("cache")
}

/// Runs with the given pieces; asserts `out` kept its sentinel and returns the error.
fn fails(
    cache: &LayerCache,
    qsl: &[usize],
    lens: &[usize],
    tables: &[u32],
    mbps: usize,
    num_heads: usize,
    q_rows: usize,
) -> AttnError {
    let d = cache.head_size();
    let query = vec![0.5; q_rows * num_heads * d];
    let mut out = vec![SENTINEL; q_rows * num_heads * d];
    let meta = PagedAttnMetadata {
        query_start_loc: qsl,
        seq_lens: lens,
        block_tables: tables,
        max_blocks_per_seq: mbps,
        seq_rows: None,
    };
    let err =
        paged_attention(&AttnOptions::default(), &mut out, &query, cache, &meta, num_heads, 0.1).unwrap_err();
    assert!(out.iter().all(|&v| v == SENTINEL), "output written before the error {err}");
    err
}

#[test]
fn unsupported_head_and_block_sizes() {
    assert_eq!(fails(&cache(72, 16), &[0, 1], &[3], &[0], 1, 2, 1), AttnError::UnsupportedHeadSize(72));
    assert_eq!(fails(&cache(64, 4), &[0, 1], &[3], &[0], 1, 2, 1), AttnError::UnsupportedBlockSize(4));
}

#[test]
fn shape_mismatches() {
    let c = cache(64, 16);
    assert!(matches!(fails(&c, &[0, 1], &[3], &[0], 1, 3, 1), AttnError::HeadsNotDivisible { .. }));
    // query_start_loc says 2 tokens, buffers hold 1.
    assert!(matches!(fails(&c, &[0, 2], &[3], &[0], 1, 2, 1), AttnError::ShapeMismatch { .. }));
    // query_start_loc of the wrong length, not starting at 0, decreasing.
    assert!(matches!(fails(&c, &[0, 1, 1], &[3], &[0], 1, 2, 1), AttnError::ShapeMismatch { .. }));
    assert!(matches!(fails(&c, &[1, 1], &[3], &[0], 1, 2, 1), AttnError::InvalidQueryStartLoc(_)));
    assert!(matches!(fails(&c, &[0, 1, 0], &[3, 3], &[0, 1], 1, 2, 1), AttnError::InvalidQueryStartLoc(_)));
    // block table of the wrong size.
    assert!(matches!(fails(&c, &[0, 1], &[3], &[0, 1], 1, 2, 1), AttnError::ShapeMismatch { .. }));
}

#[test]
fn context_and_block_errors() {
    let c = cache(64, 16);
    // 40 tokens need 3 blocks; the table has 2.
    assert_eq!(
        fails(&c, &[0, 1], &[40], &[0, 1], 2, 2, 1),
        AttnError::ContextExceedsBlockTable { seq: 0, seq_len: 40, needed: 3, max_blocks_per_seq: 2 }
    );
    assert_eq!(
        fails(&c, &[0, 1], &[20], &[0, 4], 2, 2, 1),
        AttnError::BlockOutOfRange { block: 4, num_blocks: 4 }
    );
    assert_eq!(
        fails(&c, &[0, 5], &[4], &[0], 1, 2, 5),
        AttnError::QueryLongerThanContext { seq: 0, query_len: 5, seq_len: 4 }
    );
}

/// One sequence of 3 tokens, one query token, in block 0.
fn one_token_batch() -> PagedAttnMetadata<'static> {
    PagedAttnMetadata {
        query_start_loc: &[0, 1],
        seq_lens: &[3],
        block_tables: &[0],
        max_blocks_per_seq: 1,
        seq_rows: None,
    }
}

#[test]
fn bad_scale_and_partition() {
    let c = cache(64, 16);
    let meta = one_token_batch();
    let query = vec![0.5; 2 * 64];
    let mut out = vec![SENTINEL; 2 * 64];
    let err = paged_attention(&AttnOptions::default(), &mut out, &query, &c, &meta, 2, f32::NAN).unwrap_err();
    assert!(matches!(err, AttnError::NonFiniteScale(v) if v.is_nan()));
    let empty_window = AttnScores { scale: 0.1, sliding_window: Some(0) };
    assert_eq!(
        paged_attention(&AttnOptions::default(), &mut out, &query, &c, &meta, 2, empty_window).unwrap_err(),
        AttnError::ZeroWindow
    );
    let opts = AttnOptions { split: SplitPolicy::Always { partition_tokens: 24 }, ..AttnOptions::default() };
    assert_eq!(
        paged_attention(&opts, &mut out, &query, &c, &meta, 2, 0.1).unwrap_err(),
        AttnError::InvalidPartition(24, 16)
    );
    assert!(out.iter().all(|&v| v == SENTINEL));
}

#[test]
fn rows_outside_a_persistent_table_are_refused() {
    let c = cache(64, 16);
    // A persistent table of two rows of two blocks; the sequence names a third row.
    let base = PagedAttnMetadata {
        block_tables: &[0, 0, 1, 0],
        max_blocks_per_seq: 2,
        seq_rows: Some(&[2]),
        ..one_token_batch()
    };
    let query = vec![0.5; 2 * 64];
    let mut out = vec![SENTINEL; 2 * 64];
    let err = paged_attention(&AttnOptions::default(), &mut out, &query, &c, &base, 2, 0.1).unwrap_err();
    assert_eq!(err, AttnError::RowOutOfRange { seq: 0, row: 2, num_rows: 2 });
    let ragged = PagedAttnMetadata { block_tables: &[0, 0, 1], seq_rows: Some(&[0]), ..base };
    assert!(matches!(
        paged_attention(&AttnOptions::default(), &mut out, &query, &c, &ragged, 2, 0.1),
        Err(AttnError::ShapeMismatch { .. })
    ));
    let short = PagedAttnMetadata { seq_rows: Some(&[]), ..base };
    assert!(matches!(
        paged_attention(&AttnOptions::default(), &mut out, &query, &c, &short, 2, 0.1),
        Err(AttnError::ShapeMismatch { .. })
    ));
    assert!(out.iter().all(|&v| v == SENTINEL));
    let good = PagedAttnMetadata { seq_rows: Some(&[1]), ..base };
    assert!(paged_attention(&AttnOptions::default(), &mut out, &query, &c, &good, 2, 0.1).is_ok());
}
