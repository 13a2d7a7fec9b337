//! Reasoning output (`--reasoning-parser`, vLLM's names): a chat answer's `<think>…</think>` span
//! is sent as `reasoning_content`, the rest as `content`, in whole responses and in streamed
//! deltas alike: a whole text is split by running the streaming splitter over it, so the two
//! never disagree.
//!
//! - `qwen3`: an answer that opens with `<think>` reasons until `</think>`; one that does not
//!   (thinking switched off, `enable_thinking: false`) is all content.
//! - `deepseek_r1`: the answer reasons from its start (the template opened the `<think>`; a
//!   leading `<think>` the model writes itself is dropped) until `</think>`.
//!
//! An answer cut off before its `</think>` is all reasoning under either parser (what it was
//! doing when it stopped).

use std::borrow::Cow;

use engine::CompletionDelta;

/// Which reasoning format the served model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParser {
    #[value(name = "qwen3")]
    Qwen3,
    #[value(name = "deepseek_r1")]
    DeepseekR1,
}

const START: &str = "<think>";
const END: &str = "</think>";

/// One choice's text split so far, or one delta's share of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningParser {
    /// The span a constrained answer may reason in first (`Constraint::AfterReasoning`).
    pub fn span(self) -> engine::ReasoningSpan {
        engine::ReasoningSpan {
            start: START.into(),
            end: END.into(),
            opened: self == ReasoningParser::DeepseekR1,
        }
    }

    /// A whole answer's reasoning and content (`None` where empty).
    pub fn split(self, text: &str) -> (Option<String>, Option<String>) {
        let mut stream = ReasoningStream::new(self);
        let mut whole = stream.push(text);
        let rest = stream.finish();
        whole.reasoning.push_str(&rest.reasoning);
        whole.content.push_str(&rest.content);
        let some = |s: String| (!s.is_empty()).then_some(s);
        (some(whole.reasoning), some(whole.content))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decided yet: the text so far could still be (the start of) `<think>`.
    Opening,
    Reasoning,
    Content,
}

/// One streamed choice's splitter: text that may be the start of a tag is held back until the
/// next delta (or the end) decides it.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    parser: ReasoningParser,
    phase: Phase,
    pending: String,
}

impl ReasoningStream {
    pub fn new(parser: ReasoningParser) -> Self {
        Self { parser, phase: Phase::Opening, pending: String::new() }
    }

    /// The share of `delta` (with what was held back) that can be sent now.
    pub fn push(&mut self, delta: &str) -> Split {
        self.pending.push_str(delta);
        let mut out = Split::default();
        loop {
            match self.phase {
                Phase::Opening => {
                    if let Some(rest) = self.pending.strip_prefix(START) {
                        self.pending = rest.to_owned();
                        self.phase = Phase::Reasoning;
                    } else if START.starts_with(self.pending.as_str()) {
                        return out;
                    } else {
                        self.phase = match self.parser {
                            ReasoningParser::Qwen3 => Phase::Content,
                            ReasoningParser::DeepseekR1 => Phase::Reasoning,
                        };
                    }
                }
                Phase::Reasoning => match self.pending.find(END) {
                    Some(at) => {
                        out.reasoning.push_str(&self.pending[..at]);
                        self.pending.drain(..at + END.len());
                        self.phase = Phase::Content;
                    }
                    None => {
                        // Hold back the longest tail that `</think>` could still start with.
                        let keep = (1..END.len().min(self.pending.len() + 1))
                            .rev()
                            .find(|&n| {
                                self.pending.is_char_boundary(self.pending.len() - n)
                                    && END.starts_with(&self.pending[self.pending.len() - n..])
                            })
                            .unwrap_or(0);
                        let send = self.pending.len() - keep;
                        out.reasoning.push_str(&self.pending[..send]);
                        self.pending.drain(..send);
                        return out;
                    }
                },
                Phase::Content => {
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return out;
                }
            }
        }
    }

    /// [`Self::push`], with what was held back when the choice is `finished`.
    pub fn take(&mut self, delta: &str, finished: bool) -> Split {
        let mut share = self.push(delta);
        if finished {
            let rest = self.finish();
            share.reasoning.push_str(&rest.reasoning);
            share.content.push_str(&rest.content);
        }
        share
    }

    /// What was held back, at the end of the choice.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.pending);
        let reasoning = match self.phase {
            Phase::Opening => self.parser == ReasoningParser::DeepseekR1,
            Phase::Reasoning => true,
            Phase::Content => false,
        };
        if reasoning {
            Split { reasoning: held, content: String::new() }
        } else {
            Split { reasoning: String::new(), content: held }
        }
    }
}

/// A streamed call's splitters, one per choice (none without a parser).
#[derive(Debug)]
pub struct ChoiceSplitters {
    parser: Option<ReasoningParser>,
    streams: Vec<ReasoningStream>,
}

impl ChoiceSplitters {
    pub fn new(parser: Option<ReasoningParser>) -> Self {
        Self { parser, streams: Vec::new() }
    }

    /// Choice `index`'s delta `d` with its reasoning taken out: the delta to send (its text the
    /// content's share) and the reasoning's share (`None` when empty, or without a parser).
    pub fn split<'d>(
        &mut self,
        index: usize,
        d: &'d CompletionDelta,
    ) -> (Cow<'d, CompletionDelta>, Option<String>) {
        let Some(parser) = self.parser else { return (Cow::Borrowed(d), None) };
        if self.streams.len() <= index {
            self.streams.resize_with(index + 1, || ReasoningStream::new(parser));
        }
        let share = self.streams[index].take(&d.text, d.finish_reason.is_some());
        let reasoning = (!share.reasoning.is_empty()).then_some(share.reasoning);
        (Cow::Owned(CompletionDelta { text: share.content, ..d.clone() }), reasoning)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` streamed in pieces of `size` bytes (at char boundaries), the shares concatenated.
    fn streamed(parser: ReasoningParser, text: &str, size: usize) -> (Option<String>, Option<String>) {
        let mut stream = ReasoningStream::new(parser);
        let mut all = Split::default();
        let mut rest = text;
        while !rest.is_empty() {
            let mut cut = size.min(rest.len());
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let part = stream.push(&rest[..cut]);
            all.reasoning.push_str(&part.reasoning);
            all.content.push_str(&part.content);
            rest = &rest[cut..];
        }
        let last = stream.finish();
        all.reasoning.push_str(&last.reasoning);
        all.content.push_str(&last.content);
        let some = |s: String| (!s.is_empty()).then_some(s);
        (some(all.reasoning), some(all.content))
    }

    fn s(x: &str) -> Option<String> {
        Some(x.to_owned())
    }

    #[test]
    fn whole_and_streamed_texts_split_alike() {
        use ReasoningParser::{DeepseekR1, Qwen3};
        let cases = [
            (Qwen3, "<think>plan it</think>\n\nThe answer.", s("plan it"), s("\n\nThe answer.")),
            (Qwen3, "The answer, no thinking.", None, s("The answer, no thinking.")),
            (Qwen3, "<think>cut off while thin", s("cut off while thin"), None),
            (Qwen3, "<thi", None, s("<thi")),
            (Qwen3, "a < b </think> c", None, s("a < b </think> c")),
            (Qwen3, "<think></think>only content", None, s("only content")),
            (DeepseekR1, "reasoning first</think>then content", s("reasoning first"), s("then content")),
            (DeepseekR1, "<think>own tag</think>x", s("own tag"), s("x")),
            (DeepseekR1, "never closed </thin", s("never closed </thin"), None),
            (DeepseekR1, "é</think>ü ≤ </think>", s("é"), s("ü ≤ </think>")),
        ];
        for (parser, text, reasoning, content) in cases {
            let want = (reasoning, content);
            assert_eq!(parser.split(text), want, "{parser:?} whole {text:?}");
            for size in 1..=text.len() {
                assert_eq!(streamed(parser, text, size), want, "{parser:?} {text:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn a_partial_end_tag_is_held_back_and_released() {
        let mut stream = ReasoningStream::new(ReasoningParser::Qwen3);
        assert_eq!(stream.push("<think>ab</th"), Split { reasoning: "ab".into(), content: String::new() });
        assert_eq!(stream.push("ird"), Split { reasoning: "</third".into(), content: String::new() });
        assert_eq!(stream.push("</think>ok"), Split { reasoning: String::new(), content: "ok".into() });
        assert_eq!(stream.finish(), Split::default());
    }
}
