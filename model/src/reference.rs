//! A naive full-sequence forward pass with no KV cache: plain loops, causal softmax in f64.
//! Written for clarity, not speed; tests compare the paged forward pass against it.

use crate::llama::{LayerWeights, Llama, RopeStyle};

fn matvec_t(x: &[f32], w: &[f32], n: usize) -> Vec<f32> {
    let k = x.len();
    (0..n)
        .map(|j| {
            x.iter().zip(&w[j * k..(j + 1) * k]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
                as f32
        })
        .collect()
}

fn rms(x: &[f32], w: &[f32], eps: f64) -> Vec<f32> {
    let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(&v, &g)| (f64::from(v) * inv) as f32 * g).collect()
}

/// RoPE on one head in the model's pair order, angles computed from scratch per call.
fn rope(head: &mut [f32], pos: usize, inv_freq: &[f64], style: RopeStyle) {
    let half = head.len() / 2;
    for (i, &freq) in inv_freq.iter().enumerate().take(half) {
        let (s, c) = (pos as f64 * freq).sin_cos();
        let (ia, ib) = match style {
            RopeStyle::RotateHalf => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (a, b) = (f64::from(head[ia]), f64::from(head[ib]));
        head[ia] = (a * c - b * s) as f32;
        head[ib] = (b * c + a * s) as f32;
    }
}

/// Logits `[tokens.len(), vocab]` for every position of one sequence starting at position 0.
pub fn forward_full(model: &Llama, tokens: &[u32]) -> Vec<f32> {
    let c = &model.config;
    let (h, d, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let inter = c.intermediate_size;
    let inv_freq = model.rope_inv_freq();
    let group = nh / nkv;
    // Every weight dequantized up front: the oracle computes in plain f32/f64 loops.
    let dense = |w: &attn_kernels::cpu::quant::Weight| Ok::<_, ()>(w.to_f32());
    let layers: Vec<LayerWeights<Vec<f32>>> =
        model.layers.iter().map(|l| l.try_map(dense).expect("dequantizing cannot fail")).collect();
    let embed = model.embed.to_f32();
    let mut xs: Vec<Vec<f32>> =
        tokens.iter().map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec()).collect();
    let style = model.rope_style;
    for lw in &layers {
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let n = rms(x, &lw.input_norm, c.rms_norm_eps);
            let qkv = matvec_t(&n, &lw.qkv, c.qkv_size());
            let mut q = qkv[..nh * d].to_vec();
            let mut k = qkv[nh * d..(nh + nkv) * d].to_vec();
            q.chunks_mut(d).for_each(|hd| rope(hd, pos, &inv_freq, style));
            k.chunks_mut(d).for_each(|hd| rope(hd, pos, &inv_freq, style));
            qs.push(q);
            ks.push(k);
            vs.push(qkv[(nh + nkv) * d..].to_vec());
        }
        let scale = 1.0 / (d as f64).sqrt();
        for (i, x) in xs.iter_mut().enumerate() {
            let mut attn = vec![0.0f32; nh * d];
            for head in 0..nh {
                let kvh = head / group;
                let q = &qs[i][head * d..(head + 1) * d];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let k = &ks[j][kvh * d..(kvh + 1) * d];
                        q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for dd in 0..d {
                    let v: f64 = (0..=i).map(|j| exps[j] * f64::from(vs[j][kvh * d + dd])).sum();
                    attn[head * d + dd] = (v / total) as f32;
                }
            }
            let o = matvec_t(&attn, &lw.o_proj, h);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let n = rms(x, &lw.post_attn_norm, c.rms_norm_eps);
            let gu = matvec_t(&n, &lw.gate_up, 2 * inter);
            let act: Vec<f32> = (0..inter)
                .map(|j| {
                    let g = f64::from(gu[j]);
                    (g / (1.0 + (-g).exp()) * f64::from(gu[inter + j])) as f32
                })
                .collect();
            let down = matvec_t(&act, &lw.down, h);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
    }
    let (final_norm, lm_head) = (model.final_norm.to_f32(), model.lm_head().to_f32());
    xs.iter().flat_map(|x| matvec_t(&rms(x, &final_norm, c.rms_norm_eps), &lm_head, c.vocab_size)).collect()
}
