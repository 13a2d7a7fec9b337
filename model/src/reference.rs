//! A naive full-sequence forward pass with no KV cache: plain loops, f64 sums and a causal
//! (sliding-window where a layer has one) softmax in f64, following the same
//! [`crate::Architecture`] as the paged forward. Written for clarity, not speed; tests compare
//! the paged forward pass against it.

use crate::arch::{Activation, LayerMatrix, LayerNorm, RopeStyle};
use crate::decoder::{LayerWeights, Model};
use crate::rope::Rope;

fn matvec_t(x: &[f32], w: &[f32], bias: Option<&Vec<f32>>, n: usize) -> Vec<f32> {
    let k = x.len();
    (0..n)
        .map(|j| {
            let dot: f64 =
                x.iter().zip(&w[j * k..(j + 1) * k]).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            (dot + bias.map_or(0.0, |b| f64::from(b[j]))) as f32
        })
        .collect()
}

fn rms(x: &[f32], w: &[f32], offset: f32, eps: f64) -> Vec<f32> {
    let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(&v, &g)| (f64::from(v) * inv * f64::from(offset + g)) as f32).collect()
}

/// RoPE on one head in the model's pair order, angles computed from scratch per call.
fn rope(head: &mut [f32], pos: usize, r: &Rope, style: RopeStyle) {
    let half = head.len() / 2;
    for (i, &freq) in r.inv_freq().iter().enumerate().take(half) {
        let (s, c) = (pos as f64 * freq).sin_cos();
        let (s, c) = (s * r.attention_factor(), c * r.attention_factor());
        let (ia, ib) = match style {
            RopeStyle::RotateHalf => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (a, b) = (f64::from(head[ia]), f64::from(head[ib]));
        head[ia] = (a * c - b * s) as f32;
        head[ib] = (b * c + a * s) as f32;
    }
}

fn act(kind: Activation, g: f64) -> f64 {
    match kind {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::GeluTanh => {
            0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044_715 * g * g * g)).tanh())
        }
    }
}

/// Logits `[tokens.len(), vocab]` for every position of one sequence starting at position 0.
pub fn forward_full(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let c = &model.config;
    let a = &c.arch;
    let (h, d, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let (inter, eps, offset) = (c.intermediate_size, c.rms_norm_eps, a.norm_weight_offset);
    let group = nh / nkv;
    // Every weight dequantized up front: the oracle computes in plain f32/f64 loops.
    let layers: Vec<LayerWeights<Vec<f32>>> = model
        .layers
        .iter()
        .map(|l| l.try_map(|w, _| Ok::<_, ()>(w.to_f32())).expect("dequantizing cannot fail"))
        .collect();
    let embed = model.embed.to_f32();
    let scale = a.embedding_scale.unwrap_or(1.0);
    let mut xs: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| embed[t as usize * h..(t as usize + 1) * h].iter().map(|v| v * scale).collect())
        .collect();
    let norm_of =
        |lw: &LayerWeights<Vec<f32>>, n| lw.norm(n).cloned().expect("the architecture's norms are loaded");
    // A block's output joined to the residual stream, normed first with sandwich norms.
    let join = |x: &mut Vec<f32>, out: Vec<f32>, lw: &LayerWeights<Vec<f32>>, n: LayerNorm| {
        let out = if a.sandwich_norms { rms(&out, &norm_of(lw, n), offset, eps) } else { out };
        x.iter_mut().zip(&out).for_each(|(v, o)| *v += o);
    };
    for (lw, attention) in layers.iter().zip(&c.layer_attention) {
        let r = model.rope(attention.rope);
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (pos, x) in xs.iter().enumerate() {
            let n = rms(x, &norm_of(lw, LayerNorm::InputLayernorm), offset, eps);
            let qkv = matvec_t(&n, lw.matrix(LayerMatrix::Qkv), lw.bias(LayerMatrix::Qkv), c.qkv_size());
            let mut q = qkv[..nh * d].to_vec();
            let mut k = qkv[nh * d..(nh + nkv) * d].to_vec();
            if a.qk_norm {
                let (qn, kn) = (norm_of(lw, LayerNorm::QNorm), norm_of(lw, LayerNorm::KNorm));
                q = q.chunks(d).flat_map(|hd| rms(hd, &qn, offset, eps)).collect();
                k = k.chunks(d).flat_map(|hd| rms(hd, &kn, offset, eps)).collect();
            }
            q.chunks_mut(d).for_each(|hd| rope(hd, pos, r, a.rope_style));
            k.chunks_mut(d).for_each(|hd| rope(hd, pos, r, a.rope_style));
            qs.push(q);
            ks.push(k);
            vs.push(qkv[(nh + nkv) * d..].to_vec());
        }
        let scale = f64::from(a.attention_scale);
        for (i, x) in xs.iter_mut().enumerate() {
            // The keys in `(i − window, i]`.
            let first = attention.sliding_window.map_or(0, |w| (i + 1).saturating_sub(w));
            let mut attn = vec![0.0f32; nh * d];
            for head in 0..nh {
                let kvh = head / group;
                let q = &qs[i][head * d..(head + 1) * d];
                let scores: Vec<f64> = (first..=i)
                    .map(|j| {
                        let k = &ks[j][kvh * d..(kvh + 1) * d];
                        q.iter().zip(k).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>() * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for dd in 0..d {
                    let v: f64 =
                        (first..=i).zip(&exps).map(|(j, e)| e * f64::from(vs[j][kvh * d + dd])).sum();
                    attn[head * d + dd] = (v / total) as f32;
                }
            }
            let o = matvec_t(&attn, lw.matrix(LayerMatrix::O), lw.bias(LayerMatrix::O), h);
            join(x, o, lw, LayerNorm::PostAttentionLayernorm);
            let n = rms(x, &norm_of(lw, LayerNorm::PreFeedforwardLayernorm), offset, eps);
            let gu = matvec_t(&n, lw.matrix(LayerMatrix::GateUp), None, 2 * inter);
            let gated: Vec<f32> = (0..inter)
                .map(|j| (act(a.activation, f64::from(gu[j])) * f64::from(gu[inter + j])) as f32)
                .collect();
            let down = matvec_t(&gated, lw.matrix(LayerMatrix::Down), None, h);
            join(x, down, lw, LayerNorm::PostFeedforwardLayernorm);
        }
    }
    let (final_norm, lm_head) = (model.final_norm.to_f32(), model.lm_head().to_f32());
    xs.iter()
        .flat_map(|x| matvec_t(&rms(x, &final_norm, offset, eps), &lm_head, None, c.vocab_size))
        .map(|l| {
            a.final_logit_softcap
                .map_or(l, |cap| (f64::from(cap) * (f64::from(l) / f64::from(cap)).tanh()) as f32)
        })
        .collect()
}
