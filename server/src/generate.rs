//! `POST /v1/completions` and `POST /v1/chat/completions`: each prompt becomes one engine
//! request (with its `n` samples), submitted without waiting for an engine step; the answer is
//! either one JSON body or an SSE stream of chunks ending in `data: [DONE]`.
//!
//! The response body owns the requests' `OutputStream`s: when a client disconnects, hyper
//! drops the body, the streams drop, and the engine aborts the requests at its next step
//! boundary (their blocks freed within one step).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::{
    Completion, FinalOutput, OutputStream, Prompt, PromptLogprobs, RequestOptions, SamplingParams,
    ValidSamplingParams,
};
use futures_util::stream::{self, SelectAll, Stream, StreamExt};

use crate::AppState;
use crate::error::{ApiError, error_event_json};
use crate::openai::{ChatRequest, CompletionPlan, CompletionRequest, SamplingFields};
use crate::request_id::{request_id, with_request_id};
use crate::respond::{Endpoint, Envelope, PromptParts, TokenText, Usage};

/// A request body that becomes one [`Job`]: what the completions and chat endpoints differ in.
pub(crate) trait JobRequest: serde::de::DeserializeOwned + Send + 'static {
    const ENDPOINT: Endpoint;
    /// The requested model and the fields both endpoints share.
    fn common(&self) -> (Option<&str>, &SamplingFields);
    /// The job the body asks for, `base` being the call's id.
    fn job(&self, state: &AppState, base: &str) -> Result<Job, ApiError>;
}

impl JobRequest for CompletionRequest {
    const ENDPOINT: Endpoint = Endpoint::Completions;

    fn common(&self) -> (Option<&str>, &SamplingFields) {
        (self.model.as_deref(), &self.sampling)
    }

    fn job(&self, state: &AppState, base: &str) -> Result<Job, ApiError> {
        let plan = self.plan()?;
        let params = self.to_params(state.handle.default_sampling_params(), &plan)?;
        let prompts = self.prompt.clone().into_prompts()?;
        let options = self.sampling.options(state.handle.policy())?;
        let envelope = Envelope::new(state, Endpoint::Completions, base, plan.n, self.logprobs.is_some());
        let mut job = Job::new(envelope, prompts, params, options, &self.sampling)?;
        // Both were checked to be counts by `to_params`.
        let top = |k: Option<i64>| k.and_then(|k| usize::try_from(k).ok());
        job.completion = Some(CompletionJob {
            plan,
            echo_top: top(self.logprobs).filter(|_| plan.echo),
            prompt_top: top(self.sampling.prompt_logprobs),
        });
        Ok(job)
    }
}

impl JobRequest for ChatRequest {
    const ENDPOINT: Endpoint = Endpoint::Chat;

    fn common(&self) -> (Option<&str>, &SamplingFields) {
        (self.model.as_deref(), &self.sampling)
    }

    fn job(&self, state: &AppState, base: &str) -> Result<Job, ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::bad_request(
                "echo is not supported on chat completions (no template continues the last message)",
                Some("echo"),
            ));
        }
        let max_tokens = self.max_completion_tokens.or(self.sampling.max_tokens);
        let top = if self.logprobs { Some(self.top_logprobs.unwrap_or(0)) } else { None };
        let mut params = self.sampling.to_params(state.handle.default_sampling_params(), max_tokens, top)?;
        let prompts = vec![self.prompt()?];
        let options = self.sampling.options(state.handle.policy())?;
        let tools = crate::tools::plan(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls.unwrap_or(true),
            state.tool_call_parser,
        )?;
        let (tools, tool_constraint) = tools.map_or((None, None), |(p, c)| (Some(p), c));
        let mut constraint_field = self.sampling.constraints.constraint_field();
        if let Some(c) = tool_constraint {
            if params.constraint.is_some() {
                return Err(ApiError::bad_request(
                    "tool_choice required or named cannot be combined with another output constraint",
                    Some("tool_choice"),
                ));
            }
            params.constraint = Some(c);
            constraint_field = Some("tools");
        }
        params.constraint =
            params.constraint.map(|c| state.structured_outputs.chat_constraint(state.reasoning_parser, c));
        let mut envelope = Envelope::new(state, Endpoint::Chat, base, params.n, self.logprobs);
        envelope.tools = tools;
        envelope.reasoning = state.reasoning_parser;
        let mut job = Job::new(envelope, prompts, params, options, &self.sampling)?;
        job.prompt_top = job.params.prompt_logprobs;
        job.constraint_field = constraint_field;
        Ok(job)
    }
}

/// `POST /v1/completions` and `POST /v1/chat/completions`: the call's id, the model and
/// extra-field checks, the body's job answered (or its error), the id echoed in `X-Request-Id`.
pub(crate) async fn generate<R: JobRequest>(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: crate::JsonBody<R>,
) -> Response {
    let req = body.0;
    let (model, sampling) = req.common();
    let base = match request_id(&headers, sampling.request_id.as_deref()) {
        Ok(base) => base,
        Err(e) => return e.into_response(),
    };
    let job = state.model_adapter(model).and_then(|lora| {
        crate::fields::check_extra(&sampling.extra, R::ENDPOINT)?;
        Ok(req.job(&state, &base)?.with_lora(lora))
    });
    let response = match job {
        Ok(job) => job.respond(state).await,
        Err(e) => e.into_response(),
    };
    with_request_id(response, &base)
}

/// One API call, checked and ready to submit.
pub(crate) struct Job {
    envelope: Envelope,
    prompts: Vec<Prompt>,
    params: ValidSamplingParams,
    options: RequestOptions,
    stream: bool,
    include_usage: bool,
    /// The request field that set its output constraint (what a compile error names).
    constraint_field: Option<&'static str>,
    /// `/v1/completions`: echo and best_of.
    completion: Option<CompletionJob>,
    /// Chat with vLLM's `prompt_logprobs`.
    prompt_top: Option<usize>,
}

/// What a completions call shows beside its samples.
#[derive(Debug, Clone, Copy)]
struct CompletionJob {
    plan: CompletionPlan,
    /// `echo` with `logprobs: k`: the prompt's tokens lead each choice's logprobs.
    echo_top: Option<usize>,
    /// vLLM's `prompt_logprobs: k`.
    prompt_top: Option<usize>,
}

impl CompletionJob {
    /// What choices of a prompt whose text is `echo_text` show of it.
    fn parts<'a>(&self, echo_text: Option<&'a str>, logprobs: Option<&'a PromptLogprobs>) -> PromptParts<'a> {
        PromptParts {
            echo_text: echo_text.filter(|_| self.plan.echo),
            logprobs,
            echo_top: self.echo_top,
            prompt_top: self.prompt_top,
            prompt_only: self.plan.prompt_only,
        }
    }
}

impl Envelope {
    /// The envelope of a call whose base id is `base`.
    fn new(state: &AppState, endpoint: Endpoint, base: &str, n: usize, logprobs: bool) -> Self {
        let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
        Self {
            id: format!("{prefix}-{base}"),
            created: crate::unix_now(),
            model: state.handle.model_name().to_owned(),
            endpoint,
            n,
            logprobs,
            tools: None,
            reasoning: None,
        }
    }
}

impl Job {
    /// The job under the LoRA adapter its `model` names (`None`: the base model), whose name
    /// its responses then carry.
    pub(crate) fn with_lora(mut self, lora: Option<engine::LoraRequest>) -> Self {
        if let Some(lora) = &lora {
            self.envelope.model.clone_from(&lora.name);
        }
        self.options.lora = lora;
        self
    }

    /// The call's job, its finished parameters validated here, once (a bad field is a 400
    /// naming it; the engine takes them as they are).
    fn new(
        envelope: Envelope,
        prompts: Vec<Prompt>,
        params: SamplingParams,
        options: RequestOptions,
        fields: &SamplingFields,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            envelope,
            prompts,
            params: crate::openai::validated(params)?,
            options,
            stream: fields.stream,
            include_usage: fields.include_usage(),
            constraint_field: fields.constraints.constraint_field(),
            completion: None,
            prompt_top: None,
        })
    }

    /// Submits every prompt (all or none: an error aborts the ones already in) and answers.
    async fn respond(mut self, state: Arc<AppState>) -> Response {
        let (streams, echo_texts) = match self.submit(&state).await {
            Ok(submitted) => submitted,
            Err(e) => return e.into_response(),
        };
        let shown = Shown { completion: self.completion, echo_texts, prompt_top: self.prompt_top };
        if self.stream {
            let keep_alive = state.sse_keep_alive;
            sse_response(sse_events(state, self.envelope, streams, self.include_usage, shown), keep_alive)
        } else {
            whole_response(&state, &self.envelope, streams, &shown).await
        }
    }
}

impl Job {
    /// Submits every prompt (all or none: an error aborts the ones already in): their streams,
    /// and with `echo` their texts. Submission (template rendering, tokenization, compiling the
    /// constraint) runs on a blocking thread, never on a tokio worker.
    async fn submit(&mut self, state: &Arc<AppState>) -> Result<(Vec<OutputStream>, Vec<String>), ApiError> {
        let submitting = Arc::clone(state);
        let (base, prompts, params, options) = (
            self.envelope.id.clone(),
            std::mem::take(&mut self.prompts),
            self.params.clone(),
            std::mem::take(&mut self.options),
        );
        let echo = self.completion.is_some_and(|c| c.plan.echo);
        let submitted = tokio::task::spawn_blocking(move || {
            let mut streams = Vec::with_capacity(prompts.len());
            let echo_texts: Vec<String> =
                if echo { prompts.iter().map(|p| prompt_text(&submitting, p)).collect() } else { Vec::new() };
            // The engine's ids are unique among live requests even when two clients send the
            // same `X-Request-Id`: each call adds a fresh number.
            let call = submitting.handle.next_request_id();
            for (i, prompt) in prompts.into_iter().enumerate() {
                let id = format!("{base}-{call}-{i}");
                // On an error, dropping `streams` aborts the requests already submitted.
                streams.push(submitting.handle.submit(id, prompt, params.clone(), options.clone())?);
            }
            Ok::<_, engine::RequestError>((streams, echo_texts))
        })
        .await;
        match submitted {
            Ok(Ok(submitted)) => Ok(submitted),
            Ok(Err(e)) => {
                let constraint = matches!(e, engine::RequestError::Constraint { .. });
                let mut error = ApiError::from(e);
                if constraint && self.constraint_field.is_some() {
                    error.param = self.constraint_field;
                }
                Err(error)
            }
            Err(e) => Err(ApiError::internal(format!("submission failed: {e}"))),
        }
    }

    /// The job of one prompt submitted on its own (`/v1/responses`): its stream and its tool
    /// plan (how its finished text is read for calls).
    pub(crate) async fn submit_one(
        mut self,
        state: &Arc<AppState>,
    ) -> Result<(OutputStream, Option<crate::tools::ToolPlan>), ApiError> {
        let (streams, _) = self.submit(state).await?;
        let stream = streams.into_iter().next().ok_or_else(|| ApiError::internal("no request submitted"))?;
        Ok((stream, self.envelope.tools))
    }
}

/// What a call's choices show beside their samples: the completions' echo and best_of, the
/// prompts' texts (echoed), chat's `prompt_logprobs`.
struct Shown {
    completion: Option<CompletionJob>,
    echo_texts: Vec<String>,
    prompt_top: Option<usize>,
}

impl Shown {
    fn parts<'a>(&'a self, prompt: usize, logprobs: Option<&'a PromptLogprobs>) -> PromptParts<'a> {
        match &self.completion {
            Some(c) => c.parts(self.echo_texts.get(prompt).map(String::as_str), logprobs),
            None => PromptParts { logprobs, prompt_top: self.prompt_top, ..PromptParts::default() },
        }
    }

    /// Which of a prompt's samples become its choices: all of them, or with `best_of` the `n`
    /// of highest cumulative logprob (best first).
    fn chosen<'a>(&self, completions: &'a [Completion]) -> Vec<&'a Completion> {
        let Some(plan) = self.completion.map(|c| c.plan).filter(|p| p.best_of > p.n) else {
            return completions.iter().collect();
        };
        let mut ranked: Vec<&Completion> = completions.iter().collect();
        let score =
            |c: &Completion| c.cumulative_logprob.filter(|v| !v.is_nan()).unwrap_or(f64::NEG_INFINITY);
        ranked.sort_by(|a, b| score(b).total_cmp(&score(a)));
        ranked.truncate(plan.n);
        ranked
    }

    /// `echo` with `max_tokens: 0` counts no completion token (the one generated is not shown).
    fn counts_completion(&self) -> bool {
        !self.completion.is_some_and(|c| c.plan.prompt_only)
    }
}

/// The text a prompt echoes: as the client sent it, or its token ids decoded.
fn prompt_text(state: &AppState, prompt: &Prompt) -> String {
    match prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Tokens(ids) => state.handle.tokenizer().decode(ids, false).unwrap_or_default(),
        // The completions endpoint sends no chat prompt.
        Prompt::Chat(_) | Prompt::Conversation(_) => String::new(),
    }
}

/// Every request's outputs, tagged with its prompt's index, interleaved as they come.
fn merged(
    streams: Vec<OutputStream>,
) -> SelectAll<impl Stream<Item = (usize, Result<engine::RequestOutput, engine::StreamError>)>> {
    stream::select_all(streams.into_iter().enumerate().map(|(i, s)| s.map(move |item| (i, item))))
}

async fn whole_response(
    state: &AppState,
    envelope: &Envelope,
    streams: Vec<OutputStream>,
    shown: &Shown,
) -> Response {
    // One folded result per prompt; its completions are the prompt's `n` choices.
    let mut finals: Vec<FinalOutput> =
        streams.iter().map(|s| FinalOutput::new(s.id().to_owned(), 0)).collect();
    let mut usage = Usage::default();
    let mut all = merged(streams);
    while let Some((prompt, item)) = all.next().await {
        let out = match item {
            Ok(out) => out,
            Err(e) => return stream_error(e).into_response(),
        };
        if let Some(fin) = finals.get_mut(prompt) {
            fin.absorb(&out);
        }
        state.metrics.observe(&out, envelope.endpoint.api());
        if out.finished {
            usage.add_final(&out, shown.counts_completion());
        }
    }
    let choices: Vec<(&Completion, PromptParts<'_>)> = finals
        .iter()
        .enumerate()
        .flat_map(|(i, f)| {
            let parts = shown.parts(i, f.prompt_logprobs.as_ref());
            shown.chosen(&f.completions).into_iter().map(move |c| (c, parts))
        })
        .collect();
    let tokens = TokenText { tokenizer: state.handle.tokenizer() };
    Json(envelope.response(&choices, &usage, &tokens)).into_response()
}

/// An SSE response of `events`, with a keep-alive comment every `keep_alive` on a quiet stream.
pub(crate) fn sse_response(
    events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
    keep_alive: Option<std::time::Duration>,
) -> Response {
    let sse = Sse::new(events);
    match keep_alive {
        Some(every) => sse.keep_alive(KeepAlive::new().interval(every)).into_response(),
        None => sse.into_response(),
    }
}

/// A request that failed inside the engine, as the API reports it.
pub(crate) fn stream_error(e: engine::StreamError) -> ApiError {
    match e {
        engine::StreamError::Rejected(e) => e.into(),
        other => ApiError {
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: other.to_string(),
            param: None,
        },
    }
}

/// The SSE events of a streamed call: one chunk per delta (a chat choice opens with the
/// assistant's role, sent with its request's first output: a client timing the first chunk
/// measures the time to the first token), the usage chunk when asked for, then `[DONE]`.
fn sse_events(
    state: Arc<AppState>,
    envelope: Envelope,
    streams: Vec<OutputStream>,
    include_usage: bool,
    shown: Shown,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let choices = streams.len() * envelope.n;
    let streams_len = streams.len();
    // The unfold's state owns everything a chunk needs: no per-chunk clones.
    let start = SseState {
        roles_sent: vec![envelope.endpoint != Endpoint::Chat; streams.len()],
        all: merged(streams),
        usage: Usage::default(),
        offsets: vec![0; choices],
        opened: vec![false; choices],
        prompt_logprobs: vec![None; streams_len],
        held: Vec::new(),
        reasoning: crate::reasoning::ChoiceSplitters::new(envelope.reasoning),
        state,
        envelope,
        shown,
    };
    let body = stream::unfold(Some(start), move |st| async move {
        let mut st = st?;
        let Some((prompt, item)) = st.all.next().await else {
            // Every request ended: the usage chunk, then the end marker.
            let mut tail = Vec::new();
            if include_usage {
                tail.push(json_event(&st.envelope.usage_chunk(&st.usage)));
            }
            tail.push(Event::default().data("[DONE]"));
            return Some((tail, None));
        };
        let events = match item {
            Ok(out) => {
                let mut events = st.role_chunks(prompt);
                events.extend(st.chunks(prompt, &out));
                events
            }
            Err(e) => vec![Event::default().data(sse_safe_json(error_event_json(&stream_error(e).message)))],
        };
        Some((events, Some(st)))
    });
    body.flat_map(stream::iter).map(Ok::<Event, Infallible>)
}

/// A streamed call in flight: its requests' merged outputs and what its chunks accumulate.
struct SseState<S> {
    /// Each prompt's choices have had their role chunks (chat; always true for completions).
    roles_sent: Vec<bool>,
    all: SelectAll<S>,
    usage: Usage,
    /// Characters of text each choice has sent (completions logprobs' `text_offset`).
    offsets: Vec<usize>,
    /// Each choice has sent its first chunk (the one that echoes the prompt).
    opened: Vec<bool>,
    /// Each prompt's logprobs, from its request's first output.
    prompt_logprobs: Vec<Option<PromptLogprobs>>,
    /// A tools stream's text of each choice, held until it finishes.
    held: Vec<String>,
    /// With a reasoning parser, each choice's splitter.
    reasoning: crate::reasoning::ChoiceSplitters,
    state: Arc<AppState>,
    envelope: Envelope,
    shown: Shown,
}

impl<S> SseState<S> {
    /// The role chunks of prompt `prompt`'s choices, the first time it has output.
    fn role_chunks(&mut self, prompt: usize) -> Vec<Event> {
        match self.roles_sent.get_mut(prompt) {
            Some(sent) if !*sent => {
                *sent = true;
                let first = prompt * self.envelope.n;
                (first..first + self.envelope.n).map(|i| json_event(&self.envelope.role_chunk(i))).collect()
            }
            _ => Vec::new(),
        }
    }

    /// One chunk per delta of `out` (prompt `prompt`'s request); a final output also counts
    /// its usage and latencies.
    fn chunks(&mut self, prompt: usize, out: &engine::RequestOutput) -> Vec<Event> {
        let tokens = TokenText { tokenizer: self.state.handle.tokenizer() };
        if self.envelope.tools.is_some() {
            return self.tool_chunks(prompt, out);
        }
        if let Some(lps) = &out.prompt_logprobs
            && let Some(slot) = self.prompt_logprobs.get_mut(prompt)
        {
            *slot = Some(lps.clone());
        }
        let events = out
            .outputs
            .iter()
            .map(|d| {
                let index = prompt * self.envelope.n + d.index;
                let opening = self.opened.get_mut(index).is_some_and(|o| !std::mem::replace(o, true));
                let mut parts =
                    self.shown.parts(prompt, self.prompt_logprobs.get(prompt).and_then(Option::as_ref));
                if !opening {
                    // Only a choice's first chunk echoes its prompt.
                    parts = PromptParts { prompt_only: parts.prompt_only, ..PromptParts::default() };
                }
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                let (d, reasoning) = self.reasoning.split(index, d);
                let chunk =
                    self.envelope.delta_chunk(prompt, &d, &tokens, offset, parts, reasoning.as_deref());
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += chunk.text_chars();
                }
                json_event(&chunk)
            })
            .collect();
        self.state.metrics.observe(out, self.envelope.endpoint.api());
        if out.finished {
            self.usage.add_final(out, self.shown.counts_completion());
        }
        events
    }
}

impl<S> SseState<S> {
    /// A tools stream: each choice's text is held back until it finishes, then sent as its
    /// `tool_calls` (or as the text, when it holds no call).
    fn tool_chunks(&mut self, prompt: usize, out: &engine::RequestOutput) -> Vec<Event> {
        let mut events = Vec::new();
        for d in &out.outputs {
            let index = prompt * self.envelope.n + d.index;
            if self.held.len() <= index {
                self.held.resize(index + 1, String::new());
            }
            self.held[index].push_str(&d.text);
            if let Some(finish) = &d.finish_reason {
                let text = std::mem::take(&mut self.held[index]);
                events.push(json_event(&self.envelope.tool_chunk(index, &text, Some(finish.as_str()))));
            }
        }
        self.state.metrics.observe(out, self.envelope.endpoint.api());
        if out.finished {
            self.usage.add_final(out, true);
        }
        events
    }
}

fn json_event(body: &impl serde::Serialize) -> Event {
    // A body of plain structs, strings and numbers always serializes.
    let json = serde_json::to_string(body).unwrap_or_default();
    Event::default().data(sse_safe_json(json))
}

/// JSON with the three line breaks JSON leaves raw (U+0085, U+2028, U+2029) escaped: they can
/// only stand inside strings, and line readers that split on every Unicode line break (Python's
/// `str.splitlines`, which some SSE clients use) would otherwise cut the event in two. Model
/// text produces them now and then (a sampled token decoding to U+2028, say).
pub(crate) fn sse_safe_json(json: String) -> String {
    if !json.contains(['\u{85}', '\u{2028}', '\u{2029}']) {
        return json;
    }
    json.replace('\u{85}', "\\u0085").replace('\u{2028}', "\\u2028").replace('\u{2029}', "\\u2029")
}

#[cfg(test)]
mod tests {
    use super::sse_safe_json;

    #[test]
    fn unicode_line_breaks_are_escaped_and_the_json_is_unchanged() {
        let v = serde_json::json!({"text": "a\u{2028}b\u{85}c\u{2029}d\ne"});
        let safe = sse_safe_json(v.to_string());
        assert!(!safe.contains(['\u{85}', '\u{2028}', '\u{2029}', '\n']), "{safe}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), v);
        assert_eq!(sse_safe_json("{\"a\":1}".into()), "{\"a\":1}");
    }
}
