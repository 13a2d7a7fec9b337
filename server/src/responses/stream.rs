//! A streamed `/v1/responses` call: `response.created` and `response.in_progress` at once;
//! the reasoning item's text (under `--reasoning-parser`) and, without tools, the message's
//! text as they come, each item opened when its first text arrives (reasoning at 0, the
//! message after it); with tools the answer's items once its text is whole (the calls are
//! known only then); then `response.completed` (or `response.incomplete`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event;
use engine::OutputStream;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::json;

use super::Finish;
use super::items::{Events, Item, incomplete_reason};
use crate::AppState;
use crate::folded::Folded;
use crate::generate::stream_error;
use crate::metrics::Api;
use crate::reasoning::{ReasoningStream, Split};

/// A streamed response in flight.
struct Live {
    output: OutputStream,
    events: Events,
    folded: Folded,
    /// With a reasoning parser, the splitter of the text as it comes.
    splitter: Option<ReasoningStream>,
    /// The reasoning item, once open: its index and whether it is closed.
    reasoning: Option<(usize, bool)>,
    reasoning_text: String,
    /// The message item's index, once open (its text streams; without tools only).
    message: Option<usize>,
    message_text: String,
    /// The index the next opened item takes.
    next: usize,
    finish: Finish,
    state: Arc<AppState>,
}

pub(super) fn events(
    state: Arc<AppState>,
    output: OutputStream,
    finish: Finish,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut events = Events::default();
    let snapshot = finish.meta.response("in_progress", Vec::new(), None, None);
    let opening = vec![
        events.event("response.created", json!({"response": snapshot})),
        events.event("response.in_progress", json!({"response": snapshot})),
    ];
    let live = Live {
        output,
        events,
        folded: Folded::default(),
        splitter: finish.reasoning.map(ReasoningStream::new),
        reasoning: None,
        reasoning_text: String::new(),
        message: None,
        message_text: String::new(),
        next: 0,
        finish,
        state,
    };
    let body = stream::unfold(Some(live), |live| async move {
        let mut live = live?;
        match live.output.next().await {
            Some(Ok(out)) => {
                let new = live.folded.absorb(&live.state.metrics, Api::Responses, &out);
                let split = match &mut live.splitter {
                    Some(s) => s.push(&new),
                    None => Split { reasoning: String::new(), content: new },
                };
                let mut events = live.deltas(split);
                if out.finished {
                    events.extend(live.finished());
                    return Some((events, None));
                }
                Some((events, Some(live)))
            }
            Some(Err(e)) => {
                let message = stream_error(e).message;
                let error =
                    live.events.event("error", json!({"code": null, "message": message, "param": null}));
                Some((vec![error], None))
            }
            None => Some((live.finished(), None)),
        }
    });
    stream::iter(opening).chain(body.flat_map(stream::iter)).map(Ok::<Event, Infallible>)
}

impl Live {
    /// The events of a piece of reasoning and of content: the reasoning item opened at its
    /// first text and closed at the content's; the message opened at its first text (content
    /// is held for the end with tools).
    fn deltas(&mut self, split: Split) -> Vec<Event> {
        let base = self.finish.meta.base.clone();
        let mut events = Vec::new();
        if !split.reasoning.is_empty() {
            let index = match self.reasoning {
                Some((i, _)) => i,
                None => {
                    let i = self.take_index();
                    self.reasoning = Some((i, false));
                    events.push(self.events.open_reasoning(&base, i));
                    i
                }
            };
            self.reasoning_text.push_str(&split.reasoning);
            events.push(self.events.reasoning_delta(&base, index, &split.reasoning));
        }
        if !split.content.is_empty() && self.finish.tools.is_none() {
            events.extend(self.close_reasoning());
            let index = match self.message {
                Some(i) => i,
                None => {
                    let i = self.take_index();
                    self.message = Some(i);
                    events.extend(self.events.open_message(&base, i));
                    i
                }
            };
            self.message_text.push_str(&split.content);
            events.push(self.events.text_delta(&base, index, &split.content));
        }
        events
    }

    fn take_index(&mut self) -> usize {
        self.next += 1;
        self.next - 1
    }

    /// The open reasoning item's closing, once.
    fn close_reasoning(&mut self) -> Vec<Event> {
        match self.reasoning {
            Some((i, false)) => {
                self.reasoning = Some((i, true));
                self.events.close_reasoning(&self.finish.meta.base, i, &self.reasoning_text)
            }
            _ => Vec::new(),
        }
    }

    /// The events that close the response: what the splitter held back, each item's closing
    /// (or whole items, for those never opened), then the finished response.
    fn finished(mut self) -> Vec<Event> {
        let rest = self.splitter.as_mut().map(ReasoningStream::finish).unwrap_or_default();
        let mut events = self.deltas(rest);
        events.extend(self.close_reasoning());
        let base = self.finish.meta.base.clone();
        let items = self.finish.items(&self.folded.text);
        for (i, item) in items.iter().enumerate() {
            match item {
                // Streamed and closed above (the split of the whole text is the streamed one).
                Item::Reasoning(_) if self.reasoning.is_some() => {}
                Item::Reasoning(text) => {
                    events.push(self.events.open_reasoning(&base, i));
                    events.push(self.events.reasoning_delta(&base, i, text));
                    events.extend(self.events.close_reasoning(&base, i, text));
                }
                Item::Message(text) => {
                    if self.message != Some(i) {
                        events.extend(self.events.open_message(&base, i));
                        if !text.is_empty() {
                            events.push(self.events.text_delta(&base, i, text));
                        }
                    }
                    events.extend(self.events.close_message(&base, i, text));
                }
                Item::Call { .. } => events.extend(self.events.call(&base, i, item)),
            }
        }
        let finish = self.folded.finish_str();
        let kind =
            if incomplete_reason(finish).is_some() { "response.incomplete" } else { "response.completed" };
        let response = self.finish.response(&self.state, &items, &self.folded.usage, finish);
        events.push(self.events.event(kind, json!({"response": response})));
        events
    }
}
