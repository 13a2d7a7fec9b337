//! The tiled ("flash") prefill step: a tile of query rows against a run of key/value blocks,
//! scores kept in cache, softmax online — written once over [`Lanes`] and compiled per ISA.
//!
//! Layout: *query rows are the vector lanes.* A tile's rows (query tokens × the query heads of
//! one kv head) sit side by side, so
//! - scores `S[key][row] = Σ_dim K[key][dim] · Qᵀ[dim][row]` is a GEMM micro-kernel whose
//!   `K` operand is a broadcast straight from the cache's key layout `[head/x, block, x]` (only
//!   widened to f32, never transposed) and whose `Qᵀ` rows are loaded once per dim for `MT` keys;
//! - the softmax is lane-wise: running max, rescale and sum of each row are plain vector ops,
//!   no horizontal reduction anywhere;
//! - `accᵀ[dim][row] += Σ_key V[dim][key] · P[key][row]` broadcasts from the value layout
//!   `[head, block]` as it is.
//!
//! Every key and value element widened once per step serves all the tile's rows (and so every
//! query head of the GQA group). Register blocks: AVX-512 8 keys (or dims) × 3 vectors of 16
//! rows = 24 accumulators; AVX2 4 × 3 × 8; the loads per FMA stay under the two load ports' rate.

#[cfg(target_arch = "x86_64")]
use super::lanes::{Avx2, Avx512};
use super::lanes::{Lanes, Plain};
use super::{KernelElem, Scales};
use crate::Isa;

/// Keys per step: the score tile is `[STEP_KEYS][rows]` (with the widened keys and values, a
/// few hundred KiB: it stays in L2 while every row block walks it).
pub(crate) const STEP_KEYS: usize = 256;
/// Keys per pass of the `P · V` kernel (a multiple of every block size, or one block).
const CHUNK_KEYS: usize = 32;
/// Tile rows are padded to a multiple of this (the widest vector); padding rows are computed
/// from zero queries and never written out.
pub(crate) const ROW_ALIGN: usize = 16;

/// A query tile's running state and scratch, all f32, rows in lanes.
#[derive(Debug)]
pub(crate) struct FlashTile<'a> {
    pub head_size: usize,
    /// Rows of the tile, a positive multiple of [`ROW_ALIGN`].
    pub rows: usize,
    /// Distance between the rows of `queries`, `acc` and `scores` (≥ `rows`, a multiple of
    /// [`ROW_ALIGN`]): `rows` plus padding keeps a power-of-two `rows` from mapping every dim or
    /// key onto the same few L1 sets.
    pub stride: usize,
    /// Scaled queries, `[head_size][stride]`.
    pub queries: &'a [f32],
    /// Position of each row's query token (f32: exact below 2²⁴).
    pub row_pos: &'a [f32],
    /// The smallest row position: keys past it need the causal mask.
    pub min_pos: usize,
    /// The largest row position: with a window, keys `w` or more before it need the window mask.
    pub max_pos: usize,
    /// A row at position `p` sees keys `(p − w, p]`; `None`: all of `0 ..= p`.
    pub sliding_window: Option<usize>,
    /// Running max and running sum of each row.
    pub max: &'a mut [f32],
    pub sum: &'a mut [f32],
    /// Unnormalized output, `[head_size][stride]`.
    pub acc: &'a mut [f32],
    /// Scratch: scores, then probabilities, `[STEP_KEYS][stride]`.
    pub scores: &'a mut [f32],
    /// Scratch: one step's keys and values widened to f32, block after block, in cache layout.
    pub keys: &'a mut [f32],
    pub values: &'a mut [f32],
}

/// The cache blocks one step reads, all of one kv head.
#[derive(Debug)]
pub(crate) struct KvRun<'a, T> {
    /// The layer's whole key and value caches.
    pub key: &'a [T],
    pub value: &'a [T],
    /// Physical blocks, at most `STEP_KEYS / block_size`, in sequence order.
    pub blocks: &'a [u32],
    pub kv_head: usize,
    pub num_kv_heads: usize,
    pub block_size: usize,
    /// Position of the first key of `blocks[0]`.
    pub first_key: usize,
    /// Keys of the run inside the sequence; slots past them may hold anything (NaN) and are
    /// masked for scores and zeroed for values.
    pub live: usize,
    /// int8's scales (the whole layer's), applied to the live keys and values as they are
    /// widened.
    pub scales: Option<Scales<'a>>,
}

/// One step of the online softmax: scores of the tile's rows against `kv`'s keys (causally
/// masked), rescale of what came before, and `acc += P · V`.
///
/// # Panics
/// On any shape or length the kernels could not run in bounds with.
pub(crate) fn flash_step<T: KernelElem>(isa: Isa, t: &mut FlashTile<'_>, kv: &KvRun<'_, T>) {
    let (d, rows, stride, bs) = (t.head_size, t.rows, t.stride, kv.block_size);
    let keys = kv.blocks.len() * bs;
    assert!(rows > 0 && rows.is_multiple_of(ROW_ALIGN) && stride >= rows && stride.is_multiple_of(ROW_ALIGN));
    assert!(
        d.is_multiple_of(16) && matches!(bs, 8 | 16 | 32) && d.is_multiple_of(T::DTYPE.x()),
        "d {d} bs {bs}"
    );
    assert!(keys > 0 && keys <= STEP_KEYS && kv.live > 0 && kv.live <= keys, "keys {keys} live {}", kv.live);
    assert!(t.queries.len() >= d * stride && t.acc.len() >= d * stride);
    assert!(t.row_pos.len() >= rows && t.max.len() >= rows && t.sum.len() >= rows);
    assert!(t.scores.len() >= keys * stride && t.keys.len() >= keys * d && t.values.len() >= keys * d);
    let tile = d * bs;
    let in_cache = |b: u32| {
        (b as usize)
            .checked_mul(kv.num_kv_heads)
            .and_then(|x| x.checked_add(kv.kv_head + 1))
            .and_then(|x| x.checked_mul(tile))
            .is_some_and(|end| kv.kv_head < kv.num_kv_heads && end <= kv.key.len() && end <= kv.value.len())
    };
    assert!(kv.blocks.iter().all(|&b| in_cache(b)), "block outside the cache");
    // Positions are compared as f32 lanes: exact below 2^24.
    assert!(kv.first_key + keys <= 1 << 24, "positions past 2^24");
    match if isa.is_available() { isa } else { Isa::Portable } {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only taken when `is_available` says yes (AVX2/FMA/F16C with
        // it); every length was checked above.
        Isa::Avx512 => unsafe { step_avx512(t, kv) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for `Isa::Avx2`.
        Isa::Avx2 => unsafe { step_avx2(t, kv) },
        // SAFETY: plain Rust; lengths checked above.
        _ => unsafe { by_block_size::<Plain, T, 4, 4>(t, kv) },
    }
}

/// # Safety
/// AVX-512F, AVX2, FMA and F16C available; `flash_step`'s checks passed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn step_avx512<T: KernelElem>(t: &mut FlashTile<'_>, kv: &KvRun<'_, T>) {
    // SAFETY: per the contract.
    unsafe { by_block_size::<Avx512, T, 8, 8>(t, kv) }
}

/// # Safety
/// AVX2, FMA and F16C available; `flash_step`'s checks passed.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn step_avx2<T: KernelElem>(t: &mut FlashTile<'_>, kv: &KvRun<'_, T>) {
    // SAFETY: per the contract.
    unsafe { by_block_size::<Avx2, T, 4, 4>(t, kv) }
}

/// [`step`] with the block size a constant (8, 16 or 32, checked by `flash_step`), so that the
/// kernels' strides through the cache layouts are immediate offsets.
///
/// # Safety
/// As [`step`].
#[inline(always)]
unsafe fn by_block_size<V: Lanes, T: KernelElem, const MT: usize, const MD: usize>(
    t: &mut FlashTile<'_>,
    kv: &KvRun<'_, T>,
) {
    // SAFETY: per the contract.
    unsafe {
        match kv.block_size {
            8 => step::<V, T, MT, MD, 8>(t, kv),
            16 => step::<V, T, MT, MD, 16>(t, kv),
            32 => step::<V, T, MT, MD, 32>(t, kv),
            bs => panic!("block size {bs}"),
        }
    }
}

/// `MT` keys per score block, `MD` dims per `P · V` block, `BS` keys per cache block.
///
/// # Safety
/// `flash_step`'s checks passed, `BS` is the run's block size and `V`'s ISA is enabled.
#[inline(always)]
unsafe fn step<V: Lanes, T: KernelElem, const MT: usize, const MD: usize, const BS: usize>(
    t: &mut FlashTile<'_>,
    kv: &KvRun<'_, T>,
) {
    // SAFETY: lengths checked by `flash_step`; see each callee.
    unsafe {
        widen::<V, T>(t, kv);
        let keys = kv.blocks.len() * BS;
        scores::<V, MT, BS>(t, T::DTYPE.x(), keys);
        softmax::<V>(t, kv.first_key, keys);
        accumulate::<V, MD, BS>(t, keys);
    }
}

/// Copies the run's key and value tiles into `t.keys` / `t.values` as f32, in cache layout;
/// value slots past `kv.live` become 0 (a zero probability times NaN would still be NaN).
#[inline(always)]
unsafe fn widen<V: Lanes, T: KernelElem>(t: &mut FlashTile<'_>, kv: &KvRun<'_, T>) {
    let (d, bs) = (t.head_size, kv.block_size);
    let tile = d * bs;
    // SAFETY: every block's tile is inside the caches and `keys`/`values` hold `blocks · tile`
    // floats (checked by `flash_step`); `tile` is a multiple of 16 (d is).
    unsafe {
        for (i, &b) in kv.blocks.iter().enumerate() {
            let src = (b as usize * kv.num_kv_heads + kv.kv_head) * tile;
            let (k, v) = (kv.key.as_ptr().add(src), kv.value.as_ptr().add(src));
            let (kd, vd) = (t.keys.as_mut_ptr().add(i * tile), t.values.as_mut_ptr().add(i * tile));
            for e in (0..tile).step_by(V::L) {
                V::widen(k.add(e)).store(kd.add(e));
                V::widen(v.add(e)).store(vd.add(e));
            }
        }
    }
    if let Some(sc) = kv.scales {
        let x = T::DTYPE.x();
        for (i, &b) in kv.blocks.iter().enumerate() {
            let (ks, vs) = sc.tile(kv.num_kv_heads, bs, b, kv.kv_head);
            // Live slots only: a slot past the sequence may hold any scale (NaN).
            let live = kv.live.saturating_sub(i * bs).min(bs);
            let (keys, values) =
                (&mut t.keys[i * tile..(i + 1) * tile], &mut t.values[i * tile..(i + 1) * tile]);
            // Keys `[d/x][bs][x]`: token `slot`'s chunk of each `x` dims, scaled by its group's
            // scale (`[groups][bs]`); values `[d][bs]`.
            for (c, chunk) in keys.chunks_exact_mut(bs * x).enumerate() {
                let group = &ks[c * x / sc.group * bs..][..live];
                for (slot, s) in chunk.chunks_exact_mut(x).zip(group) {
                    let s = s.to_f32();
                    slot.iter_mut().for_each(|k| *k *= s);
                }
            }
            for row in values.chunks_exact_mut(bs) {
                super::scale_by(&mut row[..live], vs);
            }
        }
    }
    for key in kv.live..kv.blocks.len() * bs {
        let (blk, slot) = (key / bs, key % bs);
        for dim in 0..d {
            t.values[blk * tile + dim * bs + slot] = 0.0;
        }
    }
}

/// How many row vectors the next register block takes: 3 at most, and 4 left go as 2 + 2.
#[inline(always)]
fn row_block(left: usize) -> usize {
    if left == 4 { 2 } else { left.min(3) }
}

/// [`row_block`] for `P · V` with blocks of `MD` dims: with `MD = 8` (AVX-512, 32 registers)
/// four vectors go as one block of `MD/2` dims × 4 vectors, so a 64-row tile reads each key's
/// whole probability line in one pass (measured ~1.4× faster than two passes over half lines).
#[inline(always)]
fn pv_row_block<const MD: usize>(left: usize) -> usize {
    match left {
        4 | 7.. if MD == 8 => 4,
        _ => row_block(left),
    }
}

/// `scores[key][row] = Σ_dim keys[key][dim] · queries[dim][row]` for every key of the run.
#[inline(always)]
unsafe fn scores<V: Lanes, const MT: usize, const BS: usize>(t: &mut FlashTile<'_>, x: usize, keys: usize) {
    let (d, rows, stride) = (t.head_size, t.rows, t.stride);
    let (q, s, k) = (t.queries.as_ptr(), t.scores.as_mut_ptr(), t.keys.as_ptr());
    let vectors = rows / V::L;
    // SAFETY: key `blk·bs + slot + m` (m < MT, and MT divides bs) is inside the widened run;
    // row vectors `j .. j + nb` are inside `rows`.
    unsafe {
        for key0 in (0..keys).step_by(MT) {
            let (blk, slot) = (key0 / BS, key0 % BS);
            let kp = k.add(blk * d * BS + slot * x);
            let mut j = 0;
            while j < vectors {
                let nb = row_block(vectors - j);
                let (qj, sj) = (q.add(j * V::L), s.add(key0 * stride + j * V::L));
                match nb {
                    1 => score_block::<V, MT, 1, BS>(kp, qj, sj, stride, d, x),
                    2 => score_block::<V, MT, 2, BS>(kp, qj, sj, stride, d, x),
                    _ => score_block::<V, MT, 3, BS>(kp, qj, sj, stride, d, x),
                }
                j += nb;
            }
        }
    }
}

/// `MT` keys × `NB` row vectors of scores. `kp` points at dim 0 of the first key in the key
/// layout `[d/x][bs][x]` (key `m`, dim `c·x + i` at `c·bs·x + m·x + i`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_block<V: Lanes, const MT: usize, const NB: usize, const BS: usize>(
    kp: *const f32,
    q: *const f32,
    s: *mut f32,
    stride: usize,
    d: usize,
    x: usize,
) {
    // SAFETY: per `scores`.
    unsafe {
        let mut acc = [[V::splat(0.0); NB]; MT];
        for c in 0..d / x {
            for i in 0..x {
                let dim = c * x + i;
                let qv: [V; NB] = std::array::from_fn(|j| V::load(q.add(dim * stride + j * V::L)));
                let kc = kp.add(c * BS * x + i);
                for (m, row) in acc.iter_mut().enumerate() {
                    let kv = V::splat(*kc.add(m * x));
                    for (a, &qj) in row.iter_mut().zip(&qv) {
                        *a = V::fma(kv, qj, *a);
                    }
                }
            }
        }
        for (m, row) in acc.iter().enumerate() {
            for (j, a) in row.iter().enumerate() {
                a.store(s.add(m * stride + j * V::L));
            }
        }
    }
}

/// Online softmax over the run's scores, lane by lane: mask keys past each row's position (and
/// those before its window), raise the running max, rescale the running sum and `acc` by `e^(old − new)`, and turn the
/// scores into probabilities `e^(s − max)` in place.
#[inline(always)]
unsafe fn softmax<V: Lanes>(t: &mut FlashTile<'_>, first_key: usize, keys: usize) {
    let (d, rows, stride) = (t.head_size, t.rows, t.stride);
    let needs_mask = first_key + keys > t.min_pos + 1;
    // Keys at or before `p − w` for some row `p`: the oldest key against the newest row.
    let window = t.sliding_window.filter(|&w| first_key + w <= t.max_pos);
    let s = t.scores.as_mut_ptr();
    // SAFETY: `scores` holds `keys · rows` floats, `acc` `d · rows`, the row arrays `rows`.
    unsafe {
        for j in (0..rows).step_by(V::L) {
            let mut top = V::splat(f32::NEG_INFINITY);
            if needs_mask || window.is_some() {
                let pos = V::load(t.row_pos.as_ptr().add(j));
                for k in 0..keys {
                    let p = s.add(k * stride + j);
                    let key = first_key + k;
                    let mut v = V::load(p).mask_later(V::splat(key as f32), pos);
                    if let Some(w) = window {
                        // Out of the window where `p > key + w − 1`.
                        v = v.mask_later(pos, V::splat((key + w - 1) as f32));
                    }
                    v.store(p);
                    top = top.max(v);
                }
            } else {
                for k in 0..keys {
                    top = top.max(V::load(s.add(k * stride + j)));
                }
            }
            // The running max starts finite (`f32::MIN`), so a row that sees no key in this step
            // (before its window or past its position) rescales by 1 and adds e^−inf = 0.
            let old = V::load(t.max.as_ptr().add(j));
            let new = old.max(top);
            let rescale = old.sub(new).exp();
            let mut total = V::splat(0.0);
            for k in 0..keys {
                let p = s.add(k * stride + j);
                let e = V::load(p).sub(new).exp();
                e.store(p);
                total = total.add(e);
            }
            V::fma(V::load(t.sum.as_ptr().add(j)), rescale, total).store(t.sum.as_mut_ptr().add(j));
            new.store(t.max.as_mut_ptr().add(j));
            for dim in 0..d {
                let a = t.acc.as_mut_ptr().add(dim * stride + j);
                V::load(a).mul(rescale).store(a);
            }
        }
    }
}

/// `acc[dim][row] += Σ_key values[dim][key] · probs[key][row]`.
#[inline(always)]
unsafe fn accumulate<V: Lanes, const MD: usize, const BS: usize>(t: &mut FlashTile<'_>, keys: usize) {
    let (d, rows, stride) = (t.head_size, t.rows, t.stride);
    let (p, v, acc) = (t.scores.as_ptr(), t.values.as_ptr(), t.acc.as_mut_ptr());
    let vectors = rows / V::L;
    // SAFETY: dims `d0 .. d0 + MD` (MD divides d, a multiple of 16) and row vectors
    // `j .. j + nb` are in bounds; values hold `keys / bs` tiles of `d · bs`.
    // Keys in chunks whose probabilities (`CHUNK_KEYS` × `stride`, ~10 KiB) stay in L1 while
    // every (row block, dim block) pass reads them: walking all of a step's probabilities per
    // pass streamed them from L2 and ran at half the speed of the score kernel.
    unsafe {
        let chunk = CHUNK_KEYS.max(BS);
        for key0 in (0..keys).step_by(chunk) {
            let n = chunk.min(keys - key0);
            let (vc, pc) = (v.add(key0 / BS * d * BS), p.add(key0 * stride));
            let mut j = 0;
            while j < vectors {
                let nb = pv_row_block::<MD>(vectors - j);
                let md = if nb == 4 { MD / 2 } else { MD };
                for d0 in (0..d).step_by(md) {
                    let (vd, pj, aj) = (vc.add(d0 * BS), pc.add(j * V::L), acc.add(d0 * stride + j * V::L));
                    match nb {
                        1 => pv_block::<V, MD, 1, BS>(vd, pj, aj, stride, d, n),
                        2 => pv_block::<V, MD, 2, BS>(vd, pj, aj, stride, d, n),
                        3 => pv_block::<V, MD, 3, BS>(vd, pj, aj, stride, d, n),
                        _ => pv_block::<V, 4, 4, BS>(vd, pj, aj, stride, d, n),
                    }
                }
                j += nb;
            }
        }
    }
}

/// `MD` dims × `NB` row vectors of `acc`, over every key. `vd` points at dim 0 of block 0 in
/// the value layout `[d][bs]` (block `b`, dim `m`, slot `s` at `b·d·bs + m·bs + s`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<V: Lanes, const MD: usize, const NB: usize, const BS: usize>(
    vd: *const f32,
    p: *const f32,
    acc: *mut f32,
    stride: usize,
    d: usize,
    keys: usize,
) {
    // SAFETY: per `accumulate`.
    unsafe {
        let mut a: [[V; NB]; MD] =
            std::array::from_fn(|m| std::array::from_fn(|j| V::load(acc.add(m * stride + j * V::L))));
        for blk in 0..keys / BS {
            let vb = vd.add(blk * d * BS);
            for slot in 0..BS {
                let key = blk * BS + slot;
                let pv: [V; NB] = std::array::from_fn(|j| V::load(p.add(key * stride + j * V::L)));
                for (m, row) in a.iter_mut().enumerate() {
                    let vv = V::splat(*vb.add(m * BS + slot));
                    for (x, &pj) in row.iter_mut().zip(&pv) {
                        *x = V::fma(vv, pj, *x);
                    }
                }
            }
        }
        for (m, row) in a.iter().enumerate() {
            for (j, x) in row.iter().enumerate() {
                x.store(acc.add(m * stride + j * V::L));
            }
        }
    }
}
