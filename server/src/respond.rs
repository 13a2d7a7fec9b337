//! OpenAI's response bodies, built from engine outputs: whole responses (`text_completion`,
//! `chat.completion`) folded from every output of a request, and streamed chunks
//! (`chat.completion.chunk`, `text_completion`) one per delta, with `usage` and logprobs in
//! each endpoint's own shape.

use std::borrow::Cow;
use std::collections::BTreeMap;

use engine::{Completion, CompletionDelta, PositionLogprobs, PromptLogprobs, RequestOutput};
use serde::Serialize;

use crate::reasoning::ReasoningParser;
use crate::tools::{ToolCallOut, ToolPlan};

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    /// The metrics' label of the endpoint.
    pub fn api(self) -> crate::metrics::Api {
        match self {
            Endpoint::Completions => crate::metrics::Api::Completions,
            Endpoint::Chat => crate::metrics::Api::ChatCompletions,
        }
    }
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
    /// The client asked for logprobs (chat's `logprobs: true`, the completions' `logprobs: k`):
    /// without it a choice shows none, even when the engine computed them (`best_of` ranks by them).
    pub logprobs: bool,
    /// Chat with tools: how finished texts are read for tool calls.
    pub tools: Option<ToolPlan>,
    /// Chat: how answers' reasoning is told from their content.
    pub reasoning: Option<ReasoningParser>,
}

/// A response body or a streamed chunk: `text_completion`, `chat.completion` or
/// `chat.completion.chunk`, its choices in the endpoint's own shape.
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<Choice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageBody>,
    /// Chat with vLLM's `prompt_logprobs`: the prompt's (one prompt per chat call).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<Vec<Option<VllmPosition>>>,
}

/// What a completions choice shows of its prompt (`echo`, vLLM's `prompt_logprobs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PromptParts<'a> {
    /// `echo`: the prompt's text, before the choice's own.
    pub echo_text: Option<&'a str>,
    /// The prompt's tokens and logprobs, when the engine computed them.
    pub logprobs: Option<&'a PromptLogprobs>,
    /// `echo` with `logprobs: k`: the prompt's tokens lead the choice's logprobs, `k` top
    /// alternatives each.
    pub echo_top: Option<usize>,
    /// vLLM's `prompt_logprobs: k`.
    pub prompt_top: Option<usize>,
    /// `echo` with `max_tokens: 0`: the prompt alone, the token generated for it left out.
    pub prompt_only: bool,
}

/// vLLM's logprobs of one prompt position: the prompt token's and the top alternatives', by id.
type VllmPosition = BTreeMap<u32, VllmLogprob>;

#[derive(Debug, Serialize)]
struct VllmLogprob {
    logprob: f32,
    rank: usize,
    decoded_token: String,
}

/// One choice: the completions endpoint's text, a chat chunk's delta or a chat response's message.
#[derive(Debug, Serialize)]
struct Choice<'a> {
    index: usize,
    #[serde(flatten)]
    content: ChoiceContent<'a>,
    logprobs: Option<Logprobs>,
    finish_reason: Option<&'static str>,
    /// Completions with vLLM's `prompt_logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_logprobs: Option<Vec<Option<VllmPosition>>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum ChoiceContent<'a> {
    Text(Cow<'a, str>),
    Delta(ChatDelta<'a>),
    Message(ChatDelta<'a>),
}

/// A chat message or delta: the role only where a choice opens, no content on a bare finish.
#[derive(Debug, Serialize)]
struct ChatDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    /// With a reasoning parser: the answer's reasoning (vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallOut>>,
}

const ASSISTANT: Option<&str> = Some("assistant");

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Logprobs {
    Completion(CompletionLogprobs),
    Chat { content: Vec<ChatTokenLogprob> },
}

/// The legacy completions logprobs object: parallel arrays of tokens, their logprobs, the top
/// alternatives per position and each token's character offset in the text.
#[derive(Debug, Serialize)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    /// `null` for an echoed prompt's first token (nothing comes before it).
    token_logprobs: Vec<Option<f32>>,
    top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    text_offset: Vec<usize>,
}

/// Chat's logprob of one token; a sampled token's entry lists its top alternatives.
#[derive(Debug, Serialize)]
struct ChatTokenLogprob {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<Vec<ChatTokenLogprob>>,
}

#[derive(Debug, Serialize)]
struct UsageBody {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
}

/// The prompt tokens whose KV the prefix cache already held.
#[derive(Debug, Serialize)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

impl Body<'_> {
    /// Characters of text in the (one) choice of a completions chunk.
    pub fn text_chars(&self) -> usize {
        self.choices
            .iter()
            .map(|c| match &c.content {
                ChoiceContent::Text(t) => t.chars().count(),
                ChoiceContent::Delta(_) | ChoiceContent::Message(_) => 0,
            })
            .sum()
    }
}

impl Envelope {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn wrap<'a>(&'a self, chunk: bool, choices: Vec<Choice<'a>>, usage: Option<&Usage>) -> Body<'a> {
        Body {
            id: &self.id,
            object: self.object(chunk),
            created: self.created,
            model: &self.model,
            choices,
            usage: usage.map(Usage::body),
            prompt_logprobs: None,
        }
    }

    /// A streamed chunk for one delta of prompt `prompt`'s request; `offset` is the length (in
    /// characters) of the choice's text before this delta; `parts` what the choice's first chunk
    /// echoes of its prompt; `reasoning` the delta's reasoning, when a parser took it out of its
    /// text.
    pub fn delta_chunk<'a>(
        &'a self,
        prompt: usize,
        delta: &'a CompletionDelta,
        tokens: &TokenText<'_>,
        offset: usize,
        parts: PromptParts<'_>,
        reasoning: Option<&'a str>,
    ) -> Body<'a> {
        let finish_reason = delta.finish_reason.as_ref().map(|f| f.as_str());
        let bare = finish_reason.is_some() || reasoning.is_some();
        let text = (!delta.text.is_empty() || !bare).then_some(delta.text.as_str());
        let content = match self.endpoint {
            Endpoint::Completions if parts.prompt_only => ChoiceContent::Text(echoed(parts, "")),
            Endpoint::Completions => ChoiceContent::Text(echoed(parts, &delta.text)),
            Endpoint::Chat => ChoiceContent::Delta(ChatDelta {
                role: None,
                reasoning_content: reasoning.map(Cow::Borrowed),
                content: text.map(Cow::Borrowed),
                tool_calls: None,
            }),
        };
        let choice = Choice {
            index: prompt * self.n + delta.index,
            content,
            logprobs: self.logprobs_of(
                if parts.prompt_only { Some(&[]) } else { delta.logprobs.as_deref() },
                parts,
                tokens,
                offset,
            ),
            finish_reason,
            prompt_logprobs: None,
        };
        self.wrap(true, vec![choice], None)
    }

    /// Chat streams open each choice with the assistant's role.
    pub fn role_chunk(&self, index: usize) -> Body<'_> {
        let choice = Choice {
            index,
            content: ChoiceContent::Delta(ChatDelta {
                role: ASSISTANT,
                reasoning_content: None,
                content: Some("".into()),
                tool_calls: None,
            }),
            logprobs: None,
            finish_reason: None,
            prompt_logprobs: None,
        };
        self.wrap(true, vec![choice], None)
    }

    /// The last chunk of a stream with `stream_options.include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Body<'_> {
        self.wrap(true, Vec::new(), Some(usage))
    }

    /// The whole (non-streaming) response: each choice with what it shows of its prompt.
    pub fn response<'a>(
        &'a self,
        choices: &[(&'a Completion, PromptParts<'a>)],
        usage: &Usage,
        tokens: &TokenText<'_>,
    ) -> Body<'a> {
        let vllm_prompt_logprobs =
            |parts: &PromptParts<'_>| Some(vllm_prompt_logprobs(parts.logprobs?, parts.prompt_top?, tokens));
        let chat_prompt_logprobs = match (self.endpoint, choices.first()) {
            (Endpoint::Chat, Some((_, parts))) => vllm_prompt_logprobs(parts),
            _ => None,
        };
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, &(c, parts))| Choice {
                index,
                content: match self.endpoint {
                    Endpoint::Completions => ChoiceContent::Text(if parts.prompt_only {
                        Cow::Borrowed(parts.echo_text.unwrap_or_default())
                    } else {
                        echoed(parts, &c.text)
                    }),
                    Endpoint::Chat => ChoiceContent::Message(self.message(index, &c.text, ASSISTANT)),
                },
                logprobs: self.logprobs_of(
                    if parts.prompt_only { Some(&[]) } else { c.logprobs.as_deref() },
                    parts,
                    tokens,
                    0,
                ),
                finish_reason: c.finish_reason.as_ref().map(|f| f.as_str()),
                prompt_logprobs: match self.endpoint {
                    Endpoint::Completions => vllm_prompt_logprobs(&parts),
                    Endpoint::Chat => None,
                },
            })
            .map(Self::tool_finish)
            .collect();
        Body { prompt_logprobs: chat_prompt_logprobs, ..self.wrap(false, choices, Some(usage)) }
    }

    /// Choice `index`'s finished text as a message (or a stream's last delta): its reasoning
    /// apart (with a reasoning parser), then its tool calls (with tools), else its content.
    fn message<'a>(&self, index: usize, text: &'a str, role: Option<&'static str>) -> ChatDelta<'a> {
        let (reasoning, answer) = match self.reasoning {
            Some(parser) => {
                let (reasoning, content) = parser.split(text);
                (reasoning.map(Cow::Owned), Cow::Owned(content.unwrap_or_default()))
            }
            None => (None, Cow::Borrowed(text)),
        };
        match self.tool_calls(index, &answer) {
            Some((content, calls)) => ChatDelta {
                role,
                reasoning_content: reasoning,
                content: content.map(Cow::Owned),
                tool_calls: Some(calls),
            },
            None => ChatDelta {
                role,
                content: (reasoning.is_none() || !answer.is_empty()).then_some(answer),
                reasoning_content: reasoning,
                tool_calls: None,
            },
        }
    }

    /// The tool calls in choice `index`'s finished text (and the text beside them), when the
    /// request has tools and the text holds calls.
    fn tool_calls(&self, index: usize, text: &str) -> Option<(Option<String>, Vec<ToolCallOut>)> {
        let id = format!("{}_{index}", self.id);
        self.tools.as_ref()?.parse(text, id.rsplit('-').next().unwrap_or(&id))
    }

    /// A choice that made tool calls finishes with `tool_calls` (unless cut short).
    fn tool_finish(mut choice: Choice<'_>) -> Choice<'_> {
        let called = match &choice.content {
            ChoiceContent::Message(d) | ChoiceContent::Delta(d) => d.tool_calls.is_some(),
            ChoiceContent::Text(_) => false,
        };
        if called && choice.finish_reason == Some("stop") {
            choice.finish_reason = Some("tool_calls");
        }
        choice
    }

    /// A tools stream's last chunk of a choice: its calls as `tool_calls` deltas (each with its
    /// index) or, without any, the whole text it held back.
    pub fn tool_chunk<'a>(&'a self, index: usize, text: &'a str, finish: Option<&'static str>) -> Body<'a> {
        let mut delta = self.message(index, text, None);
        for (i, c) in delta.tool_calls.iter_mut().flatten().enumerate() {
            c.index = Some(i);
        }
        let choice = Choice {
            index,
            content: ChoiceContent::Delta(delta),
            logprobs: None,
            finish_reason: finish,
            prompt_logprobs: None,
        };
        self.wrap(true, vec![Self::tool_finish(choice)], None)
    }

    /// The endpoint's logprobs object, when the request asked for logprobs (with `echo`, the
    /// prompt's tokens first).
    fn logprobs_of(
        &self,
        lps: Option<&[PositionLogprobs]>,
        parts: PromptParts<'_>,
        tokens: &TokenText<'_>,
        offset: usize,
    ) -> Option<Logprobs> {
        let lps = lps.filter(|_| self.logprobs)?;
        match self.endpoint {
            Endpoint::Completions => {
                let echo = parts.logprobs.zip(parts.echo_top);
                Some(Logprobs::Completion(completion_logprobs(echo, lps, tokens, offset)))
            }
            Endpoint::Chat => Some(Logprobs::Chat { content: chat_logprobs(lps, tokens) }),
        }
    }
}

fn chat_logprobs(lps: &[PositionLogprobs], tokens: &TokenText<'_>) -> Vec<ChatTokenLogprob> {
    let entry = |id: u32, logprob: f32| {
        let token = tokens.text(id);
        ChatTokenLogprob { bytes: token.as_bytes().to_vec(), token, logprob, top_logprobs: None }
    };
    lps.iter()
        .map(|p| ChatTokenLogprob {
            top_logprobs: Some(p.top.iter().map(|t| entry(t.token, t.logprob)).collect()),
            ..entry(p.sampled.token, p.sampled.logprob)
        })
        .collect()
}

/// The legacy logprobs of `lps`, after the echoed prompt's (its first token's `null`, then
/// `top` alternatives a position) when `echo` has them.
fn completion_logprobs(
    echo: Option<(&PromptLogprobs, usize)>,
    lps: &[PositionLogprobs],
    tokens: &TokenText<'_>,
    start_offset: usize,
) -> CompletionLogprobs {
    let mut offset = start_offset;
    let len = lps.len() + echo.map_or(0, |(p, _)| p.token_ids.len());
    let mut out = CompletionLogprobs {
        tokens: Vec::with_capacity(len),
        token_logprobs: Vec::with_capacity(len),
        top_logprobs: Vec::with_capacity(len),
        text_offset: Vec::with_capacity(len),
    };
    let mut push = |token: u32, entry: Option<&PositionLogprobs>, top: usize| {
        let text = tokens.text(token);
        out.text_offset.push(offset);
        offset += text.chars().count();
        out.tokens.push(text);
        out.token_logprobs.push(entry.map(|p| p.sampled.logprob));
        out.top_logprobs
            .push(entry.map(|p| p.top.iter().take(top).map(|t| (tokens.text(t.token), t.logprob)).collect()));
    };
    if let Some((prompt, top)) = echo {
        for (i, &token) in prompt.token_ids.iter().enumerate() {
            push(token, prompt.positions.get(i).and_then(Option::as_ref), top);
        }
    }
    for p in lps {
        push(p.sampled.token, Some(p), usize::MAX);
    }
    out
}

/// A completions choice's text after its echoed prompt.
fn echoed<'a>(parts: PromptParts<'_>, text: &'a str) -> Cow<'a, str> {
    match parts.echo_text {
        Some(prompt) => Cow::Owned(format!("{prompt}{text}")),
        None => Cow::Borrowed(text),
    }
}

/// vLLM's `prompt_logprobs`: `null` for the first token, then per position the prompt token's
/// logprob and rank and the `top` most likely tokens', keyed by token id.
fn vllm_prompt_logprobs(
    prompt: &PromptLogprobs,
    top: usize,
    tokens: &TokenText<'_>,
) -> Vec<Option<VllmPosition>> {
    let entry = |logprob: f32, rank: usize, token: u32| VllmLogprob {
        logprob,
        rank,
        decoded_token: tokens.text(token),
    };
    prompt
        .positions
        .iter()
        .map(|p| {
            let p = p.as_ref()?;
            let mut map: VllmPosition = p
                .top
                .iter()
                .take(top)
                .enumerate()
                .map(|(k, t)| (t.token, entry(t.logprob, k + 1, t.token)))
                .collect();
            map.insert(p.sampled.token, entry(p.sampled.logprob, p.rank, p.sampled.token));
            Some(map)
        })
        .collect()
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
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    fn body(&self) -> UsageBody {
        UsageBody {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: self.cached_tokens },
        }
    }

    /// Counts a request's final output (its totals cover every sample, `best_of`'s candidates
    /// included; none with `completion: false`, an echo of the prompt alone).
    pub fn add_final(&mut self, out: &RequestOutput, completion: bool) {
        self.prompt_tokens += out.prompt_tokens;
        if completion {
            self.completion_tokens += out.completion_tokens;
        }
        self.cached_tokens += out.num_cached_tokens;
    }
}
