//! SentencePiece-style GGUF vocabularies (`tokenizer.ggml.model = llama`: Llama 2, Gemma) as
//! the parts of a `tokenizer.json` that tokenize and detokenize as llama.cpp's SPM tokenizer
//! does: a byte-fallback BPE whose merges come from the token scores, a normalizer writing
//! spaces as `▁`, and a decoder undoing it.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde_json::{Value, json};

/// SentencePiece's visible space: llama.cpp writes every `' '` of a text fragment as this
/// before merging, and turns it back into `' '` when a normal token is detokenized.
const SPACE: &str = "\u{2581}";

/// BPE merges that reproduce llama.cpp's SPM tokenizer, as `(left, right)` token strings in
/// rank order.
///
/// llama.cpp starts from the fragment's characters and repeatedly joins the adjacent pair whose
/// concatenation is a token of the highest score (the leftmost pair among equal ones). A BPE
/// with one merge `(l, r)` for every split of every token into two tokens, ranked by the joined
/// token's score, makes the same choices: `tokenizers` applies the lowest rank first and the
/// leftmost pair among equal ranks. The one difference: two *different* tokens of equal score
/// that could both be formed at the same step are taken in id order here and in text order
/// there; scores of Gemma's normal tokens are all distinct, the ties are among control,
/// user-defined and byte tokens, which merges hardly ever form.
pub(super) fn merges_from_scores(tokens: &[String], scores: &[f32]) -> Vec<[String; 2]> {
    // llama.cpp looks texts up in a map where a later duplicate replaces an earlier one; so
    // does the `vocab` object of the JSON.
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut ranked: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (&text, &id) in &ids {
        for (split, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                // `+ 0.0` makes -0.0 equal to 0.0, as llama.cpp's comparison sees them.
                ranked.push((scores.get(id).copied().unwrap_or(0.0) + 0.0, id, li, ri));
            }
        }
    }
    ranked.sort_unstable_by(|a, b| {
        b.0.partial_cmp(&a.0).unwrap_or(Ordering::Equal).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3)))
    });
    ranked.into_iter().map(|(_, _, l, r)| [tokens[l].clone(), tokens[r].clone()]).collect()
}

/// The normalizer: llama.cpp's `llama_escape_whitespace` (every `' '` becomes `▁`), after a
/// `▁` put before each text fragment when the vocabulary has `add_space_prefix` (llama.cpp
/// prefixes the text's start and every fragment after a special token: exactly the pieces
/// `tokenizers` normalizes one by one, between its added tokens).
pub(super) fn normalizer(add_space_prefix: bool) -> Value {
    let mut steps = Vec::new();
    if add_space_prefix {
        steps.push(json!({"type": "Prepend", "prepend": SPACE}));
    }
    steps.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE}));
    json!({"type": "Sequence", "normalizers": steps})
}

/// The decoder: `▁` back to `' '` and `<0xNN>` byte tokens back to bytes (joined into UTF-8
/// across tokens). No space is stripped, even with `add_space_prefix`: llama.cpp strips it only
/// from a sequence that does not start with BOS (`detokenize`'s `remove_space`), and its
/// per-token pieces, what a server streams, never.
pub(super) fn decoder() -> Value {
    json!({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]})
}

/// The model: BPE over the whole fragment (llama.cpp does not pre-split SPM text), a character
/// missing from the vocabulary spelled as its UTF-8 bytes' `<0xNN>` tokens.
pub(super) fn model(
    vocab: serde_json::Map<String, Value>,
    merges: Vec<[String; 2]>,
    unk: Option<&str>,
) -> Value {
    json!({
        "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true, "ignore_merges": false,
        "vocab": vocab, "merges": merges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufVocab, VocabModel};

    /// A small SPM vocabulary with every byte token, `<s>` as BOS and `<t>` user-defined.
    fn vocab(add_space_prefix: bool) -> GgufVocab {
        let mut tokens = strings(&["<unk>", "<s>", "</s>", "<t>"]);
        let mut types = vec![2, 3, 3, 4];
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        types.extend([6; 256]);
        let pieces =
            ["▁", "h", "e", "l", "o", "w", "r", "d", "ll", "▁h", "▁w", "llo", "▁he", "▁hello", "or", "▁wor"];
        tokens.extend(strings(&pieces));
        types.extend(vec![1; pieces.len()]);
        let mut scores = vec![0.0; tokens.len()];
        let n = scores.len();
        for (i, s) in scores[n - pieces.len()..].iter_mut().enumerate() {
            *s = -(i as f32);
        }
        GgufVocab {
            model: VocabModel::Llama,
            tokens,
            token_types: types,
            merges: Vec::new(),
            scores,
            pre: "default".into(),
            add_space_prefix,
            bos_token_id: Some(1),
            eos_token_id: Some(2),
            unk_token_id: Some(0),
            pad_token_id: None,
            add_bos_token: true,
            add_eos_token: false,
            chat_template: None,
        }
    }

    #[test]
    fn a_space_prefix_goes_before_the_text_and_after_each_special_token() {
        let dir = std::path::Path::new("spm-test");
        let t = vocab(true).tokenizer(dir).unwrap();
        let id = |s: &str| t.token_to_id(s).unwrap();
        let (hello, wor, l, d, bos, user) = (id("▁hello"), id("▁wor"), id("l"), id("d"), 1, 3);
        assert_eq!(t.encode("hello world", true, true).unwrap(), [bos, hello, wor, l, d]);
        // After a special or user-defined token, llama.cpp prefixes the next fragment again.
        assert_eq!(
            t.encode("hello<s>world<t>hello", true, false).unwrap(),
            [hello, bos, wor, l, d, user, hello]
        );
        // Not parsing special tokens, `<s>` is text: "<" is no token, so its byte; "s" and ">" too.
        let lt = id("<0x3C>");
        assert_eq!(t.encode("<s>", false, false).unwrap(), [id("▁"), lt, id("<0x73>"), id("<0x3E>")]);
        // The prefix's space stays in the text, as in llama.cpp's pieces after BOS.
        assert_eq!(t.decode(&[bos, hello, wor, l, d], true).unwrap(), " hello world");
        let plain = vocab(false).tokenizer(dir).unwrap();
        assert_eq!(
            plain.encode("hello world", true, true).unwrap(),
            [bos, id("h"), id("e"), id("llo"), wor, l, d]
        );
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn merges_are_every_split_ranked_by_the_joined_score() {
        let tokens = strings(&["a", "b", "c", "ab", "bc", "abc"]);
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let merges = merges_from_scores(&tokens, &scores);
        let pairs: Vec<(&str, &str)> = merges.iter().map(|[l, r]| (l.as_str(), r.as_str())).collect();
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }

    #[test]
    fn negative_zero_ties_with_zero_and_splits_are_at_characters() {
        // "é" is two bytes: no split inside it; "xé" (score -0.0) ties with "é▁" (0.0), so
        // the lower id comes first.
        let tokens = strings(&["x", "é", "▁", "xé", "é▁"]);
        let scores = [0.0, 0.0, 0.0, -0.0, 0.0];
        let merges = merges_from_scores(&tokens, &scores);
        assert_eq!(merges, [["x".to_owned(), "é".to_owned()], ["é".to_owned(), "▁".to_owned()]]);
    }
}
