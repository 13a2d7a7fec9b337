//! OpenAI's response bodies, built from engine outputs: whole responses (`text_completion`,
//! `chat.completion`) folded from every output of a request, and streamed chunks
//! (`chat.completion.chunk`, `text_completion`) one per delta, with `usage` and logprobs in
//! each endpoint's own shape.

use engine::{Completion, CompletionDelta, RequestOutput, sampling::PositionLogprobs};
use serde_json::{Map, Value, json};

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// What every chunk and response of one API call shares.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// Parallel samples per prompt: choice index = prompt index × n + sample index.
    pub n: usize,
    /// Chat: the client asked for logprobs (`logprobs: true`).
    pub logprobs: bool,
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn wrap(&self, chunk: bool, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            v["usage"] = usage;
        }
        v
    }

    /// A streamed chunk for one delta of prompt `prompt`'s request; `offset` is the length (in
    /// characters) of the choice's text before this delta.
    pub fn delta_chunk(
        &self,
        prompt: usize,
        delta: &CompletionDelta,
        tokens: &TokenText<'_>,
        offset: usize,
    ) -> Value {
        let index = prompt * self.n + delta.index;
        let finish = delta.finish_reason.as_ref().map(|f| f.as_str());
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index,
                "text": delta.text,
                "logprobs": delta.logprobs.as_ref().map(|lp| completion_logprobs(lp, tokens, offset)),
                "finish_reason": finish,
            }),
            Endpoint::Chat => {
                let delta_body = if delta.text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": delta.text})
                };
                json!({
                    "index": index,
                    "delta": delta_body,
                    "logprobs": self.chat_logprobs(delta.logprobs.as_deref(), tokens),
                    "finish_reason": finish,
                })
            }
        };
        self.wrap(true, vec![choice], None)
    }

    /// Chat streams open each choice with the assistant's role.
    pub fn role_chunk(&self, index: usize) -> Value {
        let choice = json!({
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        });
        self.wrap(true, vec![choice], None)
    }

    /// The last chunk of a stream with `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        self.wrap(true, Vec::new(), Some(usage.to_json()))
    }

    /// The whole (non-streaming) response.
    pub fn response(&self, choices: &[&Completion], usage: &Usage, tokens: &TokenText<'_>) -> Value {
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let finish = c.finish_reason.as_ref().map(|f| f.as_str());
                match self.endpoint {
                    Endpoint::Completions => json!({
                        "index": index,
                        "text": c.text,
                        "logprobs": c.logprobs.as_ref().map(|lp| completion_logprobs(lp, tokens, 0)),
                        "finish_reason": finish,
                    }),
                    Endpoint::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": self.chat_logprobs(c.logprobs.as_deref(), tokens),
                        "finish_reason": finish,
                    }),
                }
            })
            .collect();
        self.wrap(false, choices, Some(usage.to_json()))
    }

    fn chat_logprobs(&self, lps: Option<&[PositionLogprobs]>, tokens: &TokenText<'_>) -> Value {
        match lps {
            Some(lps) if self.logprobs => {
                let entry = |id: u32, logprob: f32| {
                    let token = tokens.text(id);
                    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|p| {
                        let mut e = entry(p.sampled.token, p.sampled.logprob);
                        e["top_logprobs"] = p.top.iter().map(|t| entry(t.token, t.logprob)).collect();
                        e
                    })
                    .collect();
                json!({"content": content})
            }
            _ => Value::Null,
        }
    }
}

/// The legacy completions logprobs object: parallel arrays of tokens, their logprobs, the top
/// alternatives per position and each token's character offset in the text.
fn completion_logprobs(lps: &[PositionLogprobs], tokens: &TokenText<'_>, start_offset: usize) -> Value {
    let mut offset = start_offset;
    let (mut toks, mut lp, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for p in lps {
        let text = tokens.text(p.sampled.token);
        offsets.push(offset);
        offset += text.chars().count();
        toks.push(text);
        lp.push(p.sampled.logprob);
        let top: Map<String, Value> =
            p.top.iter().map(|t| (tokens.text(t.token), json!(t.logprob))).collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": toks, "token_logprobs": lp, "top_logprobs": tops, "text_offset": offsets})
}

/// Token ids to their text, for logprobs.
#[derive(Debug, Clone, Copy)]
pub struct TokenText<'a> {
    pub tokenizer: &'a model::Tokenizer,
}

impl TokenText<'_> {
    fn text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

/// Token counts of one API call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }

    /// Counts a request's final output (its totals cover every sample).
    pub fn add_final(&mut self, out: &RequestOutput) {
        self.prompt_tokens += out.prompt_tokens;
        self.completion_tokens += out.completion_tokens;
    }
}
