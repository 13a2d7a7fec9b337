//! The model's vocabulary as llguidance sees it: every token id's bytes in a `TokTrie` (special
//! tokens behind llguidance's marker byte, ids the tokenizer lacks padded up to the logits'
//! width as specials no grammar can reach), the end-of-sequence ids, and tokenization through the
//! model's own tokenizer.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use super::ConstraintError;

/// [`TokenizerEnv`] over the model's tokenizer.
struct Vocab {
    trie: TokTrie,
    tokenizer: model::Tokenizer,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Special-token strings stay text; a tokenizer error falls back to the trie's greedy split.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

/// Builds the token environment for a tokenizer whose model has `model_vocab` logits per row
/// and ends a sequence with any of `eos_ids` (at least one).
pub(crate) fn token_env(
    tokenizer: &model::Tokenizer,
    model_vocab: usize,
    eos_ids: &[u32],
) -> Result<TokEnv, ConstraintError> {
    let unavailable = |reason: String| ConstraintError::Unavailable(reason);
    let json = serde_json::to_value(tokenizer.inner())
        .map_err(|e| unavailable(format!("tokenizer does not serialize: {e}")))?;
    // The reader asserts on malformed vocabularies; a panic there is a model we cannot constrain.
    let mut words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| unavailable("tokenizer vocabulary could not be read".into()))?
        .map_err(|e| unavailable(format!("tokenizer vocabulary: {e}")))?;
    let width = model_vocab.max(words.len());
    while words.len() < width {
        let mut name = format!(".<[{}]>", words.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        words.push(name);
    }
    let vocab_size = u32::try_from(width)
        .map_err(|_| unavailable(format!("vocabulary of {width} tokens is too large")))?;
    let eos: Vec<u32> = eos_ids.iter().copied().filter(|&t| t < vocab_size).collect();
    let Some(&first) = eos.first() else {
        return Err(unavailable("the model has no end-of-sequence token".into()));
    };
    let info = TokRxInfo::new(vocab_size, first);
    let mut trie = TokTrie::from(&info, &words);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(&eos);
    }
    Ok(Arc::new(Vocab { trie, tokenizer: tokenizer.clone() }))
}
