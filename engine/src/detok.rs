//! Incremental detokenization (vLLM's prefix/read-offset scheme): each new token yields the
//! text it adds, never half a UTF-8 character, and the concatenated deltas equal the
//! decoding of the whole output. Stop strings are matched on the growing text, and while
//! a request has stop strings the last `longest - 1` bytes are held back from the stream,
//! so a stop string is never sent and later retracted.

/// A tokenizer that can turn ids back into text (implemented for `tokenizers::Tokenizer`).
pub trait TokenDecoder {
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, DetokenizeError>;
}

impl TokenDecoder for model::Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, DetokenizeError> {
        self.decode(ids, skip_special_tokens).map_err(|e| DetokenizeError(e.to_string()))
    }
}

impl TokenDecoder for tokenizers::Tokenizer {
    fn decode_ids(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, DetokenizeError> {
        self.decode(ids, skip_special_tokens).map_err(|e| DetokenizeError(e.to_string()))
    }
}

/// The tokenizer failed to decode ids (e.g. an id outside its vocabulary).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("detokenization failed: {0}")]
pub struct DetokenizeError(pub String);

/// How many prompt tokens to keep as left context: byte-level and sentencepiece decoders
/// render a token differently at the start of a text (vLLM's `INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET`).
const PROMPT_CONTEXT: usize = 5;

/// Where a stop string was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
    /// Index into the request's stop strings.
    pub index: usize,
}

/// Per-sequence detokenization and stop-string state.
#[derive(Debug, Clone)]
pub struct IncrementalDetokenizer {
    /// Last few prompt tokens, then every output token.
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    /// The output text so far (truncated at a stop string once one is found).
    text: String,
    /// Bytes of `text` already handed to the caller.
    emitted: usize,
    stop: Vec<String>,
    include_stop_str: bool,
    /// Bytes to hold back from the stream while a stop string may still be completed.
    hold_back: usize,
}

impl IncrementalDetokenizer {
    pub fn new(prompt: &[u32], skip_special_tokens: bool, stop: Vec<String>, include_stop_str: bool) -> Self {
        let context = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        let hold_back = if include_stop_str {
            0
        } else {
            stop.iter().map(String::len).max().unwrap_or(0).saturating_sub(1)
        };
        Self {
            tokens: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            skip_special_tokens,
            text: String::new(),
            emitted: 0,
            stop,
            include_stop_str,
            hold_back,
        }
    }

    /// The whole output text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds one generated token; returns the stop string it completed, if any (the text is
    /// then cut before it, or after it with `include_stop_str_in_output`). With `check_stop`
    /// false (before `min_tokens`) stop strings are not looked for.
    pub fn push(
        &mut self,
        token: u32,
        decoder: &impl TokenDecoder,
        check_stop: bool,
    ) -> Result<Option<StopMatch>, DetokenizeError> {
        self.tokens.push(token);
        let prefix = decoder
            .decode_ids(&self.tokens[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = decoder.decode_ids(&self.tokens[self.prefix_offset..], self.skip_special_tokens)?;
        // A trailing U+FFFD means the last token ended inside a UTF-8 character: wait for more.
        if full.len() <= prefix.len() || full.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let delta = match full.strip_prefix(prefix.as_str()) {
            Some(d) => d,
            // The decoder re-rendered the context (rare): fall back to a char count, as vLLM does.
            None => full.char_indices().nth(prefix.chars().count()).map_or("", |(i, _)| &full[i..]),
        };
        let new_len = delta.len();
        self.text.push_str(delta);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        Ok(if check_stop { self.find_stop(new_len) } else { None })
    }

    /// At the end of a sequence: adds the text of tokens still held back because they end
    /// inside a UTF-8 character (rendered as U+FFFD, as a full decode would show them).
    pub fn flush(&mut self, decoder: &impl TokenDecoder) -> Result<(), DetokenizeError> {
        if self.read_offset >= self.tokens.len() {
            return Ok(());
        }
        let prefix = decoder
            .decode_ids(&self.tokens[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = decoder.decode_ids(&self.tokens[self.prefix_offset..], self.skip_special_tokens)?;
        let delta = match full.strip_prefix(prefix.as_str()) {
            Some(d) => d,
            None => full.char_indices().nth(prefix.chars().count()).map_or("", |(i, _)| &full[i..]),
        };
        self.text.push_str(delta);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        Ok(())
    }

    /// Looks for a stop string that ends inside the newest `new_len` bytes.
    fn find_stop(&mut self, new_len: usize) -> Option<StopMatch> {
        let text_len = self.text.len();
        let mut best: Option<(usize, usize)> = None; // (byte position, stop index)
        for (index, s) in self.stop.iter().enumerate() {
            // Only matches that end in the new bytes are new.
            let mut from = text_len.saturating_sub(new_len + s.len() - 1);
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(pos) = self.text[from..].find(s.as_str()) {
                let pos = from + pos;
                if best.is_none_or(|(b, _)| pos < b) {
                    best = Some((pos, index));
                }
            }
        }
        let (pos, index) = best?;
        let end = if self.include_stop_str { pos + self.stop[index].len() } else { pos };
        self.text.truncate(end);
        self.emitted = self.emitted.min(end);
        Some(StopMatch { index })
    }

    /// Text not yet handed out, keeping back what could still turn into a stop string
    /// unless `finished`.
    pub fn take_delta(&mut self, finished: bool) -> String {
        let mut end = if finished { self.text.len() } else { self.text.len().saturating_sub(self.hold_back) };
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        if end <= self.emitted {
            return String::new();
        }
        let delta = self.text[self.emitted..end].to_owned();
        self.emitted = end;
        delta
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The tiny test model's byte-level BPE tokenizer: the 256 single bytes, a few merges and
    /// ChatML special tokens (260 is `<|endoftext|>`), so multi-byte characters span several
    /// tokens.
    pub(crate) fn byte_tokenizer() -> tokenizers::Tokenizer {
        match tokenizers::Tokenizer::from_bytes(model::testing::tokenizer_json()) {
            Ok(t) => t,
            Err(e) => panic!("test tokenizer: {e}"),
        }
    }

    pub(crate) fn encode(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        tok.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
    }

    fn stream(text: &str, stop: &[&str], include: bool) -> (Vec<String>, String, Option<StopMatch>) {
        let tok = byte_tokenizer();
        let ids = encode(&tok, text);
        let mut d = IncrementalDetokenizer::new(
            &encode(&tok, "prompt"),
            true,
            stop.iter().map(|s| s.to_string()).collect(),
            include,
        );
        let mut deltas = Vec::new();
        let mut hit = None;
        for &id in &ids {
            hit = d.push(id, &tok, true).unwrap_or(None);
            let delta = d.take_delta(hit.is_some());
            deltas.push(delta);
            if hit.is_some() {
                break;
            }
        }
        deltas.push(d.take_delta(true));
        (deltas, d.text().to_owned(), hit)
    }

    #[test]
    fn tokenizer_round_trips_and_splits_characters() {
        let tok = byte_tokenizer();
        let ids = encode(&tok, "hello wörld 😀");
        assert!(ids.contains(&258), "merge used: {ids:?}");
        // 17 bytes; merges "hell" and "Ġw" save four tokens, '😀' stays four byte tokens.
        assert_eq!(ids.len(), 13);
        assert_eq!(tok.decode_ids(&ids, true).unwrap_or_default(), "hello wörld 😀");
    }

    #[test]
    fn deltas_never_split_a_character_and_concatenate_to_the_text() {
        let text = "héllo wörld 😀 日本語 ok";
        let (deltas, full, hit) = stream(text, &[], false);
        assert_eq!(hit, None);
        assert_eq!(full, text);
        assert_eq!(deltas.concat(), text);
        assert!(deltas.iter().all(|d| !d.contains(char::REPLACEMENT_CHARACTER)));
        // The emoji arrives whole in a single delta.
        assert!(deltas.iter().any(|d| d.contains('😀')));
    }

    #[test]
    fn flush_renders_a_dangling_partial_character() {
        let tok = byte_tokenizer();
        let ids = encode(&tok, "ok 😀");
        let mut d = IncrementalDetokenizer::new(&[], true, vec![], false);
        // Stop two bytes into the emoji.
        for &id in &ids[..ids.len() - 2] {
            let _ = d.push(id, &tok, true);
        }
        assert_eq!(d.take_delta(false), "ok ");
        assert!(d.flush(&tok).is_ok());
        let rest = d.take_delta(true);
        assert_eq!(format!("ok {rest}"), tok.decode_ids(&ids[..ids.len() - 2], true).unwrap_or_default());
        assert!(rest.contains(char::REPLACEMENT_CHARACTER));
    }

    #[test]
    fn stop_strings_are_not_checked_before_min_tokens() {
        let tok = byte_tokenizer();
        let mut d = IncrementalDetokenizer::new(&[], true, vec!["b".into()], false);
        for id in encode(&tok, "abab") {
            assert_eq!(d.push(id, &tok, false).unwrap_or(None), None);
        }
        assert_eq!(d.push(encode(&tok, "b")[0], &tok, true).unwrap_or(None), Some(StopMatch { index: 0 }));
        assert_eq!(d.text(), "abab");
    }

    #[test]
    fn special_tokens_are_skipped() {
        let tok = byte_tokenizer();
        let mut d = IncrementalDetokenizer::new(&[], true, vec![], false);
        let mut out = String::new();
        for id in encode(&tok, "ab").into_iter().chain([260]) {
            let _ = d.push(id, &tok, true);
            out += &d.take_delta(false);
        }
        assert_eq!(out, "ab");
        let mut keep = IncrementalDetokenizer::new(&[], false, vec![], false);
        let _ = keep.push(260, &tok, true);
        assert_eq!(keep.take_delta(true), "<|endoftext|>");
    }

    #[test]
    fn stop_string_is_cut_and_never_streamed() {
        let (deltas, full, hit) = stream("one two STOP three", &["STOP", "zzz"], false);
        assert_eq!(hit, Some(StopMatch { index: 0 }));
        assert_eq!(full, "one two ");
        assert_eq!(deltas.concat(), "one two ");
    }

    #[test]
    fn stop_string_can_be_kept() {
        let (deltas, full, hit) = stream("one two STOP three", &["STOP"], true);
        assert_eq!(hit, Some(StopMatch { index: 0 }));
        assert_eq!(full, "one two STOP");
        assert_eq!(deltas.concat(), full);
    }

    #[test]
    fn earliest_stop_string_wins_and_multibyte_stops_work() {
        let (_, full, hit) = stream("abc 😀 def", &["def", "😀"], false);
        assert_eq!(hit, Some(StopMatch { index: 1 }));
        assert_eq!(full, "abc ");
        // A stop string that appears only when two deltas meet.
        let (_, full, hit) = stream("xxyyzz", &["yz"], false);
        assert_eq!(hit, Some(StopMatch { index: 0 }));
        assert_eq!(full, "xxy");
    }

    #[test]
    fn leading_space_after_prompt_is_kept() {
        let tok = byte_tokenizer();
        let mut d = IncrementalDetokenizer::new(&encode(&tok, "Hi"), true, vec![], false);
        for id in encode(&tok, " there") {
            let _ = d.push(id, &tok, true);
        }
        assert_eq!(d.take_delta(true), " there");
    }
}
