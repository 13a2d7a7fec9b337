//! The n-gram proposer (prompt lookup): the sequence's last `n` tokens, for the longest `n` in
//! `min_n..=max_n` that occurred earlier in the sequence, and the `k` tokens that followed their
//! latest earlier occurrence. Answers that copy from their prompt (extraction, code edits,
//! quotes) are where it pays.

/// Proposes up to `k` tokens to follow `tokens` into `draft` (nothing without a match).
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize, draft: &mut Vec<u32>) {
    let len = tokens.len();
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // The latest earlier occurrence that has at least one token after it.
        if let Some(start) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix) {
            let from = start + n;
            draft.extend_from_slice(&tokens[from..(from + k).min(len)]);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposed(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
        let mut d = Vec::new();
        propose(tokens, min_n, max_n, k, &mut d);
        d
    }

    #[test]
    fn the_longest_suffix_match_proposes_what_followed_it() {
        // "1 2 3" occurred before, followed by 4 5 6; the 1-gram "3" alone also matches.
        let t = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3];
        assert_eq!(proposed(&t, 1, 3, 2), [4, 5]);
        assert_eq!(proposed(&t, 1, 3, 8), [4, 5, 6, 9, 1, 2, 3], "stops at the sequence's end");
        // The latest occurrence wins among equal lengths.
        assert_eq!(proposed(&[7, 1, 7, 2, 7], 1, 1, 1), [2]);
        // Too short for min_n, or no earlier occurrence: nothing.
        assert!(proposed(&t, 4, 5, 2).is_empty());
        assert!(proposed(&[1, 2, 3], 1, 3, 2).is_empty());
        assert!(proposed(&[], 1, 3, 2).is_empty());
        assert!(proposed(&[5], 1, 3, 2).is_empty());
    }
}
