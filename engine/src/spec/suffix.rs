//! Suffix decoding (vLLM's `method: "suffix"`, after Arctic Inference's SuffixDecoding): the
//! sequence's recent tokens are matched in suffix tries, one over the request's own prompt and
//! output and one over recent requests' outputs, and the draft follows the match's most frequent
//! continuation while its estimated probability stays above a floor; the trie whose draft
//! expects more accepted tokens wins.
//!
//! A [`SuffixTrie`] holds every substring of the sequences fed to it, up to `depth` tokens, as a
//! path from the root, each node counting the occurrences of its string (a suffix tree of bounded
//! depth without path compression). Feeding a token extends the open windows of the sequence
//! (the strings that end at its last token, shorter than `depth`), so a sequence of `n` tokens
//! costs at most `n · depth` node visits over its life. Removing a sequence walks its windows
//! again and frees the nodes whose count falls to zero.

use std::collections::{HashMap, VecDeque};

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    token: u32,
    count: u32,
    first_child: u32,
    next_sibling: u32,
}

/// Every substring of the fed sequences up to `depth` tokens, counted.
#[derive(Debug)]
pub struct SuffixTrie {
    depth: usize,
    /// Node 0 is the root (its children are in `root_children`, a vocabulary's worth).
    nodes: Vec<Node>,
    root_children: HashMap<u32, u32>,
    free: Vec<u32>,
}

/// One sequence's open windows in a trie: the nodes of the strings ending at its last token
/// that are shorter than the depth, with their lengths.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    open: Vec<(u32, usize)>,
}

/// How a draft is grown from a match ([`SuffixTrie::draft`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftRule {
    /// Most tokens.
    pub max_tokens: usize,
    /// At most this many tokens per token of the match (vLLM's
    /// `suffix_decoding_max_spec_factor`).
    pub max_spec_factor: f64,
    /// A token is drafted while the path's estimated probability is at least this (vLLM's
    /// `suffix_decoding_min_token_prob`).
    pub min_token_prob: f64,
}

impl SuffixTrie {
    pub fn new(depth: usize) -> Self {
        let root = Node { token: NONE, count: 0, first_child: NONE, next_sibling: NONE };
        Self { depth: depth.max(2), nodes: vec![root], root_children: HashMap::new(), free: Vec::new() }
    }

    /// Nodes in use, the root aside (what a cache bounds).
    pub fn num_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    fn child(&self, node: u32, token: u32) -> Option<u32> {
        if node == 0 {
            return self.root_children.get(&token).copied();
        }
        let mut c = self.nodes[node as usize].first_child;
        while c != NONE {
            let n = &self.nodes[c as usize];
            if n.token == token {
                return Some(c);
            }
            c = n.next_sibling;
        }
        None
    }

    fn child_or_insert(&mut self, node: u32, token: u32) -> u32 {
        if let Some(c) = self.child(node, token) {
            return c;
        }
        let fresh = Node { token, count: 0, first_child: NONE, next_sibling: NONE };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = fresh;
                id
            }
            None => {
                self.nodes.push(fresh);
                (self.nodes.len() - 1) as u32
            }
        };
        if node == 0 {
            self.root_children.insert(token, id);
        } else {
            self.nodes[id as usize].next_sibling = self.nodes[node as usize].first_child;
            self.nodes[node as usize].first_child = id;
        }
        id
    }

    /// Appends `token` to the sequence whose open windows are `w`.
    pub fn push(&mut self, w: &mut Windows, token: u32) {
        // In place: every window steps to its child, the ones that reach the depth drop out.
        w.open.push((0, 0));
        let mut kept = 0;
        for i in 0..w.open.len() {
            let (node, len) = w.open[i];
            let c = self.child_or_insert(node, token);
            self.nodes[c as usize].count += 1;
            if len + 1 < self.depth {
                w.open[kept] = (c, len + 1);
                kept += 1;
            }
        }
        w.open.truncate(kept);
    }

    /// Appends every token of `tokens`.
    pub fn extend(&mut self, w: &mut Windows, tokens: &[u32]) {
        for &t in tokens {
            self.push(w, t);
        }
    }

    /// Takes a whole sequence fed earlier back out.
    pub fn remove(&mut self, tokens: &[u32]) {
        for start in 0..tokens.len() {
            let mut parent = 0;
            for &t in &tokens[start..(start + self.depth).min(tokens.len())] {
                let Some(c) = self.child(parent, t) else { break };
                let n = &mut self.nodes[c as usize];
                n.count = n.count.saturating_sub(1);
                if n.count == 0 {
                    self.unlink(parent, c);
                }
                parent = c;
            }
        }
    }

    /// Detaches `c` from `parent` and frees it with every node below it (all at count 0: a
    /// child's string occurs only where its parent's does).
    fn unlink(&mut self, parent: u32, c: u32) {
        if parent == 0 {
            self.root_children.remove(&self.nodes[c as usize].token);
        } else if self.nodes[parent as usize].first_child == c {
            self.nodes[parent as usize].first_child = self.nodes[c as usize].next_sibling;
        } else {
            let mut s = self.nodes[parent as usize].first_child;
            while s != NONE && self.nodes[s as usize].next_sibling != c {
                s = self.nodes[s as usize].next_sibling;
            }
            if s != NONE {
                self.nodes[s as usize].next_sibling = self.nodes[c as usize].next_sibling;
            }
        }
        let mut stack = vec![c];
        while let Some(n) = stack.pop() {
            let mut k = self.nodes[n as usize].first_child;
            while k != NONE {
                stack.push(k);
                k = self.nodes[k as usize].next_sibling;
            }
            self.nodes[n as usize] = Node { token: NONE, count: 0, first_child: NONE, next_sibling: NONE };
            self.free.push(n);
        }
    }

    /// How often `s` occurs in the fed sequences (0 when longer than the depth).
    pub fn count(&self, s: &[u32]) -> u32 {
        if s.is_empty() || s.len() > self.depth {
            return 0;
        }
        let mut node = 0;
        for &t in s {
            match self.child(node, t) {
                Some(c) => node = c,
                None => return 0,
            }
        }
        self.nodes[node as usize].count
    }

    /// The draft following `context` into `draft` (cleared first) and its expected number of
    /// accepted tokens (the sum of the path's probabilities): the longest suffix of `context`
    /// that occurs with a continuation (short enough that a whole draft fits the depth), then
    /// the most frequent child, token by token, while the path's probability (each step's count
    /// over its parent's) stays at least `rule.min_token_prob`.
    pub fn draft(&self, context: &[u32], rule: DraftRule, draft: &mut Vec<u32>) -> f64 {
        draft.clear();
        let longest = self.depth.saturating_sub(rule.max_tokens).max(1).min(context.len());
        let found = (1..=longest).rev().find_map(|m| {
            let mut node = 0;
            for &t in &context[context.len() - m..] {
                node = self.child(node, t)?;
            }
            (self.nodes[node as usize].first_child != NONE).then_some((node, m))
        });
        let Some((mut node, m)) = found else { return 0.0 };
        let most = rule.max_tokens.min((rule.max_spec_factor * m as f64).floor() as usize);
        let (mut prob, mut score) = (1.0, 0.0);
        while draft.len() < most {
            let parent = self.nodes[node as usize].count.max(1);
            // The larger count; among equal ones the smaller token, so drafts are repeatable.
            let key = |c: u32| {
                let n = &self.nodes[c as usize];
                (n.count, std::cmp::Reverse(n.token))
            };
            let mut best = NONE;
            let mut c = self.nodes[node as usize].first_child;
            while c != NONE {
                if best == NONE || key(c) > key(best) {
                    best = c;
                }
                c = self.nodes[c as usize].next_sibling;
            }
            if best == NONE {
                break;
            }
            let b = self.nodes[best as usize];
            prob *= f64::from(b.count) / f64::from(parent);
            if prob < rule.min_token_prob {
                break;
            }
            draft.push(b.token);
            score += prob;
            node = best;
        }
        score
    }
}

/// Recent requests' outputs in one trie, the oldest taken out past `max_requests` of them or
/// `max_nodes` nodes.
#[derive(Debug)]
pub struct SuffixCache {
    pub trie: SuffixTrie,
    kept: VecDeque<Vec<u32>>,
    max_requests: usize,
    max_nodes: usize,
}

impl SuffixCache {
    pub fn new(depth: usize, max_requests: usize, max_nodes: usize) -> Self {
        Self { trie: SuffixTrie::new(depth), kept: VecDeque::new(), max_requests, max_nodes }
    }

    /// Adds a finished request's output.
    pub fn add(&mut self, output: Vec<u32>) {
        if output.is_empty() || self.max_requests == 0 {
            return;
        }
        self.trie.extend(&mut Windows::default(), &output);
        self.kept.push_back(output);
        while self.kept.len() > self.max_requests
            || (self.trie.num_nodes() > self.max_nodes && self.kept.len() > 1)
        {
            let Some(old) = self.kept.pop_front() else { break };
            self.trie.remove(&old);
        }
    }

    pub fn num_requests(&self) -> usize {
        self.kept.len()
    }
}

/// One sample's own trie (its prompt and output), fed as its tokens grow, and its output so far
/// (what the cache takes when it finishes).
#[derive(Debug)]
pub struct LocalSuffix {
    pub trie: SuffixTrie,
    windows: Windows,
    fed: usize,
    prompt_len: usize,
    output: Vec<u32>,
}

impl LocalSuffix {
    pub fn new(depth: usize, prompt_len: usize) -> Self {
        let trie = SuffixTrie::new(depth);
        Self { trie, windows: Windows::default(), fed: 0, prompt_len, output: Vec::new() }
    }

    /// Feeds what `tokens` (the whole sequence) adds since the last call.
    pub fn catch_up(&mut self, tokens: &[u32]) {
        let Some(new) = tokens.get(self.fed..) else { return };
        self.trie.extend(&mut self.windows, new);
        let output_from = self.prompt_len.max(self.fed);
        self.output.extend_from_slice(tokens.get(output_from..).unwrap_or_default());
        self.fed = tokens.len();
    }

    /// The output fed so far.
    pub fn take_output(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.output)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn brute_count(seqs: &[Vec<u32>], s: &[u32]) -> u32 {
        seqs.iter().map(|q| q.windows(s.len()).filter(|w| *w == s).count() as u32).sum()
    }

    proptest! {
        /// Every substring's count equals a brute-force count, after feeding sequences and
        /// removing some, and nothing is left once all are removed.
        #[test]
        fn counts_match_brute_force(
            seqs in prop::collection::vec(prop::collection::vec(0u32..4, 0..30), 1..6),
            removed in prop::collection::vec(any::<bool>(), 6),
            depth in 2usize..6,
        ) {
            let mut trie = SuffixTrie::new(depth);
            for s in &seqs {
                let mut w = Windows::default();
                for (i, &t) in s.iter().enumerate() {
                    trie.push(&mut w, t);
                    prop_assert!(w.open.len() <= (i + 1).min(depth - 1));
                }
            }
            let mut kept = Vec::new();
            for (s, &gone) in seqs.iter().zip(&removed) {
                if gone { trie.remove(s) } else { kept.push(s.clone()) }
            }
            for len in 1..=depth {
                for probe in kept.iter().flat_map(|s| s.windows(len)) {
                    prop_assert_eq!(trie.count(probe), brute_count(&kept, probe), "{:?}", probe);
                }
            }
            for s in &kept {
                trie.remove(s);
            }
            prop_assert_eq!(trie.num_nodes(), 0);
        }
    }

    #[test]
    fn a_draft_follows_the_most_frequent_continuation_of_the_longest_match() {
        let rule = DraftRule { max_tokens: 4, max_spec_factor: 4.0, min_token_prob: 0.1 };
        let mut trie = SuffixTrie::new(8);
        // "1 2" is followed by 3 twice and by 9 once; "5 1 2" only by 9.
        trie.extend(&mut Windows::default(), &[1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 2, 9, 8]);
        let mut d = Vec::new();
        let score = trie.draft(&[7, 1, 2], rule, &mut d);
        assert_eq!(d, [3, 4, 1, 2]);
        // 2/3, 2/3, then "1 2 3 4" goes on as "1" or "5" once each: 1/3, 1/3.
        assert!((score - 2.0).abs() < 1e-9, "{score}");
        trie.draft(&[5, 1, 2], rule, &mut d);
        assert_eq!(d, [9, 8], "the longer match wins; the sequence ends after 8");
        // The probability floor stops the draft where the path gets unlikely.
        let strict = DraftRule { min_token_prob: 0.7, ..rule };
        assert_eq!(trie.draft(&[7, 1, 2], strict, &mut d), 0.0);
        assert!(d.is_empty());
        // At most max_spec_factor tokens per matched token; no match, no draft.
        let short = DraftRule { max_spec_factor: 1.0, ..rule };
        trie.draft(&[6, 6, 4], short, &mut d);
        assert_eq!(d, [1]);
        assert_eq!(trie.draft(&[42], rule, &mut d), 0.0);
    }

    #[test]
    fn a_local_trie_catches_up_and_keeps_the_output() {
        let mut local = LocalSuffix::new(4, 3);
        local.catch_up(&[1, 2, 3]);
        local.catch_up(&[1, 2, 3, 4, 5]);
        local.catch_up(&[1, 2, 3, 4, 5, 6]);
        assert_eq!((local.trie.count(&[3, 4, 5, 6]), local.trie.count(&[1, 2])), (1, 1));
        assert_eq!(local.take_output(), [4, 5, 6]);
    }

    #[test]
    fn the_cache_forgets_its_oldest_outputs_past_its_bounds() {
        let mut cache = SuffixCache::new(4, 2, usize::MAX);
        for s in [vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]] {
            cache.add(s);
        }
        assert_eq!((cache.num_requests(), cache.trie.count(&[1, 2]), cache.trie.count(&[7, 8])), (2, 0, 1));
        let mut small = SuffixCache::new(4, 100, 10);
        small.add((0..20).collect());
        small.add((100..104).collect());
        assert_eq!(small.num_requests(), 1, "past the node bound the oldest output goes");
        assert_eq!(small.trie.count(&[100, 101]), 1);
    }
}
