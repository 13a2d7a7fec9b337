//! [`KvLayout`]: how a model's layers share the KV cache — vLLM's hybrid KV cache with
//! uniform pages. Layers of one attention kind (full, or a sliding window of `w` tokens) are
//! split into groups of the same size `g` (the gcd of the kinds' layer counts); the cache holds
//! `g` layer tensors ("slots") over one block pool, and layer `i` of every group stores its
//! keys and values in slot `i`. A block belongs to one group at a time (its table), so its
//! page in each slot holds that group's layer. A sliding group then frees the blocks that fall
//! out of its window for any other group to use.
//!
//! A model without windows is one group of every layer: slot `l` is layer `l`.
//!
//! The model's runner serves with this layout and the capacity simulator counts memory in it,
//! so both follow the one grouping rule.

/// Where one layer's KV lives: its group's block table and its slot (layer tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPlace {
    pub group: usize,
    pub slot: usize,
}

/// The groups (each with its window) and every layer's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    windows: Vec<Option<usize>>,
    places: Vec<LayerPlace>,
    slots: usize,
}

impl KvLayout {
    /// Every layer in one full-attention group (layer `l` in slot `l`).
    pub fn one_group(num_layers: usize) -> Self {
        KvLayout {
            windows: vec![None],
            places: (0..num_layers).map(|slot| LayerPlace { group: 0, slot }).collect(),
            slots: num_layers,
        }
    }

    /// Groups of equal size by attention kind, given each layer's sliding window (`None`: full
    /// attention); one group when every layer attends alike. Group 0 is the first layer's kind.
    pub fn hybrid(layer_windows: &[Option<usize>]) -> Self {
        let mut kinds: Vec<(Option<usize>, usize)> = Vec::new();
        for &window in layer_windows {
            match kinds.iter_mut().find(|(w, _)| *w == window) {
                Some((_, n)) => *n += 1,
                None => kinds.push((window, 1)),
            }
        }
        if kinds.len() <= 1 {
            let mut layout = Self::one_group(layer_windows.len());
            layout.windows = vec![kinds.first().and_then(|k| k.0)];
            return layout;
        }
        let size = kinds.iter().fold(0, |g, &(_, n)| gcd(g, n));
        // Per kind, the next group to fill and how full it is.
        let mut first_group = Vec::with_capacity(kinds.len());
        let mut windows = Vec::new();
        for &(w, n) in &kinds {
            first_group.push(windows.len());
            windows.extend(std::iter::repeat_n(w, n / size));
        }
        let mut seen = vec![0usize; kinds.len()];
        let places = layer_windows
            .iter()
            .map(|window| {
                let k = kinds.iter().position(|(w, _)| w == window).unwrap_or(0);
                let i = seen[k];
                seen[k] += 1;
                LayerPlace { group: first_group[k] + i / size, slot: i % size }
            })
            .collect();
        KvLayout { windows, places, slots: size }
    }

    /// Per group, its sliding window (`None`: full attention): the scheduler's `kv_groups`.
    pub fn group_windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// Layer tensors the cache holds (layers per group).
    pub fn num_slots(&self) -> usize {
        self.slots
    }

    pub fn num_layers(&self) -> usize {
        self.places.len()
    }

    /// Layer `layer`'s group and slot (layer 0's place past the last layer: callers index
    /// layers they own).
    #[inline]
    pub fn place(&self, layer: usize) -> LayerPlace {
        self.places.get(layer).copied().unwrap_or(LayerPlace { group: 0, slot: 0 })
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(pattern: &str, window: usize) -> Vec<Option<usize>> {
        pattern.chars().map(|c| (c == 's').then_some(window)).collect()
    }

    #[test]
    fn gemma3_groups_three_layers_a_page_and_every_slot_is_used_once_per_group() {
        // Gemma 3 270M: 18 layers, every sixth global.
        let l = layers("sssssfsssssfsssssf", 512);
        let layout = KvLayout::hybrid(&l);
        assert_eq!(layout.num_slots(), 3);
        assert_eq!(layout.group_windows(), &[Some(512), Some(512), Some(512), Some(512), Some(512), None]);
        let mut seen = std::collections::HashSet::new();
        for (i, a) in l.iter().enumerate() {
            let p = layout.place(i);
            assert!(seen.insert((p.group, p.slot)), "layer {i} shares a page");
            assert_eq!(layout.group_windows()[p.group], *a);
        }
        assert_eq!(seen.len(), 18);
    }

    #[test]
    fn one_kind_is_one_group_layer_for_slot() {
        for (pattern, window) in [("ffff", None), ("sss", Some(32))] {
            let layout = KvLayout::hybrid(&layers(pattern, 32));
            assert_eq!((layout.group_windows(), layout.num_slots()), (&[window][..], pattern.len()));
            assert_eq!(layout.place(2), LayerPlace { group: 0, slot: 2 });
        }
        // Uneven kinds: gcd(2, 3) = 1, one layer a group.
        let layout = KvLayout::hybrid(&layers("sfsfs", 8));
        assert_eq!((layout.num_groups(), layout.num_slots()), (5, 1));
    }
}
