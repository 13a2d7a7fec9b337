//! Weight matrices kept in their storage format (f32, f16, bf16 and ggml's Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), memory-mapped when they come from a file, and `x·Wᵀ` over them,
//! each decode step reading the quantized bytes only. With f32 activations a quantized model
//! computes what its f32 dequantization would; with int16 ones ([`ActivationPrecision`], by
//! default on x86 CPUs) the integer-code formats (all but f16 and bf16)
//! multiply in integers, and so with int8 ones (opt-in, [`int8`]: llama.cpp's arithmetic).
//!
//! Where the work goes: a few tokens (decode, [`DECODE_MAX_M`] or fewer) run [`decode`], which
//! dequantizes each weight group in registers and streams every byte once for all tokens (or,
//! with int16 activations, multiplies the integer codes into them, [`int16`]); with
//! int16 activations, more tokens (`lanes16_min_m` or more) over the integer-code formats
//! run [`lanes16`] (int16 activations in the lanes of `vpdpwssd` or `vpmaddwd`, the
//! compute-bound shapes' integer path); more tokens otherwise run [`panel`], which dequantizes
//! rows into f32 once per call and multiplies them into every token: 12 rows at a time into `linear::token_lanes` on AVX2
//! and AVX-512 (batched decode and prefill chunks alike), or on the portable path panels of
//! rows into `gemm`; past `panel::slabs_min_m` tokens whole weights in slabs of a few MB into
//! one `gemm` call each. The
//! instruction set is the crate's one run-time choice ([`Isa::detected`]): AVX-512F (sixteen
//! lanes, [`avx512`]) where the CPU has it, else AVX2 + FMA + F16C ([`avx2`]), else a portable loop
//! over the scalar dequantization ([`crate::ggml::dequantize_block`]); the tests run
//! every one the machine can.

/// The SIMD module `$isa`'s [`avx2::Group`]-style type for format `$ty`, bound to `$G`
/// inside `$body` (one match for every format-generic entry point of both x86 paths).
#[cfg(target_arch = "x86_64")]
macro_rules! with_group {
    ($isa:ident, $ty:expr, $G:ident => $body:expr) => {
        with_group!(@arms $isa, $ty, $G, $body;
            Q8_0 => Q8_0, Q4_0 => Q4_0, Q4_1 => Q4_1, Q5_0 => Q5_0, Q5_1 => Q5_1, Q4_K => Q4K,
            Q5_K => Q5K, Q6_K => Q6K, F16 => F16, BF16 => Bf16)
    };
    // One arm per format: the `GgmlType` variant and the SIMD module's group type.
    (@arms $isa:ident, $ty:expr, $G:ident, $body:expr; $($variant:ident => $group:ident),*) => {
        match $ty {
            $(GgmlType::$variant => {
                type $G = super::$isa::$group;
                $body
            })*
            GgmlType::F32 => unreachable!("f32 parts take the f32 kernels"),
        }
    };
}

/// `$body` with `$M` a `const` of the token count `$mr` (1 to 4; more is taken as 4), so that
/// each decode kernel is compiled per token count and its accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! with_tokens {
    ($mr:expr, |$M:ident| $body:expr) => {
        match $mr {
            1 => {
                const $M: usize = 1;
                $body
            }
            2 => {
                const $M: usize = 2;
                $body
            }
            3 => {
                const $M: usize = 3;
                $body
            }
            _ => {
                const $M: usize = 4;
                $body
            }
        }
    };
}

/// `$body!(F)` with `F` the `int16::Codes` reader of `$ty`, one of [`INTEGER_CODE_FORMATS`]
/// (`$what` names the caller in the message for any other format).
#[cfg(target_arch = "x86_64")]
macro_rules! with_codes {
    ($ty:expr, $body:ident, $what:literal) => {{
        use $crate::quant::int16::{Q4_0, Q4_1, Q4K, Q5_0, Q5_1, Q5K, Q6K, Q8_0};
        match $ty {
            $crate::quant::GgmlType::Q4_0 => $body!(Q4_0),
            $crate::quant::GgmlType::Q4_1 => $body!(Q4_1),
            $crate::quant::GgmlType::Q5_0 => $body!(Q5_0),
            $crate::quant::GgmlType::Q5_1 => $body!(Q5_1),
            $crate::quant::GgmlType::Q8_0 => $body!(Q8_0),
            $crate::quant::GgmlType::Q4_K => $body!(Q4K),
            $crate::quant::GgmlType::Q5_K => $body!(Q5K),
            $crate::quant::GgmlType::Q6_K => $body!(Q6K),
            other => unreachable!("{} takes no {other:?}", $what),
        }
    }};
}

/// The SIMD module `$isa`'s `dot_rows_dyn`: its `dot_rows` for `mr` (1..=4) tokens of the
/// part's format (one dispatch, written once for both x86 paths).
#[cfg(target_arch = "x86_64")]
macro_rules! dot_rows_dyn {
    ($isa:ident) => {
        /// [`dot_rows`] for the task's `mr` (1..=4) tokens.
        ///
        /// # Safety
        /// As [`dot_rows`]; `part.cols` is a multiple of 32.
        pub(super) unsafe fn dot_rows_dyn(task: RowTask<'_>, acts: Activations<'_>) {
            // SAFETY: forwarded contract.
            unsafe { with_group!($isa, task.part.ty, G => with_tokens!(task.mr, |M| dot_rows::<G, M>(task, acts))) }
        }
    };
}

// After the macros: macro_rules! names are in scope only below their definition.
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_path;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod decode;
mod int16;
mod int8;
mod lanes16;
mod panel;
#[cfg(target_arch = "x86_64")]
mod q4_1_wide;
mod storage;
#[cfg(test)]
mod tests;

pub use storage::Storage;

use rayon::prelude::*;

use crate::Isa;
pub use crate::ggml::{GgmlType, QuantizeError};
use crate::linear::{OutPtr, linear};

/// The formats whose values are small integer codes under per-group scales: those the integer
/// kernels take ([`ActivationPrecision::Int16`]).
pub const INTEGER_CODE_FORMATS: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Up to this many tokens a quantized projection streams its weights once through [`decode`];
/// above it, rows are dequantized into `token_lanes` or panels into `gemm` ([`panel`]).
pub const DECODE_MAX_M: usize = 8;

/// How the matmuls over the integer-code formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
/// Q6_K) take their activations: decode-shaped ones on the [`int16`] kernels, batches on
/// [`lanes16`]; f16 and bf16 weights always run the f32 kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// The default: [`Int16`](Self::Int16) for weights whose every part is of an integer-code
    /// format where the kernels' ISA is AVX2 or AVX-512 (there the integer kernels are the
    /// faster ones), [`F32`](Self::F32) otherwise (the portable path, f16/bf16 parts).
    /// Decode and batches then round every weight's activations alike, so a sequence's logits
    /// do not depend on how many others share its step beyond the f32 sums' order.
    #[default]
    Auto,
    /// As f32: each group's codes converted to f32 and multiplied into the activations, so a
    /// quantized model computes what its f32 dequantization would.
    F32,
    /// Rounded once per call to int16 with one scale per 32 values, for integer kernels
    /// (`int16`, `lanes16`): 2⁻¹⁶ of each group's largest value, a measured tolerance (the model
    /// crate's golden tests). Finer than the 8-bit activations llama.cpp's CPU matmuls and the
    /// GGUF kernels of vLLM round to. On the portable path (no integer kernels) it runs as
    /// [`F32`](Self::F32).
    Int16,
    /// Rounded once per call to int8 with one scale per 32 values (`max|x|/127`), as
    /// llama.cpp's CPU matmuls round them, for the [`int8`] kernels: decode and batches alike
    /// on every instruction set, each token's outputs the same bits whatever the path and the
    /// number of tokens in the call. Opt-in: coarser than int16 (2⁻⁸ of each group's largest
    /// value). Other formats fall back to f32 as with [`Int16`](Self::Int16).
    Int8,
}

impl ActivationPrecision {
    /// What this precision means for kernels of `isa` over a weight of the formats `parts`:
    /// [`Auto`](Self::Auto) decided, the others as they are.
    pub fn resolve(self, isa: Isa, mut parts: impl Iterator<Item = GgmlType>) -> Self {
        match self {
            Self::Auto if lanes16::runs_on(isa) && parts.all(int16::supports) => Self::Int16,
            Self::Auto => Self::F32,
            other => other,
        }
    }
}

/// Rows of one storage format inside a [`Weight`].
#[derive(Debug)]
pub struct Part {
    ty: GgmlType,
    rows: usize,
    data: Storage,
}

impl Part {
    /// `rows × cols` values of format `ty` in `data`; refused unless the rows split into whole
    /// blocks and `data` holds exactly their bytes.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: Storage) -> Result<Self, String> {
        let want = rows.checked_mul(cols).and_then(|n| ty.n_bytes(n, Some(cols as u64)));
        match want {
            Some(n) if n == data.len() && (cols > 0 || rows == 0) => Ok(Self { ty, rows, data }),
            Some(n) => Err(format!("{rows}×{cols} {ty:?} needs {n} bytes, storage has {}", data.len())),
            None => Err(format!("rows of {cols} values do not split into whole {ty:?} blocks")),
        }
    }

    #[inline]
    pub fn format(&self) -> GgmlType {
        self.ty
    }

    #[inline]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The stored bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }
}

/// A `[rows, cols]` matrix (PyTorch `Linear` layout) stored as one or more row ranges
/// ([`Part`]s) of possibly different formats: a fused Q/K/V projection keeps each source
/// tensor as it came, memory-mapped, instead of a concatenated copy.
#[derive(Debug)]
pub struct Weight {
    rows: usize,
    cols: usize,
    parts: Vec<Part>,
}

impl Weight {
    /// An f32 matrix (a norm's vector is one row: `1 × len`).
    pub fn from_f32(rows: usize, cols: usize, values: Vec<f32>) -> Self {
        assert_eq!(values.len(), rows * cols, "Weight::from_f32: {rows}×{cols} from {} values", values.len());
        let part = Part { ty: GgmlType::F32, rows, data: Storage::F32(values) };
        Self { rows, cols, parts: vec![part] }
    }

    /// The parts stacked by rows; all have `cols` columns (checked when each part was made).
    pub fn from_parts(cols: usize, parts: Vec<Part>) -> Self {
        let rows = parts.iter().map(|p| p.rows).sum();
        Self { rows, cols, parts }
    }

    #[inline]
    pub fn rows(&self) -> usize {
        self.rows
    }

    #[inline]
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `rows × cols`.
    #[inline]
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Bytes a pass over the whole matrix reads (what decode streams per step).
    pub fn storage_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.data.len()).sum()
    }

    /// The values, when the matrix is one f32 part (norm weights, f32 checkpoints).
    #[inline]
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.parts.as_slice() {
            [Part { data: Storage::F32(v), .. }] => Some(v),
            [] => Some(&[]),
            _ => None,
        }
    }

    /// Row `r` dequantized into `out` (`cols` values): an embedding lookup.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols, "Weight::row_to_f32: row {r} of {}", self.rows);
        let mut first = 0;
        for p in &self.parts {
            if r < first + p.rows {
                let row_bytes = p.data.len() / p.rows;
                let bytes = &p.data.bytes()[(r - first) * row_bytes..][..row_bytes];
                Isa::detected().dequantize_row(p.ty, bytes, out);
                return;
            }
            first += p.rows;
        }
    }

    /// The whole matrix as f32 (for devices that keep f32/bf16 copies, and for the tests'
    /// reference forward pass).
    pub fn to_f32(&self) -> Vec<f32> {
        if let Some(v) = self.as_f32() {
            return v.to_vec();
        }
        let mut out = vec![0.0; self.len()];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.row_to_f32(r, row);
            }
        }
        out
    }

    /// The matrix with its float parts (f32, f16, bf16) quantized to `ty` row by row with
    /// ggml's reference quantizer; parts already quantized stay as they are.
    pub fn quantized(&self, ty: GgmlType) -> Result<Weight, QuantizeError> {
        let cols = self.cols;
        let parts = self
            .parts
            .iter()
            .map(|p| {
                if !matches!(p.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                    // Kept as it is: a GGUF's mapped tensor stays mapped, not copied to the heap.
                    return Ok(Part { ty: p.ty, rows: p.rows, data: p.data.share() });
                }
                let rows: Vec<Vec<u8>> = (0..p.rows)
                    .into_par_iter()
                    .map(|r| {
                        let row_bytes = p.data.len() / p.rows;
                        let mut values = vec![0.0f32; cols];
                        Isa::detected().dequantize_row(
                            p.ty,
                            &p.data.bytes()[r * row_bytes..][..row_bytes],
                            &mut values,
                        );
                        let mut out = Vec::new();
                        crate::ggml::quantize(ty, &values, &mut out).map(|()| out)
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Part { ty, rows: p.rows, data: Storage::Owned(rows.concat()) })
            })
            .collect::<Result<Vec<_>, QuantizeError>>()?;
        Ok(Weight { rows: self.rows, cols, parts })
    }

    /// Each part as the kernels take it (format, shape and bytes), in row order.
    fn part_refs(&self) -> impl Iterator<Item = PartRef<'_>> {
        self.parts.iter().map(|p| PartRef { ty: p.ty, rows: p.rows, cols: self.cols, bytes: p.data.bytes() })
    }

    /// `dst[m, rows] (+)= x[m, cols] · Wᵀ`, with `accumulate` adding to `dst` (the residual), f32
    /// activations.
    pub fn matmul(&self, dst: &mut [f32], x: &[f32], m: usize, accumulate: bool) {
        self.matmul_with(Isa::detected(), dst, x, m, accumulate);
    }

    /// [`Self::matmul`] on a chosen path (tests force each one; one this CPU lacks runs as
    /// [`Isa::Portable`]).
    pub fn matmul_with(&self, isa: Isa, dst: &mut [f32], x: &[f32], m: usize, accumulate: bool) {
        self.matmul_as(isa, ActivationPrecision::F32, dst, x, m, accumulate);
    }

    /// [`Self::matmul_with`] with the decode activations taken at `precision`.
    pub fn matmul_as(
        &self,
        isa: Isa,
        precision: ActivationPrecision,
        dst: &mut [f32],
        x: &[f32],
        m: usize,
        accumulate: bool,
    ) {
        let (n, k) = (self.rows, self.cols);
        assert!(dst.len() >= m * n && x.len() >= m * k, "Weight::matmul: short buffer");
        // Every kernel below may take `isa`'s instructions: only ones this CPU has.
        let isa = if isa.is_available() { isa } else { Isa::Portable };
        if let Some(w) = self.as_f32() {
            linear(dst, x, w, m, n, k, accumulate);
            return;
        }
        let precision = precision.resolve(isa, self.parts.iter().map(|p| p.ty));
        if m == 0 {
            return;
        }
        let out = Out { ptr: OutPtr(dst.as_mut_ptr()), ldd: n };
        if precision == ActivationPrecision::Int8 && int8::matmul_weight(isa, self, out, x, m, accumulate) {
            return;
        }
        // The integer kernels' activations, rounded once for every part that takes them.
        let xq = match precision {
            #[cfg(target_arch = "x86_64")]
            ActivationPrecision::Int16
                if m < lanes16_min_m(isa)
                    && isa != Isa::Portable
                    && k.is_multiple_of(32)
                    && self.parts.iter().any(|p| int16::supports(p.ty)) =>
            {
                Some(int16::X16::quantize(x, m, k))
            }
            _ => None,
        };
        // Batches over integer-code formats with int16 activations.
        if m >= lanes16_min_m(isa) && precision == ActivationPrecision::Int16 && lanes16::runs_on(isa) {
            let mut col = 0;
            let parts: Vec<(PartRef<'_>, Out)> = self
                .part_refs()
                .map(|p| {
                    col += p.rows;
                    (p, Out { ptr: out.ptr.offset(col - p.rows), ..out })
                })
                .collect();
            if lanes16::matmul_parts(isa, x, m, &parts, accumulate) {
                return;
            }
        }
        // Large prefill chunks over quantized weights (any prefill on the portable path): every
        // part's rows dequantized into slabs for one `gemm` call each (a weight with an f32 part
        // takes the per-part path below).
        if m > panel::slabs_min_m(isa) && !self.parts.iter().any(|p| matches!(p.data, Storage::F32(_))) {
            panel::slabs(isa, out, x, m, &self.part_refs().collect::<Vec<_>>(), accumulate);
            return;
        }
        // Quantized parts of a decode-shaped call run together (one parallel region).
        let mut decode_parts = Vec::new();
        let mut col = 0;
        for (p, part) in self.parts.iter().zip(self.part_refs()) {
            let out = Out { ptr: out.ptr.offset(col), ..out };
            match (&p.data, m <= DECODE_MAX_M) {
                (Storage::F32(w), _) => panel::f32_strided(out, x, m, k, w, p.rows, accumulate),
                (_, true) => decode_parts.push((part, out)),
                (_, false) => panel::matmul(isa, out, x, m, &part, accumulate),
            }
            col += p.rows;
        }
        decode::matmul_parts(isa, xq.as_ref(), x, m, &decode_parts, accumulate);
    }
}

/// The fewest tokens that take [`lanes16`] with int16 activations; fewer take the [`int16`]
/// decode kernels, which read each row once for every token. With VNNI those win up to
/// [`DECODE_MAX_M`]; on AVX2, whose decode kernel takes two tokens a pass, lanes16's eight
/// tokens per vector (and its rows decoded once per call) win from seven tokens on.
fn lanes16_min_m(isa: Isa) -> usize {
    if lanes16::vnni(isa) { DECODE_MAX_M + 1 } else { 7 }
}

/// The activations of a decode call as the SIMD kernels read them: `x[m, k]`, and each
/// token's sum over every group of 32 values (`[m, k/32]`: the offset term of the factored
/// formats), computed once per call rather than in every task.
#[derive(Clone, Copy)]
struct Activations<'a> {
    x: &'a [f32],
    group_sums: &'a [f32],
}

/// A part as the kernels see it: its format, shape and bytes.
#[derive(Clone, Copy)]
struct PartRef<'a> {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &'a [u8],
}

impl PartRef<'_> {
    fn row_bytes(&self) -> usize {
        self.bytes.len() / self.rows.max(1)
    }

    fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes[r * rb..(r + 1) * rb]
    }

    /// Asks for rows `j0..j1` (clamped to the part) in L2, a line at a time: a block of rows
    /// decoded next arrives while the current block's tiles compute.
    fn prefetch_rows(&self, j0: usize, j1: usize) {
        let (j0, j1) = (j0.min(self.rows), j1.min(self.rows));
        let rb = self.row_bytes();
        for line in self.bytes[j0 * rb..j1 * rb].chunks(64) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch of an address inside `bytes`; it never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr().cast())
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = line;
        }
    }
}

/// Where a part's products go: column 0 of the part at `ptr`, rows `ldd` floats apart.
/// Every task writes only its own columns, and `Weight::matmul` checked that `dst` holds
/// `m × ldd` floats.
#[derive(Clone, Copy)]
struct Out {
    ptr: OutPtr,
    ldd: usize,
}

/// One decode task's share of a part: rows `rows` of `part` times tokens `t0 .. t0 + mr`,
/// written into `out` (added to what is there with `accumulate`). Only this task writes those
/// entries.
#[derive(Clone)]
struct RowTask<'a> {
    part: &'a PartRef<'a>,
    rows: std::ops::Range<usize>,
    t0: usize,
    mr: usize,
    out: Out,
    accumulate: bool,
}

impl Out {
    /// Writes (or adds) `v` at (token `t`, column `c`).
    ///
    /// # Safety
    /// `(t, c)` lies inside the part's region and no other task writes it.
    #[inline]
    unsafe fn put(self, t: usize, c: usize, v: f32, accumulate: bool) {
        // SAFETY: per the contract.
        unsafe {
            let d = self.ptr.get().add(t * self.ldd + c);
            *d = if accumulate { *d + v } else { v };
        }
    }
}

impl Isa {
    /// One row of format `ty` (`out.len()` values) into `out`.
    fn dequantize_row(self, ty: GgmlType, row: &[u8], out: &mut [f32]) {
        match self {
            // SAFETY: the features were detected for this variant; `row` is one whole row.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if out.len().is_multiple_of(32) && ty != GgmlType::F32 => unsafe {
                avx2::dequantize_row(ty, row, out)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if out.len().is_multiple_of(32) && ty != GgmlType::F32 => unsafe {
                avx512::dequantize_row(ty, row, out)
            },
            _ => {
                let (per_block, block_bytes) = ty.block();
                for (o, b) in out.chunks_exact_mut(per_block).zip(row.chunks_exact(block_bytes)) {
                    crate::ggml::dequantize_block(ty, b, o);
                }
            }
        }
    }
}
