//! OpenAI's request bodies for `/v1/completions` and `/v1/chat/completions` (plus vLLM's
//! extra sampling fields), and their translation into engine `SamplingParams` with a 400 that
//! names the field for every value outside its domain. `null` is "not set" for every optional
//! field; fields no struct here takes land in `SamplingFields::extra`, where `fields.rs` refuses
//! the known but unimplemented ones and logs the unknown ones; a field of the wrong type fails
//! the body's parse (a 400 as well).

use engine::{ChatMessage, Prompt, SamplingParams};
use serde::Deserialize;

use crate::error::ApiError;
use crate::fields::null_default;
use crate::structured::ConstraintFields;

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptInput {
    /// One engine prompt per entry.
    pub fn into_prompts(self) -> Result<Vec<Prompt>, ApiError> {
        self.into_prompts_of("prompt")
    }

    /// [`PromptInput::into_prompts`] of a body whose field `field` held it.
    pub fn into_prompts_of(self, field: &'static str) -> Result<Vec<Prompt>, ApiError> {
        let prompts: Vec<Prompt> = match self {
            Self::Text(t) => vec![Prompt::Text(t)],
            Self::Texts(ts) => ts.into_iter().map(Prompt::Text).collect(),
            Self::Tokens(ids) => vec![Prompt::Tokens(ids)],
            Self::TokenLists(lists) => lists.into_iter().map(Prompt::Tokens).collect(),
        };
        if prompts.is_empty() {
            return Err(ApiError::bad_request(format!("{field} must not be an empty list"), Some(field)));
        }
        Ok(prompts)
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_default")]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share (OpenAI's and vLLM's extras). Numbers are read
/// wide and signed so that a negative or fractional value gets a message about its field
/// rather than a parse error.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub n: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    /// vLLM's: the logprob of every prompt token given those before it, with this many top
    /// alternatives (not with `stream`, as vLLM).
    pub prompt_logprobs: Option<i64>,
    #[serde(default, deserialize_with = "null_default")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// An end-user id for abuse monitoring in OpenAI's API: typed (a number is a 400), unused.
    #[allow(dead_code)]
    pub user: Option<String>,
    /// vLLM's scheduling priority (lower runs first); only under `--scheduling-policy priority`.
    pub priority: Option<i64>,
    /// Isolates the request's prefix-cache entries (vLLM's `cache_salt`).
    pub cache_salt: Option<String>,
    /// vLLM's request id field (an `X-Request-Id` header wins over it).
    pub request_id: Option<String>,
    /// `response_format`, `guided_*`, `structured_outputs`, `grammar`, `logit_bias`.
    #[serde(flatten)]
    pub constraints: ConstraintFields,
    /// Every field no struct of the body took (last: a flattened map gets what the flattened
    /// structs before it left).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// vLLM's sampling fields beyond OpenAI's that the endpoints built on chat requests
/// (`/v1/responses`, `/v1/messages`) hand on to it as they are.
pub const SAMPLING_EXTRAS: &[&str] = &[
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "priority",
    "cache_salt",
    "chat_template_kwargs",
    "guided_choice",
    "guided_regex",
    "guided_json",
    "guided_grammar",
    "structured_outputs",
];

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// Top logprobs per position (0 gives the sampled token's only).
    pub logprobs: Option<i64>,
    /// Each choice starts with the prompt: its text, and with `logprobs` its tokens and their
    /// logprobs (the first `null`). With `max_tokens: 0` a choice is the prompt alone.
    pub echo: Option<bool>,
    /// Candidates per prompt (at least `n`): the `n` of highest cumulative logprob are returned.
    pub best_of: Option<i64>,
    /// No fill-in-the-middle template: a 400 unless empty.
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// What `/v1/completions` does beyond sampling each choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionPlan {
    /// Choices per prompt.
    pub n: usize,
    /// Candidates generated per prompt (`best_of`, at least `n`).
    pub best_of: usize,
    pub echo: bool,
    /// `echo` with `max_tokens: 0`: one token is generated (the engine computes the prompt's
    /// logprobs on the way to it) and left out.
    pub prompt_only: bool,
}

impl CompletionRequest {
    /// `echo`, `best_of` and `suffix` checked: a 400 names what cannot be done.
    pub fn plan(&self) -> Result<CompletionPlan, ApiError> {
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request(
                "suffix is not supported (the model has no fill-in-the-middle template)",
                Some("suffix"),
            ));
        }
        let n = self.sampling.n.map(|n| count(n, "n", 1)).transpose()?.unwrap_or(1);
        let best_of = self.best_of.map(|b| count(b, "best_of", 1)).transpose()?.unwrap_or(n);
        if best_of < n {
            return Err(ApiError::bad_request(
                format!("best_of must be at least n ({n}), got {best_of}"),
                Some("best_of"),
            ));
        }
        if best_of > engine::sampling::MAX_N {
            return Err(ApiError::bad_request(
                format!("best_of must be at most {}, got {best_of}", engine::sampling::MAX_N),
                Some("best_of"),
            ));
        }
        if best_of > n && self.sampling.stream {
            return Err(ApiError::bad_request(
                "best_of greater than n cannot be streamed (the best are known only at the end)",
                Some("best_of"),
            ));
        }
        let echo = self.echo.unwrap_or(false);
        Ok(CompletionPlan { n, best_of, echo, prompt_only: echo && self.sampling.max_tokens == Some(0) })
    }

    /// The engine's parameters for the plan: `best_of` samples, ranked by their cumulative
    /// logprob (computed even when the client asked for no logprobs), and the prompt's logprobs
    /// when they are echoed.
    pub fn to_params(
        &self,
        defaults: &SamplingParams,
        plan: &CompletionPlan,
    ) -> Result<SamplingParams, ApiError> {
        let max_tokens = if plan.prompt_only {
            Some(1)
        } else {
            Some(self.sampling.max_tokens.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS))
        };
        let mut p = self.sampling.to_params(defaults, max_tokens, self.logprobs)?;
        p.n = plan.best_of;
        if plan.best_of > plan.n {
            p.logprobs.get_or_insert(0);
        }
        if plan.echo
            && let Some(k) = p.logprobs.filter(|_| self.logprobs.is_some())
        {
            p.prompt_logprobs = Some(p.prompt_logprobs.map_or(k, |j| j.max(k)));
        }
        Ok(p)
    }
}

/// OpenAI's default `max_tokens` of the legacy completions endpoint.
const COMPLETIONS_DEFAULT_MAX_TOKENS: i64 = 16;

/// One chat message; `content` is a string or a list of `{"type": "text", "text": …}` parts
/// (or `null` beside `tool_calls`, rendered as ""). An assistant's `tool_calls` and a tool result's
/// `tool_call_id` and `name` go to the template as given.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageInput {
    pub role: String,
    #[serde(default)]
    pub content: Option<ChatContent>,
    #[serde(default)]
    pub tool_calls: Option<Vec<engine::ToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessageInput>,
    /// Tool schemas (`{"type": "function", "function": {...}}`), handed to the chat template
    /// with their keys in request order; the output is read for calls (`tools.rs`).
    #[serde(default)]
    pub tools: Option<Vec<engine::TemplateValue>>,
    /// `none`, `auto` (the default with tools), `required`, or `{"type": "function", "function":
    /// {"name": …}}`.
    #[serde(default)]
    pub tool_choice: Option<crate::tools::ToolChoiceInput>,
    /// More than one call per answer under `required` (the default).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The newer name of `max_tokens`; wins when both are set.
    pub max_completion_tokens: Option<i64>,
    #[serde(default, deserialize_with = "null_default")]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    /// vLLM's chat `echo` (the last message continued): a 400, no template here continues one.
    pub echo: Option<bool>,
    /// Extra variables for the chat template (`enable_thinking`, …), as transformers' kwargs.
    #[serde(default)]
    pub chat_template_kwargs: Option<std::collections::BTreeMap<String, engine::TemplateValue>>,
    /// Retrieval documents for templates that take them.
    #[serde(default)]
    pub documents: Option<Vec<engine::TemplateValue>>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

impl ChatRequest {
    /// The messages as the chat template takes them.
    pub fn chat_messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        chat_messages(&self.messages)
    }

    /// The engine prompt: the messages, plus the tools, documents and template variables when
    /// the request has them.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        let messages = self.chat_messages()?;
        if self.tools.is_none() && self.documents.is_none() && self.chat_template_kwargs.is_none() {
            return Ok(Prompt::Chat(messages));
        }
        Ok(Prompt::Conversation(engine::Conversation {
            messages,
            tools: self.tools.clone(),
            documents: self.documents.clone(),
            kwargs: self.chat_template_kwargs.clone().unwrap_or_default(),
        }))
    }
}

/// Chat messages as the template takes them (text parts joined); an empty list is a 400.
pub fn chat_messages(messages: &[ChatMessageInput]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
    }
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                // A tool-calling assistant turn has no text: the template sees "", as vLLM
                // renders it; ChatML-style templates (SmolLM2's) add `content` to a string, which
                // `null` fails, and templates that test the content's truth read "" as `null`.
                None => Some(String::new()),
                Some(ChatContent::Text(t)) => Some(t.clone()),
                Some(ChatContent::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(
                                    format!("unsupported content part {kind:?} (this model reads text only)"),
                                    Some("messages"),
                                ));
                            }
                        }
                    }
                    Some(text)
                }
            };
            Ok(ChatMessage {
                role: m.role.clone(),
                content,
                tool_calls: m.tool_calls.clone(),
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
            })
        })
        .collect()
}

/// A non-negative integer field as `usize`.
fn count(value: i64, name: &'static str, min: i64) -> Result<usize, ApiError> {
    if value < min {
        return Err(ApiError::bad_request(format!("{name} must be at least {min}, got {value}"), Some(name)));
    }
    usize::try_from(value)
        .map_err(|_| ApiError::bad_request(format!("{name} is too large: {value}"), Some(name)))
}

/// A float field as `f32`, finite.
fn real(value: f64, name: &'static str) -> Result<f32, ApiError> {
    if !value.is_finite() {
        return Err(ApiError::bad_request(format!("{name} must be a finite number"), Some(name)));
    }
    Ok(value as f32)
}

impl SamplingFields {
    /// The engine's parameters: every field the request sets, over the model's defaults
    /// (checked once the endpoint has set the rest, by [`validated`]).
    pub fn to_params(
        &self,
        defaults: &SamplingParams,
        max_tokens: Option<i64>,
        logprobs: Option<i64>,
    ) -> Result<SamplingParams, ApiError> {
        let mut p = defaults.clone();
        // OpenAI's default: up to the model's length (the engine fills in what fits).
        p.max_tokens = max_tokens.map(|m| count(m, "max_tokens", 1)).transpose()?;
        if let Some(t) = self.temperature {
            p.temperature = real(t, "temperature")?;
        }
        if let Some(t) = self.top_p {
            p.top_p = real(t, "top_p")?;
        }
        if let Some(k) = self.top_k {
            p.top_k = i32::try_from(k)
                .map_err(|_| ApiError::bad_request("top_k is out of range", Some("top_k")))?;
        }
        if let Some(m) = self.min_p {
            p.min_p = real(m, "min_p")?;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = real(v, "presence_penalty")?;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = real(v, "frequency_penalty")?;
        }
        if let Some(v) = self.repetition_penalty {
            p.repetition_penalty = real(v, "repetition_penalty")?;
        }
        // Any 64-bit seed, negative ones included (their bits).
        p.seed = self.seed.map(|s| s as u64);
        p.stop = match &self.stop {
            None => Vec::new(),
            Some(StopInput::One(s)) => vec![s.clone()],
            Some(StopInput::Many(v)) => v.clone(),
        };
        if let Some(ids) = &self.stop_token_ids {
            p.stop_token_ids = ids.clone();
        }
        if let Some(n) = self.n {
            p.n = count(n, "n", 1)?;
        }
        p.ignore_eos = self.ignore_eos.unwrap_or(false);
        if let Some(m) = self.min_tokens {
            p.min_tokens = count(m, "min_tokens", 0)?;
        }
        p.include_stop_str_in_output = self.include_stop_str_in_output.unwrap_or(false);
        p.skip_special_tokens = self.skip_special_tokens.unwrap_or(true);
        p.logprobs = logprobs.map(|l| count(l, "logprobs", 0)).transpose()?;
        p.prompt_logprobs = self.prompt_logprobs.map(|l| count(l, "prompt_logprobs", 0)).transpose()?;
        if self.stream && p.prompt_logprobs.is_some() {
            return Err(ApiError::bad_request(
                "prompt_logprobs are not available when stream is true",
                Some("prompt_logprobs"),
            ));
        }
        p.constraint = self.constraints.constraint()?.map(|(c, _)| c);
        p.logit_bias = self.constraints.logit_bias()?;
        Ok(p)
    }

    /// The engine's scheduling options: `priority` (refused unless the engine schedules by
    /// priority: under FCFS it would mean nothing) and `cache_salt` (not empty).
    pub fn options(&self, policy: engine::Policy) -> Result<engine::RequestOptions, ApiError> {
        let mut options = engine::RequestOptions::default();
        if let Some(p) = self.priority.filter(|&p| p != 0) {
            if policy != engine::Policy::Priority {
                return Err(ApiError::bad_request(
                    format!(
                        "priority {p} needs priority scheduling (start the server with --scheduling-policy priority)"
                    ),
                    Some("priority"),
                ));
            }
            options.priority = p;
        }
        if let Some(salt) = &self.cache_salt {
            if salt.is_empty() {
                return Err(ApiError::bad_request(
                    "cache_salt must be a non-empty string",
                    Some("cache_salt"),
                ));
            }
            options.cache_salt = Some(salt.clone());
        }
        Ok(options)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

/// The request field an engine validation error is about.
/// The engine's validation of a call's finished parameters, its error a 400 naming the field.
pub(crate) fn validated(p: SamplingParams) -> Result<engine::ValidSamplingParams, ApiError> {
    p.validate().map_err(|e| ApiError::bad_request(e.to_string(), Some(param_of(&e))))
}

fn param_of(e: &engine::SamplingParamsError) -> &'static str {
    use engine::SamplingParamsError as E;
    match e {
        E::N(_) => "n",
        E::Temperature(_) => "temperature",
        E::TopP(_) => "top_p",
        E::TopK(_) => "top_k",
        E::MinP(_) => "min_p",
        E::Penalty { name, .. } => name,
        E::RepetitionPenalty(_) => "repetition_penalty",
        E::MaxTokensZero => "max_tokens",
        E::MinTokensOverMax { .. } => "min_tokens",
        E::Logprobs(_) => "logprobs",
        E::PromptLogprobs(_) => "prompt_logprobs",
        E::EmptyStopString => "stop",
        E::LogitBias { .. } | E::LogitBiasCount(_) => "logit_bias",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a completions call hands the engine: its parameters, validated as `Job::new` does.
    fn params(body: serde_json::Value) -> Result<engine::ValidSamplingParams, ApiError> {
        let req: CompletionRequest = serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"));
        validated(req.to_params(&SamplingParams::default(), &req.plan()?)?)
    }

    #[test]
    fn fields_map_onto_the_engine_and_unknown_fields_are_ignored() {
        let p = params(serde_json::json!({
            "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
            "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": -1,
            "stop": "\n", "n": 2, "logprobs": 3, "ignore_eos": true, "min_tokens": 2, "user": "u",
            "some_future_field": {"x": 1}
        }))
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!((p.temperature, p.top_p, p.top_k, p.min_p), (0.5, 0.9, 40, 0.1));
        assert_eq!((p.n, p.logprobs, p.seed, p.min_tokens), (2, Some(3), Some(u64::MAX), 2));
        assert_eq!(p.stop, vec!["\n".to_owned()]);
        assert!(p.ignore_eos);
    }

    #[test]
    fn each_bad_value_names_its_field() {
        for (body, param) in [
            (serde_json::json!({"prompt": "x", "max_tokens": -1}), "max_tokens"),
            (serde_json::json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"prompt": "x", "temperature": -1}), "temperature"),
            (serde_json::json!({"prompt": "x", "top_p": 0}), "top_p"),
            (serde_json::json!({"prompt": "x", "top_p": 1.5}), "top_p"),
            (serde_json::json!({"prompt": "x", "n": 0}), "n"),
            (serde_json::json!({"prompt": "x", "presence_penalty": 3}), "presence_penalty"),
            (serde_json::json!({"prompt": "x", "logprobs": 99}), "logprobs"),
            (serde_json::json!({"prompt": "x", "prompt_logprobs": 21}), "prompt_logprobs"),
            (serde_json::json!({"prompt": "x", "prompt_logprobs": -1}), "prompt_logprobs"),
            (serde_json::json!({"prompt": "x", "prompt_logprobs": 1, "stream": true}), "prompt_logprobs"),
            (serde_json::json!({"prompt": "x", "max_tokens": 0, "echo": false}), "max_tokens"),
            (serde_json::json!({"prompt": "x", "best_of": 1, "n": 2}), "best_of"),
            (serde_json::json!({"prompt": "x", "best_of": 0}), "best_of"),
            (serde_json::json!({"prompt": "x", "best_of": 257}), "best_of"),
            (serde_json::json!({"prompt": "x", "best_of": 3, "stream": true}), "best_of"),
            (serde_json::json!({"prompt": "x", "suffix": "end"}), "suffix"),
            (serde_json::json!({"prompt": "x", "stop": [""]}), "stop"),
        ] {
            let e = params(body.clone()).err().unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(e.status, 400);
            assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn echo_and_best_of_become_engine_samples_and_prompt_logprobs() {
        let p = params(serde_json::json!({"prompt": "x", "best_of": 3, "n": 2}))
            .unwrap_or_else(|e| panic!("{e:?}"));
        // Three candidates, ranked by the logprobs the client did not ask for.
        assert_eq!((p.n, p.logprobs, p.prompt_logprobs), (3, Some(0), None));
        let p = params(serde_json::json!({"prompt": "x", "best_of": 2, "n": 2, "stream": true}))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.n, p.logprobs), (2, None));
        let p = params(serde_json::json!({"prompt": "x", "echo": true, "logprobs": 1, "max_tokens": 0}))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.max_tokens, p.logprobs, p.prompt_logprobs), (Some(1), Some(1), Some(1)));
        let p = params(serde_json::json!({"prompt": "x", "echo": true, "logprobs": 2, "prompt_logprobs": 5}))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.max_tokens, p.prompt_logprobs), (Some(16), Some(5)));
        let p = params(serde_json::json!({"prompt": "x", "echo": true})).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((p.logprobs, p.prompt_logprobs), (None, None));
        let req: CompletionRequest =
            serde_json::from_value(serde_json::json!({"prompt": "x", "echo": true, "max_tokens": 0}))
                .unwrap_or_else(|e| panic!("{e}"));
        let plan = req.plan().unwrap_or_else(|e| panic!("{e:?}"));
        assert!(plan.echo && plan.prompt_only);
        assert_eq!((plan.n, plan.best_of), (1, 1));
    }

    #[test]
    fn prompts_take_every_openai_shape() {
        for (body, n) in [
            (serde_json::json!("one"), 1),
            (serde_json::json!(["a", "b"]), 2),
            (serde_json::json!([1, 2, 3]), 1),
            (serde_json::json!([[1, 2], [3]]), 2),
        ] {
            let p: PromptInput = serde_json::from_value(body).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.into_prompts().map(|v| v.len()).ok(), Some(n));
        }
        let empty: PromptInput =
            serde_json::from_value(serde_json::json!([])).unwrap_or_else(|e| panic!("{e}"));
        assert!(empty.into_prompts().is_err());
    }

    #[test]
    fn a_tool_calling_turn_without_content_reaches_the_template_as_empty_text() {
        let messages: Vec<ChatMessageInput> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        let out = chat_messages(&messages).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(out[1].content.as_deref(), Some(""));
        assert_eq!(out[1].tool_calls.as_ref().map(|c| c[0].function.name.as_str()), Some("get_weather"));
        assert_eq!(out[2].tool_call_id.as_deref(), Some("c1"));
    }
}
