//! Gemma 3 270M past its 512-token sliding window: a ~1 500-token prompt against llama.cpp's
//! greedy continuation (`tests/data/gemma3-270m-long.json`, made by
//! `tests/data/make_gemma3_long_golden.py`), prefilled in one step and in chunks whose edges fall
//! across the window's, side by side in one batch with decoding.

use model::Model;

use crate::gemma3::{TOP5_TOL, golden_file, ids};
use crate::harness::{Seq, argmax, assign_blocks, build_batch, cache_for};

/// Prefill chunk sizes run side by side: the whole prompt at once; 384 (the second chunk's
/// queries see keys on both sides of its start, and the window's lower edge passes through
/// the first chunk); 200 (not a multiple of the 16-token block, so chunks and windows start
/// mid-block).
const CHUNKS: [usize; 3] = [usize::MAX, 384, 200];

/// How sequence `i` prefills, for messages.
fn how(i: usize) -> String {
    match CHUNKS[i] {
        usize::MAX => "one-step prefill".to_owned(),
        n => format!("prefill in chunks of {n}"),
    }
}

#[test]
fn a_prompt_past_the_sliding_window_continues_as_llama_cpp_s() {
    let model = Model::load(&model::testing::gemma3_gguf_for_tests()).expect("load");
    let golden = golden_file("gemma3-270m-long.json");
    let prompt = ids(&golden["prompt_ids"]);
    let expected = ids(&golden["output_ids"]);
    let window =
        model.config.layer_attention.iter().filter_map(|l| l.sliding_window).max().expect("a window");
    assert!(
        prompt.len() > 2 * window,
        "the prompt ({} tokens) should run well past the window",
        prompt.len()
    );

    let block_size = 16;
    let capacity = prompt.len() + expected.len();
    let per_seq = capacity.div_ceil(block_size);
    let pool: Vec<u32> = (0..(per_seq * CHUNKS.len()) as u32).rev().collect();
    let mut seqs: Vec<Seq> = assign_blocks(vec![prompt.clone(); CHUNKS.len()], capacity, block_size, &pool);
    let mut cache = cache_for(&model.config, block_size, pool.len());
    let mut ws = model::Workspace::default();
    let vocab = model.config.vocab_size;
    let mut produced = vec![0usize; CHUNKS.len()];
    let mut worst = 0.0f32;
    while produced.iter().any(|&n| n < expected.len()) {
        // Each sequence advances by its next prefill chunk, or by one token once it decodes.
        let chunks: Vec<usize> = seqs
            .iter()
            .zip(&CHUNKS)
            .zip(&produced)
            .map(
                |((s, &chunk), &n)| {
                    if n < expected.len() { (s.tokens.len() - s.cached).min(chunk) } else { 0 }
                },
            )
            .collect();
        let batch = build_batch(&seqs, &chunks, block_size, false);
        let logits = model.forward(&batch.input(), &mut cache, &mut ws).expect("forward");
        let scheduled = (0..seqs.len()).filter(|&i| chunks[i] > 0);
        for (row, i) in logits.chunks_exact(vocab).zip(scheduled) {
            let seq = &mut seqs[i];
            seq.cached += chunks[i];
            if seq.cached < seq.tokens.len() {
                continue; // mid-prefill: this row predicts a prompt token
            }
            let step = produced[i];
            if step == 0 {
                for pair in golden["first_step_top5"].as_array().expect("top 5") {
                    let id = pair[0].as_u64().expect("id") as usize;
                    let want = pair[1].as_f64().expect("logit") as f32;
                    let diff = (row[id] - want).abs();
                    worst = worst.max(diff);
                    assert!(diff <= TOP5_TOL, "{}: logit of {id}: {} vs llama.cpp's {want}", how(i), row[id]);
                }
            }
            let got = argmax(row);
            assert_eq!(got, expected[step], "{}: token {step} differs from llama.cpp's", how(i));
            seq.tokens.push(got);
            produced[i] += 1;
        }
    }
    eprintln!(
        "gemma3-270m, {}-token prompt: largest first-step top-5 logit difference from llama.cpp: {worst:.2e}",
        prompt.len()
    );
}
