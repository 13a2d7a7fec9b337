//! `tokenizer.json` through the `tokenizers` crate, with the two switches the goldens and the
//! engine need: whether special-token strings in the text become their ids, and whether the
//! post-processor adds BOS/EOS.

use std::path::Path;

use crate::error::{ModelError, Result};

/// A loaded Hugging Face tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    /// Splits special-token strings like `<|im_start|>` out of the text (HF's default).
    parsing: tokenizers::Tokenizer,
    /// Treats special-token strings as plain text.
    literal: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_bytes(&bytes, path)
    }

    /// A `tokenizer.json` document already in memory; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let parsing = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| ModelError::Tokenizer { path: path.to_path_buf(), reason: e.to_string() })?;
        let mut literal = parsing.clone();
        literal.set_encode_special_tokens(true);
        Ok(Self { parsing, literal })
    }

    /// Text to ids. `parse_special`: special-token strings become their ids;
    /// `add_special`: the post-processor's BOS/EOS are added.
    pub fn encode(&self, text: &str, parse_special: bool, add_special: bool) -> Result<Vec<u32>> {
        let tok = if parse_special { &self.parsing } else { &self.literal };
        let enc = tok.encode_fast(text, add_special).map_err(|e| ModelError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids to text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.parsing.decode(ids, skip_special).map_err(|e| ModelError::Tokenize(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.parsing.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.parsing.id_to_token(id)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.parsing.get_vocab_size(true)
    }

    /// The underlying `tokenizers` object (e.g. for `decode_stream` in streaming output).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.parsing
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`), in byte order: how byte-level BPE
/// vocabularies spell each of the 256 bytes (printable ones as themselves, the rest as
/// characters from U+0100 on). For writing such vocabularies, e.g. test tokenizers.
pub fn gpt2_byte_alphabet() -> Vec<char> {
    let mut printable: Vec<u32> = ('!' as u32..='~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = printable.into_iter().zip(chars).collect();
    pairs.sort_unstable();
    pairs.into_iter().filter_map(|(_, c)| char::from_u32(c)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_alphabet_is_gpt2s() {
        let a = super::gpt2_byte_alphabet();
        assert_eq!(a.len(), 256);
        assert_eq!(a.iter().collect::<std::collections::HashSet<_>>().len(), 256);
        assert_eq!((a[b'A' as usize], a[0], a[b' ' as usize], a[0xAD]), ('A', 'Ā', 'Ġ', 'Ń'));
    }
}
