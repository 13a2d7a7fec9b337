//! `paged_attention` against `reference::paged_attention` over random shapes, plus dtype
//! cross-checks and chunked-prefill equivalence.
//!
//! Tolerances: a kernel and the reference read the same (narrowed) cache values — for int8 the
//! dequantized `code · scale` — so every dtype is held to f32 accumulation error:
//! `|got - want| <= 2e-4 + 2e-4·|want|` (f64 reference). Narrow caches against an f32 cache of
//! the same data: f16 `5e-3`, bf16 and int8 `4e-2` absolute (values in [-1, 1]; bf16 keeps 8
//! mantissa bits, f16 11; int8 steps of max |v| / 127 per key group or value head).

use attn_kernels::{
    AttnOptions, AttnScores, Isa, PagedAttnMetadata, SplitPolicy, paged_attention, reference,
    reshape_and_cache,
};
use kv_cache::{CacheGeometry, DType, LayerCache};
use proptest::prelude::*;

use crate::support::{Batch, assert_close, slots_of};

const ABS: f32 = 2e-4;
const REL: f32 = 2e-4;

fn head_sizes() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![64usize, 80, 96, 112, 128, 256])
}

fn block_sizes() -> impl Strategy<Value = usize> {
    prop::sample::select(vec![8usize, 16, 32])
}

fn dtypes() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![DType::F32, DType::F16, DType::BF16, DType::Int8])
}

/// Context lengths: mostly short (edge cases around block boundaries), some past 2 000.
fn context_len() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..70, 1 => 1usize..2200]
}

fn options() -> impl Strategy<Value = AttnOptions> {
    let split = prop_oneof![
        Just(SplitPolicy::Auto),
        Just(SplitPolicy::Never),
        (1usize..6).prop_map(|k| SplitPolicy::Always { partition_tokens: 32 * k }),
    ];
    // Every instruction set; one this CPU lacks runs the portable kernels (still checked).
    let isa = prop::sample::select(Isa::ALL.to_vec());
    (isa, split).prop_map(|(isa, split)| AttnOptions { isa, split })
}

/// Decode-only batches: every sequence has one query token.
fn decode_batch() -> impl Strategy<Value = Batch> {
    (
        1usize..4,
        prop::sample::select(vec![1usize, 2, 4, 8]),
        head_sizes(),
        block_sizes(),
        prop::collection::vec(context_len(), 1..5),
        any::<u64>(),
    )
        .prop_map(|(num_kv_heads, group, head_size, block_size, ctxs, seed)| Batch {
            num_kv_heads,
            group,
            head_size,
            block_size,
            seqs: ctxs.into_iter().map(|c| (c, 1)).collect(),
            seed,
        })
}

/// Mixed batches: prefill chunks over a cached prefix, decodes, and idle sequences.
fn mixed_batch() -> impl Strategy<Value = Batch> {
    let seq = (context_len(), 0usize..40, 0u8..4).prop_map(|(ctx, q, kind)| match kind {
        0 => (ctx, 1),           // decode
        1 => (ctx, ctx.min(40)), // (tail of a) prefill
        2 => (ctx, q.min(ctx)),  // chunk over a cached prefix, possibly empty
        _ => (ctx, q.clamp(1, ctx)),
    });
    batches(prop::sample::select(vec![1usize, 2, 3, 4, 8]), seq)
}

/// Batches of 1–3 sequences drawn from `seq`, 1–2 kv heads, `group` query heads per kv head,
/// every head and block size.
fn batches(
    group: impl Strategy<Value = usize>,
    seq: impl Strategy<Value = (usize, usize)>,
) -> impl Strategy<Value = Batch> {
    (1usize..3, group, head_sizes(), block_sizes(), prop::collection::vec(seq, 1..4), any::<u64>()).prop_map(
        |(num_kv_heads, group, head_size, block_size, seqs, seed)| Batch {
            num_kv_heads,
            group,
            head_size,
            block_size,
            seqs,
            seed,
        },
    )
}

/// Prefill-shaped batches for the tiled kernel: up to three sequences, each a chunk of 2..300
/// tokens over a cached prefix of 0..300 (so chunks start inside blocks and runs cross the
/// kernel's 256-key steps), GQA groups 1 to 8.
fn prefill_batch() -> impl Strategy<Value = Batch> {
    let seq = (2usize..300, prop_oneof![1 => Just(0usize), 2 => 0usize..300])
        .prop_map(|(q, cached)| (cached + q, q));
    batches(1usize..=8, seq)
}

fn run_both(batch: &Batch, dtype: DType, opts: &AttnOptions) -> (Vec<f32>, Vec<f32>) {
    run_windowed(batch, dtype, opts, None)
}

/// Sliding windows: one key, around a block or a partition, or longer than most contexts.
fn windows() -> impl Strategy<Value = usize> {
    prop_oneof![prop::sample::select(vec![1usize, 7, 16, 31, 32, 33, 100, 257]), 1usize..400]
}

fn run_windowed(
    batch: &Batch,
    dtype: DType,
    opts: &AttnOptions,
    window: Option<usize>,
) -> (Vec<f32>, Vec<f32>) {
    let scores = AttnScores { scale: batch.scale(), sliding_window: window };
    let built = batch.build();
    let cache = batch.cache(&built, dtype);
    let meta = built.meta();
    let mut got = vec![f32::NAN; built.query.len()];
    let mut want = vec![f32::NAN; built.query.len()];
    paged_attention(opts, &mut got, &built.query, &cache, &meta, batch.num_heads(), scores).expect("kernel");
    reference::paged_attention(&mut want, &built.query, &cache, &meta, batch.num_heads(), scores)
        .expect("reference");
    (got, want)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn decode_matches_reference(batch in decode_batch(), dtype in dtypes(), opts in options()) {
        let (got, want) = run_both(&batch, dtype, &opts);
        assert_close(&got, &want, ABS, REL, &format!("{dtype} {opts:?}"));
    }

    /// The tiled prefill kernel on every instruction set this CPU runs (AVX2 forced on an
    /// AVX-512 machine, and the portable loops) against the f64 reference.
    #[test]
    fn prefill_matches_reference_on_every_isa(batch in prefill_batch(), dtype in dtypes()) {
        for isa in Isa::available() {
            let (got, want) = run_both(&batch, dtype, &AttnOptions { isa, split: SplitPolicy::Auto });
            assert_close(&got, &want, ABS, REL, &format!("{dtype} {isa:?}"));
        }
    }

    /// Decodes (split or not) and chunks over a cached prefix with a sliding window: blocks
    /// before a window are skipped, keys before it inside a block masked, on every ISA.
    #[test]
    fn windowed_batches_match_reference(
        batch in prop_oneof![mixed_batch(), prefill_batch()],
        window in windows(),
        dtype in dtypes(),
        opts in options(),
    ) {
        let (got, want) = run_windowed(&batch, dtype, &opts, Some(window));
        assert_close(&got, &want, ABS, REL, &format!("{dtype} {opts:?} window {window}"));
    }

    #[test]
    fn mixed_batches_match_reference(batch in mixed_batch(), dtype in dtypes(), opts in options()) {
        let (got, want) = run_both(&batch, dtype, &opts);
        assert_close(&got, &want, ABS, REL, &format!("{dtype} {opts:?}"));
    }
}

/// The batch's dense tables moved into shuffled rows of a larger persistent table (the shape
/// the engine keeps between steps), the rows nobody reads poisoned with out-of-range ids.
fn persistent_rows(tables: &[u32], stride: usize, num_seqs: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let num_rows = num_seqs + 3;
    let mut rows: Vec<u32> = (0..num_rows as u32).collect();
    rows.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    rows.truncate(num_seqs);
    let mut persistent = vec![u32::MAX; num_rows * stride];
    for (s, &r) in rows.iter().enumerate() {
        persistent[r as usize * stride..][..stride].copy_from_slice(&tables[s * stride..][..stride]);
    }
    (persistent, rows)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Sequences reading their rows of a persistent table (`seq_rows`) get bit-identical output
    /// to the same batch with a dense `[num_seqs, stride]` table.
    #[test]
    fn persistent_table_rows_read_like_a_dense_table(batch in mixed_batch(), opts in options()) {
        let built = batch.build();
        let cache = batch.cache(&built, DType::F32);
        let dense = built.meta();
        let (persistent, rows) =
            persistent_rows(&built.metadata.block_tables, built.metadata.max_blocks_per_seq, batch.seqs.len(), batch.seed);
        let by_row = PagedAttnMetadata { block_tables: &persistent, seq_rows: Some(&rows), ..dense };
        let mut a = vec![f32::NAN; built.query.len()];
        let mut b = vec![f32::NAN; built.query.len()];
        paged_attention(&opts, &mut a, &built.query, &cache, &dense, batch.num_heads(), batch.scale())
            .expect("dense");
        paged_attention(&opts, &mut b, &built.query, &cache, &by_row, batch.num_heads(), batch.scale())
            .expect("rows");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&a), bits(&b));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn narrow_caches_track_the_f32_cache(batch in mixed_batch()) {
        let opts = AttnOptions::default();
        let (f32_out, _) = run_both(&batch, DType::F32, &opts);
        for (dtype, tol) in [(DType::F16, 5e-3), (DType::BF16, 4e-2), (DType::Int8, 4e-2)] {
            let built = batch.build();
            let cache = batch.cache(&built, dtype);
            let mut got = vec![0.0; built.query.len()];
            paged_attention(&opts, &mut got, &built.query, &cache, &built.meta(), batch.num_heads(), batch.scale()).expect("kernel");
            assert_close(&got, &f32_out, tol, 0.0, &format!("{dtype} vs f32"));
        }
    }

    /// A prompt prefilled in random chunks (each chunk written, then attended over the cached
    /// prefix plus itself) gives what one whole-prompt prefill gives.
    #[test]
    fn chunked_prefill_equals_whole_prefill(
        len in 2usize..300,
        cuts in prop::collection::vec(1usize..300, 0..5),
        head_size in head_sizes(),
        block_size in block_sizes(),
        group in 1usize..=8,
        seed in any::<u64>(),
    ) {
        let batch = Batch { num_kv_heads: 2, group, head_size, block_size, seqs: vec![(len, len)], seed };
        let built = batch.build();
        let (num_heads, d) = (batch.num_heads(), head_size);
        let whole_cache = batch.cache(&built, DType::F32);
        let mut whole = vec![0.0; built.query.len()];
        reference::paged_attention(&mut whole, &built.query, &whole_cache, &built.meta(), num_heads, batch.scale()).expect("reference");

        let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % len).filter(|&c| c > 0).collect();
        bounds.extend([0, len]);
        bounds.sort_unstable();
        bounds.dedup();
        let geometry = CacheGeometry { num_blocks: built.num_blocks, num_kv_heads: 2, head_size, block_size, dtype: DType::F32 };
        let mut cache = LayerCache::new(geometry).expect("cache");
        cache.fill(f32::NAN);
        let mut chunked = vec![f32::NAN; built.query.len()];
        let row = 2 * d;
        for w in bounds.windows(2) {
            let (a, b) = (w[0], w[1]);
            let slots = slots_of(&built, 0, block_size, a..b);
            reshape_and_cache(&built.keys[0][a * row..b * row], &built.values[0][a * row..b * row], &slots, &mut cache).expect("write");
            let qsl = [0, b - a];
            let lens = [b];
            let meta = PagedAttnMetadata { query_start_loc: &qsl, seq_lens: &lens, ..built.meta() };
            let q = &built.query[a * num_heads * d..b * num_heads * d];
            paged_attention(&AttnOptions::default(), &mut chunked[a * num_heads * d..b * num_heads * d], q, &cache, &meta, num_heads, batch.scale()).expect("kernel");
        }
        assert_close(&chunked, &whole, ABS, REL, "chunked vs whole");
    }
}

/// Huge logits (scale 1e3) must not overflow: the softmax subtracts the running max.
#[test]
fn softmax_is_safe_for_huge_logits() {
    for seqs in [vec![(700, 1), (33, 1)], vec![(300, 37)]] {
        let batch = Batch { num_kv_heads: 1, group: 2, head_size: 64, block_size: 16, seqs, seed: 9 };
        let built = batch.build();
        let cache = batch.cache(&built, DType::F32);
        for split in [SplitPolicy::Never, SplitPolicy::Always { partition_tokens: 64 }] {
            let opts = AttnOptions { isa: Isa::detected(), split };
            let mut got = vec![0.0; built.query.len()];
            let mut want = vec![0.0; built.query.len()];
            paged_attention(&opts, &mut got, &built.query, &cache, &built.meta(), 2, 1e3).expect("kernel");
            reference::paged_attention(&mut want, &built.query, &cache, &built.meta(), 2, 1e3)
                .expect("reference");
            assert_close(&got, &want, 1e-3, 0.0, "huge logits");
        }
    }
}

/// Every instruction set and both decode paths agree on one long context (> 2 000 tokens).
#[test]
fn long_context_paths_agree() {
    let batch =
        Batch { num_kv_heads: 2, group: 4, head_size: 128, block_size: 16, seqs: vec![(4133, 1)], seed: 3 };
    let built = batch.build();
    let cache = batch.cache(&built, DType::BF16);
    let mut want = vec![0.0; built.query.len()];
    reference::paged_attention(&mut want, &built.query, &cache, &built.meta(), 8, batch.scale())
        .expect("reference");
    for isa in Isa::available() {
        for split in [SplitPolicy::Auto, SplitPolicy::Never, SplitPolicy::Always { partition_tokens: 512 }] {
            let mut got = vec![0.0; built.query.len()];
            paged_attention(
                &AttnOptions { isa, split },
                &mut got,
                &built.query,
                &cache,
                &built.meta(),
                8,
                batch.scale(),
            )
            .expect("kernel");
            assert_close(&got, &want, ABS, REL, &format!("{isa:?} {split:?}"));
        }
    }
}
