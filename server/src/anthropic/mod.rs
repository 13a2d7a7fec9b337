//! Anthropic's `POST /v1/messages` over the chat endpoint's path: the body becomes a chat
//! request (`request.rs`), checked and submitted as one chat job; its finished text becomes
//! content blocks (`text`, or with tools the `tool_use` calls it holds; with a reasoning parser
//! and `thinking` enabled, a `thinking` block of the reasoning ahead of them, which is otherwise
//! left out) in one message object or as Anthropic's event stream (`message_start`,
//! `content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`). Errors take
//! Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`), and the API key is
//! read from `x-api-key` as well as `Authorization: Bearer`.

mod request;

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use engine::{FinishReason, OutputStream};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::folded::Folded;
use crate::generate::{JobRequest, stream_error};
use crate::reasoning::{ReasoningStream, Split};
use crate::request_id::{request_id, with_request_id};
use crate::tools::ToolPlan;
use crate::{AppState, ReasoningParser};
use request::MessagesRequest;

/// The path whose errors take Anthropic's shape.
pub const PATH: &str = "/v1/messages";

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<crate::JsonBody<MessagesRequest>, ApiError>,
) -> Response {
    let base = match request_id(&headers, None) {
        Ok(base) => base,
        Err(e) => return error_response(&e),
    };
    let response = match body.and_then(|b| prepare(&state, &b.0, &base)) {
        Ok(call) => call.run(state).await,
        Err(e) => error_response(&e),
    };
    with_request_id(response, &base)
}

/// An error in Anthropic's shape, with its status.
pub fn error_response(e: &ApiError) -> Response {
    let kind = match e.status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        _ => "api_error",
    };
    let body = Json(json!({"type": "error", "error": {"type": kind, "message": e.message}}));
    crate::error::with_retry_after((e.status, body).into_response())
}

/// A checked call, ready to submit.
struct Call {
    job: crate::generate::Job,
    /// The call's base id (the message's and its calls' ids derive from it).
    base: String,
    model: String,
    stream: bool,
    thinking: bool,
}

fn prepare(state: &AppState, req: &MessagesRequest, base: &str) -> Result<Call, ApiError> {
    let lora = state.model_adapter(req.model.as_deref())?;
    req.check_extra()?;
    let thinking = req.thinking()?;
    if thinking && state.reasoning_parser.is_none() {
        return Err(ApiError::bad_request(
            "thinking needs a reasoning model: start the server with --reasoning-parser",
            Some("thinking"),
        ));
    }
    let job = req.chat_request()?.job(state, base)?.with_lora(lora.clone());
    let model = lora.map_or_else(|| state.handle.model_name().to_owned(), |l| l.name);
    Ok(Call { job, base: base.to_owned(), model, stream: req.stream, thinking })
}

impl Call {
    async fn run(self, state: Arc<AppState>) -> Response {
        let (output, tools) = match self.job.submit_one(&state).await {
            Ok(submitted) => submitted,
            Err(e) => return error_response(&e),
        };
        let message = Message {
            id: format!("msg_{}", self.base),
            base: self.base,
            model: self.model,
            tools,
            reasoning: state.reasoning_parser,
            thinking: self.thinking,
        };
        if self.stream {
            let keep_alive = state.sse_keep_alive;
            crate::generate::sse_response(events(state, output, message), keep_alive)
        } else {
            let folded = match Folded::whole(&state.metrics, crate::metrics::Api::Messages, output).await {
                Ok(folded) => folded,
                Err(e) => return error_response(&e),
            };
            let (content, stop_reason, stop_sequence) = message.content(&folded);
            let mut body = message.object(content, &folded);
            body["stop_reason"] = json!(stop_reason);
            body["stop_sequence"] = json!(stop_sequence);
            Json(body).into_response()
        }
    }
}

/// What a message's object and blocks are made of.
struct Message {
    /// `msg_<base>`.
    id: String,
    base: String,
    model: String,
    tools: Option<ToolPlan>,
    /// The server's reasoning parser: its span is never text.
    reasoning: Option<ReasoningParser>,
    /// The span comes back as a `thinking` block.
    thinking: bool,
}

impl Message {
    /// The message object (`stop_reason` still null) with `content` and the usage so far.
    fn object(&self, content: Vec<Value>, folded: &Folded) -> Value {
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": folded.usage.prompt_tokens, "output_tokens": folded.usage.completion_tokens,
                "cache_read_input_tokens": folded.usage.cached_tokens, "cache_creation_input_tokens": 0},
        })
    }

    /// The finished text's blocks (the calls it holds, after any text beside them, with tools;
    /// else the text), the stop reason and the stop sequence that ended it.
    fn content(&self, folded: &Folded) -> (Vec<Value>, &'static str, Option<String>) {
        let (reasoning, text) = match self.reasoning {
            Some(parser) => parser.split(&folded.text),
            None => (None, Some(folded.text.clone())),
        };
        let text = text.unwrap_or_default();
        let thinking = reasoning.filter(|_| self.thinking).map(|r| thinking_block(&r));
        let calls = self.tools.as_ref().and_then(|t| t.parse(&text, &self.base));
        if let Some((text, calls)) = calls {
            let text = text.map(|t| json!({"type": "text", "text": t}));
            let blocks = thinking.into_iter().chain(text).chain(calls.into_iter().map(|c| {
                let input = serde_json::from_str::<Value>(&c.function.arguments)
                    .unwrap_or(Value::String(c.function.arguments));
                json!({"type": "tool_use", "id": c.id, "name": c.function.name, "input": input})
            }));
            return (blocks.collect(), "tool_use", None);
        }
        let (reason, sequence) = match &folded.finish {
            Some(FinishReason::StopString(s)) => ("stop_sequence", Some(s.clone())),
            Some(FinishReason::Length) => ("max_tokens", None),
            _ => ("end_turn", None),
        };
        (thinking.into_iter().chain([json!({"type": "text", "text": text})]).collect(), reason, sequence)
    }
}

fn thinking_block(thinking: &str) -> Value {
    json!({"type": "thinking", "thinking": thinking, "signature": ""})
}

/// Where a streamed message's thinking block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thinking {
    NotStarted,
    Open,
    Stopped,
}

fn event(kind: &str, mut body: Value) -> Event {
    body["type"] = json!(kind);
    Event::default().event(kind).data(crate::generate::sse_safe_json(body.to_string()))
}

/// A streamed message in flight.
struct Live {
    output: OutputStream,
    folded: Folded,
    /// The text block is open (its text streams as it comes; without tools only).
    open: bool,
    /// The thinking block (block 0 when there is one; it streams ahead of the text).
    thinking: Thinking,
    /// With a reasoning parser, the text's splitter.
    splitter: Option<ReasoningStream>,
    message: Message,
    state: Arc<AppState>,
}

/// Anthropic's events: `message_start` at once; without tools the thinking block's deltas (when
/// asked for) then the text block's, as they come; with tools the blocks once the text is whole
/// (the calls are known only then), a `tool_use` block's input in one `input_json_delta`; then
/// `message_delta` (stop reason, output tokens) and `message_stop`.
fn events(
    state: Arc<AppState>,
    output: OutputStream,
    message: Message,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let start = event("message_start", json!({"message": message.object(Vec::new(), &Folded::default())}));
    let splitter = message.reasoning.map(ReasoningStream::new);
    let live = Live {
        output,
        folded: Folded::default(),
        open: false,
        thinking: Thinking::NotStarted,
        splitter,
        message,
        state,
    };
    let body = stream::unfold(Some(live), |live| async move {
        let mut live = live?;
        match live.output.next().await {
            Some(Ok(out)) => {
                let new = live.folded.absorb(&live.state.metrics, crate::metrics::Api::Messages, &out);
                let mut events = Vec::new();
                if live.message.tools.is_none() {
                    live.stream_share(&new, out.finished, &mut events);
                }
                if out.finished {
                    events.extend(live.finished());
                    return Some((events, None));
                }
                Some((events, Some(live)))
            }
            Some(Err(e)) => {
                let e = stream_error(e);
                Some((
                    vec![event("error", json!({"error": {"type": "api_error", "message": e.message}}))],
                    None,
                ))
            }
            None => Some((live.finished(), None)),
        }
    });
    stream::once(async { start }).chain(body.flat_map(stream::iter)).map(Ok::<Event, Infallible>)
}

fn text_start(index: usize) -> Event {
    event("content_block_start", json!({"index": index, "content_block": {"type": "text", "text": ""}}))
}

fn thinking_start(index: usize) -> Event {
    event("content_block_start", json!({"index": index, "content_block": thinking_block("")}))
}

fn thinking_delta(index: usize, thinking: &str) -> Event {
    let delta = json!({"type": "thinking_delta", "thinking": thinking});
    event("content_block_delta", json!({"index": index, "delta": delta}))
}

fn text_delta(index: usize, text: &str) -> Event {
    event("content_block_delta", json!({"index": index, "delta": {"type": "text_delta", "text": text}}))
}

impl Live {
    /// The events of `new` text (and, once `finished`, of what the splitter held back): the
    /// reasoning as thinking deltas when asked for, the content as text deltas.
    fn stream_share(&mut self, new: &str, finished: bool, events: &mut Vec<Event>) {
        let share = match &mut self.splitter {
            Some(splitter) => splitter.take(new, finished),
            None => Split { reasoning: String::new(), content: new.to_owned() },
        };
        if self.message.thinking && !share.reasoning.is_empty() {
            if self.thinking == Thinking::NotStarted {
                self.thinking = Thinking::Open;
                events.push(thinking_start(0));
            }
            events.push(thinking_delta(0, &share.reasoning));
        }
        if !share.content.is_empty() {
            if self.thinking == Thinking::Open {
                self.thinking = Thinking::Stopped;
                events.push(event("content_block_stop", json!({"index": 0})));
            }
            let index = usize::from(self.thinking != Thinking::NotStarted);
            if !self.open {
                self.open = true;
                events.push(text_start(index));
            }
            events.push(text_delta(index, &share.content));
        }
    }

    /// The closing events: every block's (or the open text block's end), then the stop.
    fn finished(self) -> Vec<Event> {
        let (blocks, stop_reason, stop_sequence) = self.message.content(&self.folded);
        let mut events = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            if block["type"] == "tool_use" {
                let mut start = block.clone();
                start["input"] = json!({});
                events.push(event("content_block_start", json!({"index": i, "content_block": start})));
                let partial = block["input"].to_string();
                events.push(event(
                    "content_block_delta",
                    json!({"index": i, "delta": {"type": "input_json_delta", "partial_json": partial}}),
                ));
            } else if block["type"] == "thinking" {
                match self.thinking {
                    Thinking::Stopped => continue,
                    Thinking::Open => {}
                    Thinking::NotStarted => {
                        events.push(thinking_start(i));
                        events.push(thinking_delta(i, block["thinking"].as_str().unwrap_or_default()));
                    }
                }
            } else if !self.open {
                events.push(text_start(i));
                let text = block["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    events.push(text_delta(i, text));
                }
            }
            events.push(event("content_block_stop", json!({"index": i})));
        }
        let usage = &self.folded.usage;
        events.push(event(
            "message_delta",
            json!({"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}}),
        ));
        events.push(event("message_stop", json!({})));
        events
    }
}
