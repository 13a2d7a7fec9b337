//! Batch metadata of [`crate::paged_attention`] and the checks run before any kernel writes.

use kv_cache::LayerCache;

use crate::AttnError;

/// Head sizes the kernels implement.
pub const SUPPORTED_HEAD_SIZES: [usize; 6] = [64, 80, 96, 112, 128, 256];
/// Block sizes (tokens per block) the kernels implement.
pub const SUPPORTED_BLOCK_SIZES: [usize; 3] = [8, 16, 32];
/// Cache dtypes the CUDA attention kernels are instantiated for. An f32 cache stays CPU-only: it
/// would add a third of the compile time of every check for a layout no GPU deployment uses.
pub const CUDA_CACHE_DTYPES: [kv_cache::DType; 2] = [kv_cache::DType::F16, kv_cache::DType::BF16];

/// How a query's scores are formed: `scale · q·k` over the keys it sees, every earlier position
/// (causal) or the last `sliding_window` of them. An `f32` is a causal scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnScores {
    pub scale: f32,
    /// A query at position `p` sees the keys in `(p − w, p]`; `None`: all of `0 ..= p`.
    pub sliding_window: Option<usize>,
}

impl From<f32> for AttnScores {
    fn from(scale: f32) -> Self {
        AttnScores { scale, sliding_window: None }
    }
}

impl AttnScores {
    /// The first position a query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        self.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// Where each sequence's query tokens are and which cached tokens they attend to.
///
/// The block tables are one padded table of rows (`max_blocks_per_seq` entries each); sequence
/// `s` reads row `seq_rows[s]`. That is the shape the engine keeps persistently between steps
/// (`model::runner::BlockTables`: a row per running sequence, updated in place by the
/// scheduler's deltas), so a step hands its table to the kernels without copying it. A batch
/// built for one call (tests, benches) leaves `seq_rows` at `None`: sequence `s` reads row `s`.
///
/// Sequence `s` owns query rows `query_start_loc[s] .. query_start_loc[s + 1]` (a decode step
/// has one); its context is `seq_lens[s]` tokens *including* those query tokens, which
/// `reshape_and_cache` has already written. Query token `i` of the chunk sits at position
/// `seq_lens[s] - query_len + i` and attends causally to positions `0 ..= that`.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttnMetadata<'a> {
    /// `num_seqs + 1` prefix sums over query tokens, starting at 0.
    pub query_start_loc: &'a [usize],
    /// Per sequence: total context length, this step's query tokens included.
    pub seq_lens: &'a [usize],
    /// Flat `[rows, max_blocks_per_seq]` physical block ids; entries past a sequence's
    /// `ceil(seq_len / block_size)` blocks are never read (they may hold anything).
    pub block_tables: &'a [u32],
    /// The row length (stride) of `block_tables`.
    pub max_blocks_per_seq: usize,
    /// Per sequence, its row of `block_tables`; `None`: sequence `s` reads row `s`.
    pub seq_rows: Option<&'a [u32]>,
}

impl PagedAttnMetadata<'_> {
    pub fn num_seqs(&self) -> usize {
        self.seq_lens.len()
    }
    pub fn num_tokens(&self) -> usize {
        self.query_start_loc.last().copied().unwrap_or(0)
    }
    pub(crate) fn query_len(&self, s: usize) -> usize {
        self.query_start_loc[s + 1] - self.query_start_loc[s]
    }
    /// The row sequence `s` reads.
    pub fn row(&self, s: usize) -> usize {
        self.seq_rows.map_or(s, |rows| rows[s] as usize)
    }
    pub(crate) fn block_table(&self, s: usize) -> &[u32] {
        let stride = self.max_blocks_per_seq;
        &self.block_tables[self.row(s) * stride..][..stride]
    }
}

pub(crate) fn check_kernel_shape(cache: &LayerCache) -> Result<(), AttnError> {
    if !SUPPORTED_HEAD_SIZES.contains(&cache.head_size()) {
        return Err(AttnError::UnsupportedHeadSize(cache.head_size()));
    }
    if !SUPPORTED_BLOCK_SIZES.contains(&cache.block_size()) {
        return Err(AttnError::UnsupportedBlockSize(cache.block_size()));
    }
    Ok(())
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), AttnError> {
    if expected == got { Ok(()) } else { Err(AttnError::ShapeMismatch { what, expected, got }) }
}

/// Every slot of a slot mapping is padding (negative) or one of the cache's `num_slots`.
pub(crate) fn check_slots(slots: &[i64], num_slots: usize) -> Result<(), AttnError> {
    match slots.iter().enumerate().find(|&(_, &s)| s >= 0 && s as u64 >= num_slots as u64) {
        Some((token, &slot)) => Err(AttnError::SlotOutOfRange { token, slot, num_slots }),
        None => Ok(()),
    }
}

/// The block-table rows the sequences read exist: `[num_seqs, stride]` for a dense table, or
/// every `seq_rows` entry inside a table of whole rows.
pub(crate) fn check_rows(meta: &PagedAttnMetadata<'_>) -> Result<(), AttnError> {
    let (num_seqs, stride, len) = (meta.seq_lens.len(), meta.max_blocks_per_seq, meta.block_tables.len());
    let Some(rows) = meta.seq_rows else {
        return check_len(
            "block_tables [num_seqs, max_blocks_per_seq]",
            num_seqs.saturating_mul(stride),
            len,
        );
    };
    check_len("seq_rows [num_seqs]", num_seqs, rows.len())?;
    let num_rows = len.checked_div(stride).unwrap_or(0);
    if stride == 0 || len % stride != 0 {
        return Err(AttnError::ShapeMismatch {
            what: "block_tables [rows, max_blocks_per_seq]",
            expected: num_rows.saturating_mul(stride.max(1)),
            got: len,
        });
    }
    if let Some((seq, &row)) = rows.iter().enumerate().find(|(_, r)| **r as usize >= num_rows) {
        return Err(AttnError::RowOutOfRange { seq, row: row as usize, num_rows });
    }
    Ok(())
}

/// Everything `paged_attention` needs to hold before it may write `out`.
pub(crate) fn validate(
    out_len: usize,
    query_len: usize,
    cache: &LayerCache,
    meta: &PagedAttnMetadata<'_>,
    num_heads: usize,
    scores: AttnScores,
) -> Result<(), AttnError> {
    check_kernel_shape(cache)?;
    check_heads_and_scale(num_heads, cache.num_kv_heads(), scores.scale)?;
    if scores.sliding_window == Some(0) {
        return Err(AttnError::ZeroWindow);
    }
    check_query_start_loc(meta)?;
    let row = num_heads * cache.head_size();
    let rows = meta.num_tokens().checked_mul(row).ok_or(AttnError::ShapeMismatch {
        what: "query",
        expected: usize::MAX,
        got: query_len,
    })?;
    check_len("query [num_tokens, num_heads, head_size]", rows, query_len)?;
    check_len("out [num_tokens, num_heads, head_size]", rows, out_len)?;
    check_tables(meta, cache.block_size(), cache.num_blocks())
}

/// `num_heads` query heads share the `num_kv_heads` evenly, and `scale` is finite.
pub(crate) fn check_heads_and_scale(
    num_heads: usize,
    num_kv_heads: usize,
    scale: f32,
) -> Result<(), AttnError> {
    if num_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(AttnError::HeadsNotDivisible { num_heads, num_kv_heads });
    }
    if !scale.is_finite() {
        return Err(AttnError::NonFiniteScale(scale));
    }
    Ok(())
}

/// `query_start_loc` is `num_seqs + 1` non-decreasing prefix sums starting at 0.
pub(crate) fn check_query_start_loc(meta: &PagedAttnMetadata<'_>) -> Result<(), AttnError> {
    let qsl = meta.query_start_loc;
    check_len("query_start_loc (num_seqs + 1)", meta.num_seqs() + 1, qsl.len())?;
    if qsl[0] != 0 {
        return Err(AttnError::InvalidQueryStartLoc(format!("starts at {}, not 0", qsl[0])));
    }
    if let Some(s) = qsl.windows(2).position(|w| w[1] < w[0]) {
        return Err(AttnError::InvalidQueryStartLoc(format!("decreases after sequence {s}")));
    }
    Ok(())
}

/// The block tables of a batch whose `query_start_loc` is checked, against a cache of
/// `num_blocks` blocks of `block_size` tokens (the host-side checks the CPU and the CUDA kernels
/// share): the rows exist, no sequence has more query tokens than context, each sequence's table
/// covers its context, and every block id a kernel will read (those of sequences with query
/// tokens) is in range. Entries past a sequence's blocks are never read: they may hold anything.
pub(crate) fn check_tables(
    meta: &PagedAttnMetadata<'_>,
    block_size: usize,
    num_blocks: usize,
) -> Result<(), AttnError> {
    check_rows(meta)?;
    for (s, &seq_len) in meta.seq_lens.iter().enumerate() {
        let q = meta.query_len(s);
        if q > seq_len {
            return Err(AttnError::QueryLongerThanContext { seq: s, query_len: q, seq_len });
        }
        let needed = seq_len.div_ceil(block_size);
        if needed > meta.max_blocks_per_seq {
            return Err(AttnError::ContextExceedsBlockTable {
                seq: s,
                seq_len,
                needed,
                max_blocks_per_seq: meta.max_blocks_per_seq,
            });
        }
        if q == 0 {
            continue;
        }
        if let Some(&b) = meta.block_table(s)[..needed].iter().find(|&&b| b as usize >= num_blocks) {
            return Err(AttnError::BlockOutOfRange { block: b as u64, num_blocks });
        }
    }
    Ok(())
}
