//! The part of the AVX2 and AVX-512 paths that is the same but for the vector width: the
//! formats whose groups take one scale and offset from their header (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q4_K, Q5_K), the decode dot products and row dequantization, written once as [`x86_path!`]
//! and expanded in [`super::avx2`] and [`super::avx512`], each copy compiled with its module's
//! CPU features; and [`groups!`], which declares a path's formats.

/// Declares each format `$name` of a path and its `Group` impl, whose `codes` returns `$V`
/// and is compiled with the path's features `$feat`: stated once per path, so no format can
/// miss one. `$body` is the text of `codes` over `row` and `g`.
macro_rules! groups {
    (features: $feat:literal, vectors: $V:ty; $(
        $(#[$doc:meta])*
        $name:ident { bytes: $bytes:literal, offset: $offset:literal } => |$row:ident, $g:ident| $body:block
    )*) => {$(
        pub(super) struct $name;
        impl Group for $name {
            const BYTES: usize = $bytes;
            const OFFSET: bool = $offset;

            $(#[$doc])*
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn codes($row: *const u8, $g: usize) -> ($V, f32, f32) $body
        }
    )*};
}

/// Expands, in the SIMD module `$isa`, the items both x86 paths share. The module provides
/// its `Group` trait (with `$V` vectors of `$L` lanes), `nibbles_low_then_high`,
/// `u8x32_to_f32`, the byte-level helpers of [`super::avx2`] (`f16_at`, `f16_pair_at`,
/// `q5_codes`, `fifth_bits`, `k_scale_offset`, `k_nibbles`), `PREFETCH_AHEAD` and the
/// horizontal sum `$hsum`;
/// `intrinsics` names its setzero, set1, fmadd and storeu for `$V`; `dot` is the group's dot
/// product of the codes `$q` with the 32 activations at `$xp` (each path keeps its own text,
/// so that its loads and multiplies stay in the order they were tuned in). The macro
/// writes the text of each function once, so each expansion is the same code as a
/// hand-written copy with that module's features.
macro_rules! x86_path {
    (
        isa: $isa:ident, features: $feat:literal, vector: $V:ty, lanes: $L:literal, hsum: $hsum:ident,
        intrinsics: $setzero:ident, $set1:ident, $fmadd:ident, $storeu:ident,
        dot: |$q:ident, $xp:ident| $dot:expr $(,)?
    ) => {
        /// The dequantized values of group `g`.
        ///
        /// # Safety
        /// As [`Group::codes`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn group<F: Group>(row: *const u8, g: usize) -> [$V; 32 / $L] {
            // SAFETY: forwarded contract.
            let (q, scale, offset) = unsafe { F::codes(row, g) };
            affine(q, scale, offset)
        }

        /// `q·scale + offset` for each vector.
        #[inline]
        #[target_feature(enable = $feat)]
        fn affine<const N: usize>(q: [$V; N], scale: f32, offset: f32) -> [$V; N] {
            let (s, o) = ($set1(scale), $set1(offset));
            q.map(|v| $fmadd(v, s, o))
        }

        groups! {
            features: $feat, vectors: [$V; 32 / $L];

            Q4_0 { bytes: 18, offset: true } => |row, g| {
                // SAFETY: block g (18 bytes: f16 d, 16 bytes of nibbles) lies inside the row.
                unsafe {
                    let b = row.add(g * 18);
                    let d = f16_at(b);
                    (nibbles_low_then_high(_mm_loadu_si128(b.add(2) as *const __m128i)), d, -8.0 * d)
                }
            }

            Q4_1 { bytes: 20, offset: true } => |row, g| {
                // SAFETY: block g (20 bytes: f16 d, f16 m, 16 bytes of nibbles) lies inside the row.
                unsafe {
                    let b = row.add(g * 20);
                    let (d, m) = f16_pair_at(b);
                    (nibbles_low_then_high(_mm_loadu_si128(b.add(4) as *const __m128i)), d, m)
                }
            }

            Q5_0 { bytes: 22, offset: true } => |row, g| {
                // SAFETY: block g (22 bytes: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles)
                // lies inside the row.
                unsafe {
                    let b = row.add(g * 22);
                    let d = f16_at(b);
                    (u8x32_to_f32(q5_codes(b.add(2), b.add(6))), d, -16.0 * d)
                }
            }

            Q5_1 { bytes: 24, offset: true } => |row, g| {
                // SAFETY: block g (24 bytes: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of
                // nibbles) lies inside the row.
                unsafe {
                    let b = row.add(g * 24);
                    let (d, m) = f16_pair_at(b);
                    (u8x32_to_f32(q5_codes(b.add(4), b.add(8))), d, m)
                }
            }

            /// Super-block of 256 (144 bytes: f16 d, f16 dmin, 12 bytes of scales and mins, 128
            /// bytes of nibbles); group `s` of it is sub-block `s`: the low nibbles of bytes
            /// `32·(s/2)..` for even `s`, the high nibbles for odd `s`; value = `d·sc·q − dmin·m`.
            Q4K { bytes: 18, offset: true } => |row, g| {
                // SAFETY: super-block g/8 (144 bytes) lies inside the row.
                unsafe {
                    let b = row.add(g / 8 * 144);
                    let (scale, offset) = k_scale_offset(b, g % 8);
                    (u8x32_to_f32(k_nibbles(b.add(16), g % 8)), scale, offset)
                }
            }

            /// Super-block of 256 (176 bytes: Q4_K's 16-byte header, 32 bytes of fifth bits,
            /// 128 bytes of nibbles): Q4_K's sub-block `s` with bit `s` of fifth-bit byte `l`
            /// worth 16 in its value `l`.
            Q5K { bytes: 22, offset: true } => |row, g| {
                // SAFETY: super-block g/8 (176 bytes) lies inside the row.
                unsafe {
                    let b = row.add(g / 8 * 176);
                    let s = g % 8;
                    let (scale, offset) = k_scale_offset(b, s);
                    (u8x32_to_f32(q5k_codes(b, s)), scale, offset)
                }
            }
        }

        /// The task's rows times its `M` tokens of `x`: per group, the codes
        /// are multiplied into each token's 32 activations, the sum scaled once, and the offset
        /// added through the activations' group sum (computed once per call, [`Activations`]).
        ///
        /// # Safety
        /// The module's CPU features are available; the rows and tokens lie inside `part` and
        /// `x`; only this task writes columns `rows` of `out`.
        #[target_feature(enable = $feat)]
        unsafe fn dot_rows<F: Group, const M: usize>(task: RowTask<'_>, acts: Activations<'_>) {
            let RowTask { part, rows, t0, out, accumulate, .. } = task;
            let k = part.cols;
            let groups = k / 32;
            let xs = acts.x[t0 * k..(t0 + M) * k].as_ptr();
            let group_sums = &acts.group_sums[t0 * groups..];
            for r in rows {
                let row = part.row(r).as_ptr();
                let mut acc = [$setzero(); M];
                let mut offsets = [0.0f32; M];
                for g in 0..groups {
                    // SAFETY: g < groups, so the group lies in the row; x holds M rows of k. The
                    // prefetch is a hint (it may point past the part and never faults).
                    unsafe {
                        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(g * F::BYTES + PREFETCH_AHEAD) as *const i8);
                        let (q, scale, offset) = F::codes(row, g);
                        let scale = $set1(scale);
                        for (t, a) in acc.iter_mut().enumerate() {
                            let xp = xs.add(t * k + 32 * g);
                            let dot = {
                                let ($q, $xp) = (q, xp);
                                $dot
                            };
                            *a = $fmadd(dot, scale, *a);
                            if F::OFFSET {
                                offsets[t] = offset.mul_add(*group_sums.get_unchecked(t * groups + g), offsets[t]);
                            }
                        }
                    }
                }
                for (t, a) in acc.iter().enumerate() {
                    // SAFETY: (t0 + t, r) is this task's entry.
                    unsafe { out.put(t0 + t, r, $hsum(*a) + offsets[t], accumulate) };
                }
            }
        }

        dot_rows_dyn!($isa);

        #[target_feature(enable = $feat)]
        unsafe fn dequantize_row_as<G: Group>(row: &[u8], out: &mut [f32]) {
            for (g, chunk) in out.chunks_exact_mut(32).enumerate() {
                // SAFETY: the row holds out.len() values, so group g exists; chunk has 32 floats.
                unsafe {
                    let w = group::<G>(row.as_ptr(), g);
                    for (j, v) in w.iter().enumerate() {
                        $storeu(chunk.as_mut_ptr().add($L * j), *v);
                    }
                }
            }
        }

        /// One row of format `ty` (`out.len()` values, a multiple of 32) into `out`.
        ///
        /// # Safety
        /// The module's CPU features are available; `row` holds exactly one row of `out.len()`
        /// values.
        pub(super) unsafe fn dequantize_row(ty: GgmlType, row: &[u8], out: &mut [f32]) {
            // SAFETY: forwarded contract.
            unsafe { with_group!($isa, ty, G => dequantize_row_as::<G>(row, out)) }
        }
    };
}
