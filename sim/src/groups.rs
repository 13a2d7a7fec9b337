//! [`KvGroups`]: a model shape's KV cache groups as the engine lays them out (vLLM's hybrid KV
//! cache): layers of one kind (full, or a sliding window) split into groups of the same size
//! (the gcd of the kinds' layer counts), a block spanning one layer tensor per group member.
//! The capacity of KV memory is then counted in those blocks, and the scheduler keeps a table
//! per group, freeing what leaves a window.

use kv_cache::KvLayout;

use crate::cost::ModelShape;

/// Groups and the layer tensors one block spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGroups {
    pub full_groups: usize,
    pub sliding_groups: usize,
    /// Tokens a sliding group's query sees (0 without sliding groups).
    pub window: usize,
    /// Layer tensors one block spans (layers per group).
    pub layers_per_block: usize,
    pub num_layers: usize,
}

impl KvGroups {
    /// Every layer in one full-attention group (capacity counts as before: a block holds every
    /// layer of its tokens).
    pub const ONE_FULL: KvGroups =
        KvGroups { full_groups: 1, sliding_groups: 0, window: 0, layers_per_block: 1, num_layers: 1 };

    /// The engine's layout of `shape`: its sliding layers (if any) apart from its full ones.
    pub fn of(shape: &ModelShape) -> Self {
        let layers = shape.num_layers.max(1);
        let sliding = if shape.sliding_window == 0 { 0 } else { shape.sliding_layers.min(layers) };
        // The engine's own grouping rule, on the layers listed sliding first.
        let windows: Vec<Option<usize>> = std::iter::repeat_n(Some(shape.sliding_window), sliding)
            .chain(std::iter::repeat_n(None, layers - sliding))
            .collect();
        let layout = KvLayout::hybrid(&windows);
        let groups = layout.group_windows();
        KvGroups {
            full_groups: groups.iter().filter(|w| w.is_none()).count(),
            sliding_groups: groups.iter().filter(|w| w.is_some()).count(),
            window: if sliding == 0 { 0 } else { shape.sliding_window },
            layers_per_block: layout.num_slots(),
            num_layers: layers,
        }
    }

    /// The scheduler's `kv_groups`: per group, its window (sliding groups first).
    pub fn windows(&self) -> Vec<Option<usize>> {
        let sliding = std::iter::repeat_n(Some(self.window), self.sliding_groups);
        sliding.chain(std::iter::repeat_n(None, self.full_groups)).collect()
    }

    /// Blocks of `block_size` in memory that holds `tokens` tokens of every layer.
    pub fn blocks_in(&self, tokens: usize, block_size: usize) -> usize {
        let pages = tokens as u128 * self.num_layers as u128 / self.layers_per_block.max(1) as u128;
        (pages / block_size.max(1) as u128).min(usize::MAX as u128) as usize
    }

    /// Blocks one sequence of `len` tokens holds once it is past its prompt: every block in a
    /// full group, the window's (plus the partial block at each end) in a sliding one.
    pub fn blocks_per_sequence(&self, len: usize, block_size: usize) -> usize {
        let all = len.div_ceil(block_size.max(1));
        let window = (self.window.saturating_sub(1)).div_ceil(block_size.max(1)) + 1;
        self.full_groups * all + self.sliding_groups * all.min(window)
    }

    /// Tokens of every layer that `blocks` blocks of `block_size` hold.
    pub fn tokens_in(&self, blocks: usize, block_size: usize) -> usize {
        let pages = blocks as u128 * block_size as u128 * self.layers_per_block as u128;
        (pages / self.num_layers.max(1) as u128).min(usize::MAX as u128) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_is_five_sliding_groups_and_one_full_of_three_layers() {
        let g = KvGroups::of(&ModelShape::GEMMA3_270M);
        assert_eq!((g.sliding_groups, g.full_groups, g.layers_per_block, g.window), (5, 1, 3, 512));
        assert_eq!(g.windows().len(), 6);
        // The same memory: six times the blocks of a full layout's, each a sixth the size.
        assert_eq!(g.blocks_in(1_600, 16), 600);
        assert_eq!(g.tokens_in(600, 16), 1_600);
        // A 32k sequence: 2 048 full blocks and 33 of each window (the allocator's count).
        assert_eq!(g.blocks_per_sequence(32_768, 16), 2_048 + 5 * 33);
        let plain = KvGroups::of(&ModelShape::LLAMA2_7B);
        assert_eq!((plain.windows(), plain.blocks_in(1_600, 16)), (vec![None], 100));
    }
}
