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
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use engine::{Completion, FinalOutput, OutputStream, Prompt, RequestOptions, SamplingParams};
use futures_util::stream::{self, SelectAll, Stream, StreamExt};

use crate::AppState;
use crate::error::{ApiError, error_event_json};
use crate::openai::{ChatRequest, CompletionRequest, SamplingFields};
use crate::respond::{Endpoint, Envelope, TokenText, Usage};

/// OpenAI's default `max_tokens` of the legacy completions endpoint.
const COMPLETIONS_DEFAULT_MAX_TOKENS: i64 = 16;

pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: crate::JsonBody<CompletionRequest>,
) -> Response {
    let req = body.0;
    let run = || -> Result<Job, ApiError> {
        state.check_model(req.model.as_deref())?;
        req.check_unsupported()?;
        let max_tokens = req.sampling.max_tokens.or(Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        let params =
            req.sampling.to_params(state.handle.default_sampling_params(), max_tokens, req.logprobs)?;
        let prompts = req.prompt.clone().into_prompts()?;
        Ok(Job::new(&state, Endpoint::Completions, prompts, params, &req.sampling, false))
    };
    match run() {
        Ok(job) => job.respond(state).await,
        Err(e) => e.into_response(),
    }
}

pub async fn chat(State(state): State<Arc<AppState>>, body: crate::JsonBody<ChatRequest>) -> Response {
    let req = body.0;
    let run = || -> Result<Job, ApiError> {
        state.check_model(req.model.as_deref())?;
        let max_tokens = req.max_completion_tokens.or(req.sampling.max_tokens);
        let top = if req.logprobs { Some(req.top_logprobs.unwrap_or(0)) } else { None };
        let mut params = req.sampling.to_params(state.handle.default_sampling_params(), max_tokens, top)?;
        let prompts = vec![req.prompt()?];
        let tools = crate::tools::plan(
            req.tools.as_deref(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls.unwrap_or(true),
        )?;
        let (tools, tool_constraint) = tools.map_or((None, None), |(p, c)| (Some(p), c));
        let mut constraint_field = req.sampling.constraints.constraint_field();
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
        let mut job = Job::new(&state, Endpoint::Chat, prompts, params, &req.sampling, req.logprobs);
        job.envelope.tools = tools;
        job.constraint_field = constraint_field;
        Ok(job)
    };
    match run() {
        Ok(job) => job.respond(state).await,
        Err(e) => e.into_response(),
    }
}

/// One API call, checked and ready to submit.
struct Job {
    envelope: Envelope,
    prompts: Vec<Prompt>,
    params: SamplingParams,
    stream: bool,
    include_usage: bool,
    /// The request field that set its output constraint (what a compile error names).
    constraint_field: Option<&'static str>,
}

impl Job {
    fn new(
        state: &AppState,
        endpoint: Endpoint,
        prompts: Vec<Prompt>,
        params: SamplingParams,
        fields: &SamplingFields,
        logprobs: bool,
    ) -> Self {
        let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
        Self {
            envelope: Envelope {
                id: format!("{prefix}-{}", state.handle.next_request_id()),
                created: crate::unix_now(),
                model: state.handle.model_name().to_owned(),
                endpoint,
                n: params.n,
                logprobs,
                tools: None,
            },
            prompts,
            params,
            stream: fields.stream,
            include_usage: fields.include_usage(),
            constraint_field: fields.constraints.constraint_field(),
        }
    }

    /// Submits every prompt (all or none: an error aborts the ones already in) and answers.
    /// Submission (template rendering, tokenization, compiling the constraint) runs on a
    /// blocking thread, never on a tokio worker.
    async fn respond(self, state: Arc<AppState>) -> Response {
        let submitting = Arc::clone(&state);
        let (base, prompts, params) = (self.envelope.id.clone(), self.prompts, self.params);
        let submitted = tokio::task::spawn_blocking(move || {
            let mut streams = Vec::with_capacity(prompts.len());
            for (i, prompt) in prompts.into_iter().enumerate() {
                let id = format!("{base}-{i}");
                // On an error, dropping `streams` aborts the requests already submitted.
                streams.push(submitting.handle.submit(
                    id,
                    prompt,
                    params.clone(),
                    RequestOptions::default(),
                )?);
            }
            Ok::<_, engine::RequestError>(streams)
        })
        .await;
        let streams = match submitted {
            Ok(Ok(streams)) => streams,
            Ok(Err(e)) => {
                let constraint = matches!(e, engine::RequestError::Constraint { .. });
                let mut error = ApiError::from(e);
                if constraint && self.constraint_field.is_some() {
                    error.param = self.constraint_field;
                }
                return error.into_response();
            }
            Err(e) => return ApiError::internal(format!("submission failed: {e}")).into_response(),
        };
        if self.stream {
            let events = sse_events(state, self.envelope, streams, self.include_usage);
            Sse::new(events).keep_alive(KeepAlive::default()).into_response()
        } else {
            whole_response(&state, &self.envelope, streams).await
        }
    }
}

/// Every request's outputs, tagged with its prompt's index, interleaved as they come.
fn merged(
    streams: Vec<OutputStream>,
) -> SelectAll<impl Stream<Item = (usize, Result<engine::RequestOutput, engine::StreamError>)>> {
    stream::select_all(streams.into_iter().enumerate().map(|(i, s)| s.map(move |item| (i, item))))
}

async fn whole_response(state: &AppState, envelope: &Envelope, streams: Vec<OutputStream>) -> Response {
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
        if out.finished {
            usage.add_final(&out);
            state.metrics.observe_final(&out);
        }
    }
    let choices: Vec<&Completion> = finals.iter().flat_map(|f| &f.completions).collect();
    let tokens = TokenText { tokenizer: state.handle.tokenizer() };
    Json(envelope.response(&choices, &usage, &tokens)).into_response()
}

/// A request that failed inside the engine, as the API reports it.
fn stream_error(e: engine::StreamError) -> ApiError {
    match e {
        engine::StreamError::Rejected(e) => e.into(),
        other => ApiError {
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: other.to_string(),
            param: None,
        },
    }
}

/// The SSE events of a streamed call: chat's role chunks, one chunk per delta, the usage chunk
/// when asked for, then `[DONE]`.
fn sse_events(
    state: Arc<AppState>,
    envelope: Envelope,
    streams: Vec<OutputStream>,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let choices = streams.len() * envelope.n;
    let opening: Vec<Event> = if envelope.endpoint == Endpoint::Chat {
        (0..choices).map(|i| json_event(&envelope.role_chunk(i))).collect()
    } else {
        Vec::new()
    };
    // The unfold's state owns everything a chunk needs: no per-chunk clones.
    let start = SseState {
        all: merged(streams),
        usage: Usage::default(),
        offsets: vec![0; choices],
        held: Vec::new(),
        state,
        envelope,
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
            Ok(out) => st.chunks(prompt, &out),
            Err(e) => vec![Event::default().data(sse_safe_json(error_event_json(&stream_error(e).message)))],
        };
        Some((events, Some(st)))
    });
    stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok::<Event, Infallible>)
}

/// A streamed call in flight: its requests' merged outputs and what its chunks accumulate.
struct SseState<S> {
    all: SelectAll<S>,
    usage: Usage,
    /// Characters of text each choice has sent (completions logprobs' `text_offset`).
    offsets: Vec<usize>,
    /// A tools stream's text of each choice, held until it finishes.
    held: Vec<String>,
    state: Arc<AppState>,
    envelope: Envelope,
}

impl<S> SseState<S> {
    /// One chunk per delta of `out` (prompt `prompt`'s request); a final output also counts
    /// its usage and latencies.
    fn chunks(&mut self, prompt: usize, out: &engine::RequestOutput) -> Vec<Event> {
        let tokens = TokenText { tokenizer: self.state.handle.tokenizer() };
        if self.envelope.tools.is_some() {
            return self.tool_chunks(prompt, out);
        }
        let events = out
            .outputs
            .iter()
            .map(|d| {
                let index = prompt * self.envelope.n + d.index;
                let offset = self.offsets.get(index).copied().unwrap_or(0);
                if let Some(o) = self.offsets.get_mut(index) {
                    *o += d.text.chars().count();
                }
                json_event(&self.envelope.delta_chunk(prompt, d, &tokens, offset))
            })
            .collect();
        if out.finished {
            self.usage.add_final(out);
            self.state.metrics.observe_final(out);
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
        if out.finished {
            self.usage.add_final(out);
            self.state.metrics.observe_final(out);
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
