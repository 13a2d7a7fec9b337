//! What `/v1/responses` answers: the response object, its output items (a `reasoning` item
//! with the `<think>` span under `--reasoning-parser`, an assistant `message` with one
//! `output_text` part, `function_call` items) and the typed stream events (`response.created`,
//! `response.output_item.added`, `response.reasoning_text.delta`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, …, `response.completed`), each with its
//! `sequence_number`.

use axum::response::sse::Event;
use serde_json::{Map, Value, json};

use crate::reasoning::ReasoningParser;
use crate::respond::Usage;
use crate::tools::ToolPlan;

/// The fields of the response object that come from the request, and its ids.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `resp_<base>`.
    pub id: String,
    /// The call's base id (item ids derive from it).
    pub base: String,
    pub created_at: u64,
    pub model: String,
    /// Echoed request fields (`instructions`, `max_output_tokens`, `tools`, …).
    pub echoed: Map<String, Value>,
}

/// One output item before it is shown: reasoning, text, or a call.
#[derive(Debug, Clone)]
pub enum Item {
    Reasoning(String),
    Message(String),
    Call { call_id: String, name: String, arguments: String },
}

impl Item {
    /// The items of a finished text: its reasoning first (with a parser, where there is any);
    /// then with tools the calls the rest holds (after the text beside them, if any), else one
    /// message.
    pub fn of_text(
        text: &str,
        reasoning: Option<ReasoningParser>,
        tools: Option<&ToolPlan>,
        base: &str,
    ) -> Vec<Item> {
        let (thought, content) = match reasoning {
            Some(parser) => {
                let (thought, content) = parser.split(text);
                (thought, content.unwrap_or_default())
            }
            None => (None, text.to_owned()),
        };
        let thought = thought.map(Item::Reasoning).into_iter();
        if let Some((content, calls)) = tools.and_then(|t| t.parse(&content, base)) {
            let calls = calls.into_iter().map(|c| Item::Call {
                call_id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
            });
            return thought.chain(content.map(Item::Message)).chain(calls).collect();
        }
        thought.chain([Item::Message(content)]).collect()
    }

    /// Item `index` of response `base` as the API shows it, with `status`.
    pub fn json(&self, base: &str, index: usize, status: &str) -> Value {
        match self {
            Item::Reasoning(text) => json!({
                "type": "reasoning", "id": format!("rs_{base}_{index}"), "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
            }),
            Item::Message(text) => json!({
                "type": "message", "id": format!("msg_{base}_{index}"), "status": status, "role": "assistant",
                "content": [output_text(text)],
            }),
            Item::Call { call_id, name, arguments } => json!({
                "type": "function_call", "id": format!("fc_{base}_{index}"), "call_id": call_id,
                "name": name, "arguments": arguments, "status": status,
            }),
        }
    }

    /// The items as one chat message, for a later `previous_response_id` (the reasoning left
    /// out, as the chat templates of reasoning models drop earlier turns' thinking).
    pub fn message(items: &[Item]) -> Value {
        let text: String = items
            .iter()
            .filter_map(|i| match i {
                Item::Message(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let calls: Vec<Value> = items
            .iter()
            .filter_map(|i| match i {
                Item::Call { call_id, name, arguments } => Some(json!({
                    "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})),
                _ => None,
            })
            .collect();
        if calls.is_empty() {
            json!({"role": "assistant", "content": text})
        } else {
            json!({"role": "assistant", "content": text, "tool_calls": calls})
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// Why a response stopped short: `max_output_tokens` when its output hit the limit.
pub fn incomplete_reason(finish: Option<&str>) -> Option<&'static str> {
    (finish == Some("length")).then_some("max_output_tokens")
}

impl Meta {
    /// The response object: `status` `in_progress`, `completed` or `incomplete`, its output
    /// items, and usage once known.
    pub fn response(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Option<&Usage>,
        incomplete: Option<&str>,
    ) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": output, "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
        });
        if let Some(obj) = r.as_object_mut() {
            obj.extend(self.echoed.clone());
        }
        r
    }
}

/// A stream's events, numbered in order.
#[derive(Debug, Default)]
pub struct Events {
    next: u64,
}

impl Events {
    /// Event `kind` with `fields` (and its `type` and `sequence_number`).
    pub fn event(&mut self, kind: &str, fields: Value) -> Event {
        let mut body = fields;
        if let Some(obj) = body.as_object_mut() {
            obj.insert("type".into(), json!(kind));
            obj.insert("sequence_number".into(), json!(self.next));
        }
        self.next += 1;
        let data = crate::generate::sse_safe_json(body.to_string());
        Event::default().event(kind).data(data)
    }

    /// The opening of a message item at `index`: the item, then its empty text part.
    pub fn open_message(&mut self, base: &str, index: usize) -> Vec<Event> {
        let mut item = Item::Message(String::new()).json(base, index, "in_progress");
        // The stream adds the part itself (`content_part.added`).
        item["content"] = json!([]);
        let item_id = item["id"].clone();
        vec![
            self.event("response.output_item.added", json!({"output_index": index, "item": item})),
            self.event(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": output_text("")}),
            ),
        ]
    }

    /// A piece of a message's text.
    pub fn text_delta(&mut self, base: &str, index: usize, delta: &str) -> Event {
        self.event(
            "response.output_text.delta",
            json!({"item_id": format!("msg_{base}_{index}"), "output_index": index, "content_index": 0,
                "delta": delta, "logprobs": []}),
        )
    }

    /// The closing of a message item whose whole text is `text`.
    pub fn close_message(&mut self, base: &str, index: usize, text: &str) -> Vec<Event> {
        let item_id = format!("msg_{base}_{index}");
        vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": output_text(text)}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": Item::Message(text.to_owned()).json(base, index, "completed")}),
            ),
        ]
    }

    /// The opening of a reasoning item at `index`.
    pub fn open_reasoning(&mut self, base: &str, index: usize) -> Event {
        let mut item = Item::Reasoning(String::new()).json(base, index, "in_progress");
        item["content"] = json!([]);
        self.event("response.output_item.added", json!({"output_index": index, "item": item}))
    }

    /// A piece of a reasoning item's text.
    pub fn reasoning_delta(&mut self, base: &str, index: usize, delta: &str) -> Event {
        self.event(
            "response.reasoning_text.delta",
            json!({"item_id": format!("rs_{base}_{index}"), "output_index": index, "content_index": 0, "delta": delta}),
        )
    }

    /// The closing of a reasoning item whose whole text is `text`.
    pub fn close_reasoning(&mut self, base: &str, index: usize, text: &str) -> Vec<Event> {
        let item_id = format!("rs_{base}_{index}");
        vec![
            self.event(
                "response.reasoning_text.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": Item::Reasoning(text.to_owned()).json(base, index, "completed")}),
            ),
        ]
    }

    /// A whole call item: added (arguments empty), its arguments in one delta, done.
    pub fn call(&mut self, base: &str, index: usize, item: &Item) -> Vec<Event> {
        let done = item.json(base, index, "completed");
        let mut added = item.json(base, index, "in_progress");
        added["arguments"] = json!("");
        let (item_id, arguments) = (done["id"].clone(), done["arguments"].clone());
        vec![
            self.event("response.output_item.added", json!({"output_index": index, "item": added})),
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": arguments}),
            ),
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "arguments": arguments}),
            ),
            self.event("response.output_item.done", json!({"output_index": index, "item": done})),
        ]
    }
}
