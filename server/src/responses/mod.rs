//! `POST /v1/responses` and `GET /v1/responses/{id}`: OpenAI's Responses API over the chat
//! endpoint's path. The body becomes a chat request (`request.rs`), checked and submitted as
//! one chat job; its finished text becomes output items (`items.rs`: a message, or with tools
//! the calls it holds) in one JSON object or as the typed event stream; a stored response
//! (`store: true`, the default) is kept in a bounded store (`store.rs`) for
//! `previous_response_id`, which continues its conversation.

mod items;
mod request;
pub mod store;
mod stream;

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::OutputStream;
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::error::ApiError;
use crate::folded::Folded;
use crate::generate::{Job, JobRequest};
use crate::request_id::{request_id, with_request_id};
use crate::respond::Usage;
use crate::tools::ToolPlan;
use items::{Item, Meta, incomplete_reason};
use request::ResponsesRequest;
use store::Stored;

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: crate::JsonBody<ResponsesRequest>,
) -> Response {
    let req = body.0;
    let base = match request_id(&headers, req.request_id.as_deref()) {
        Ok(base) => base,
        Err(e) => return e.into_response(),
    };
    let response = match prepare(&state, &req, &base) {
        Ok(call) => call.run(state).await,
        Err(e) => e.into_response(),
    };
    with_request_id(response, &base)
}

/// `GET /v1/responses/{id}`: a stored response, or a 404.
pub(crate) async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(stored) => Json(stored.response.clone()).into_response(),
        None => not_found(&id, None).into_response(),
    }
}

fn not_found(id: &str, param: Option<&'static str>) -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, message: format!("no stored response with id {id:?}"), param }
}

/// A checked call, ready to submit.
struct Call {
    job: Job,
    meta: Meta,
    /// The turns up to this call's input (the earlier response's, then this input).
    conversation: Vec<Value>,
    store: bool,
    stream: bool,
}

/// The call's checks (model, fields, items, the earlier response) and its chat job.
fn prepare(state: &AppState, req: &ResponsesRequest, base: &str) -> Result<Call, ApiError> {
    let lora = state.model_adapter(req.model.as_deref())?;
    req.check_extra()?;
    let mut conversation = match &req.previous_response_id {
        Some(id) => {
            let earlier =
                state.responses.get(id).ok_or_else(|| not_found(id, Some("previous_response_id")))?;
            earlier.conversation.clone()
        }
        None => Vec::new(),
    };
    let input = req.input_messages(&conversation)?;
    conversation.extend(input);
    let job = req.chat_request(&conversation)?.job(state, base)?.with_lora(lora.clone());
    let meta = Meta {
        id: format!("resp_{base}"),
        base: base.to_owned(),
        created_at: crate::unix_now(),
        model: lora.map_or_else(|| state.handle.model_name().to_owned(), |l| l.name),
        echoed: echoed(req),
    };
    Ok(Call { job, meta, conversation, store: req.store.unwrap_or(true), stream: req.stream })
}

/// The request's fields the response object repeats, with OpenAI's defaults.
fn echoed(req: &ResponsesRequest) -> Map<String, Value> {
    let text = req.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}}));
    let fields = json!({
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "tools": req.tools.clone().unwrap_or_default(),
        "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true), "text": text,
        "previous_response_id": req.previous_response_id, "store": req.store.unwrap_or(true),
        "metadata": req.metadata.clone().unwrap_or_default(), "user": req.user,
        "truncation": "disabled", "reasoning": null,
    });
    fields.as_object().cloned().unwrap_or_default()
}

impl Call {
    async fn run(self, state: Arc<AppState>) -> Response {
        let Call { job, meta, conversation, store, stream } = self;
        let (output, tools) = match job.submit_one(&state).await {
            Ok(submitted) => submitted,
            Err(e) => return e.into_response(),
        };
        let finish = Finish { meta, tools, reasoning: state.reasoning_parser, conversation, store };
        if stream {
            let keep_alive = state.sse_keep_alive;
            crate::generate::sse_response(stream::events(state, output, finish), keep_alive)
        } else {
            whole(&state, output, finish).await
        }
    }
}

/// What finishing a response needs: its fields, how its text is read, what it stores.
struct Finish {
    meta: Meta,
    tools: Option<ToolPlan>,
    reasoning: Option<crate::ReasoningParser>,
    conversation: Vec<Value>,
    store: bool,
}

impl Finish {
    /// The items of the finished text.
    fn items(&self, text: &str) -> Vec<Item> {
        Item::of_text(text, self.reasoning, self.tools.as_ref(), &self.meta.base)
    }

    /// The finished response object over `items`; stored when the call asked for that.
    fn response(self, state: &AppState, items: &[Item], usage: &Usage, finish: Option<&str>) -> Value {
        let incomplete = incomplete_reason(finish);
        let status = if incomplete.is_some() { "incomplete" } else { "completed" };
        let base = &self.meta.base;
        let output = items.iter().enumerate().map(|(i, item)| item.json(base, i, status)).collect();
        let response = self.meta.response(status, output, Some(usage), incomplete);
        if self.store {
            let mut conversation = self.conversation;
            conversation.push(Item::message(items));
            state.responses.put(self.meta.id.clone(), Stored::new(response.clone(), conversation));
        }
        response
    }
}

async fn whole(state: &AppState, output: OutputStream, finish: Finish) -> Response {
    let folded = match Folded::whole(&state.metrics, crate::metrics::Api::Responses, output).await {
        Ok(folded) => folded,
        Err(e) => return e.into_response(),
    };
    let items = finish.items(&folded.text);
    Json(finish.response(state, &items, &folded.usage, folded.finish_str())).into_response()
}
