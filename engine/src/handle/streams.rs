//! What a caller receives one request's outputs through: the blocking `RequestStream` and the
//! async `OutputStream` (the engine's sending side of either is `output::Sink`, kept in the
//! request's record), the `Ticket` with which a stream dropped before its end aborts exactly
//! its own admission, and the `AbortHandle` that does the same from anywhere else.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::Command;
use crate::engine::Intake;
use crate::output::{FinalOutput, RequestKey, RequestOutput, StreamError, StreamItem};

/// The outputs of one request, in order; ends after the output marked `finished`.
#[derive(Debug)]
pub struct RequestStream {
    ticket: Ticket,
    rx: Receiver<StreamItem>,
    done: bool,
}

impl RequestStream {
    pub(super) fn new(ticket: Ticket, rx: Receiver<StreamItem>) -> Self {
        Self { ticket, rx, done: false }
    }

    pub fn id(&self) -> &str {
        &self.ticket.id
    }

    /// The engine's key of this admission (outputs carry it as `request_key`).
    pub fn key(&self) -> RequestKey {
        self.ticket.key
    }

    /// Blocks for the next output; `None` once the final one was returned.
    pub fn recv(&mut self) -> Option<Result<RequestOutput, StreamError>> {
        if self.done {
            return None;
        }
        let item = self.rx.recv().unwrap_or(Err(StreamError::EngineStopped));
        self.done = is_last(&item);
        Some(item)
    }

    /// Like `recv`, giving up after `timeout` (`Ok(None)`: nothing yet).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<Result<Option<RequestOutput>, StreamError>> {
        if self.done {
            return None;
        }
        let item = match self.rx.recv_timeout(timeout) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) => return Some(Ok(None)),
            Err(RecvTimeoutError::Disconnected) => Err(StreamError::EngineStopped),
        };
        self.done = is_last(&item);
        Some(item.map(Some))
    }

    /// Waits for the end and folds every delta into the final result.
    pub fn collect_final(mut self) -> Result<FinalOutput, StreamError> {
        let mut fin = FinalOutput::new(self.ticket.id.clone(), 0);
        while let Some(item) = self.recv() {
            let out = item?;
            fin.prompt_tokens = out.prompt_tokens;
            fin.absorb(&out);
        }
        Ok(fin)
    }
}

/// One submitted request as its stream knows it, and how to abort it.
#[derive(Debug, Clone)]
pub(super) struct Ticket {
    pub(super) id: String,
    pub(super) key: RequestKey,
    pub(super) tx: Sender<Command>,
    pub(super) intake: Arc<Intake>,
}

impl Ticket {
    /// Frees the id at once (so the client may reuse it right away) and has the engine abort
    /// exactly this admission.
    fn abort(&self) {
        self.intake.forget(&self.id, self.key);
        let _ = self.tx.send(Command::AbortKey(self.key));
    }
}

/// Whether a stream item is its request's last (the final output, or an error).
fn is_last(item: &StreamItem) -> bool {
    item.as_ref().map_or(true, |o| o.finished)
}

impl Iterator for RequestStream {
    type Item = Result<RequestOutput, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            self.ticket.abort();
        }
    }
}

/// The async twin of [`RequestStream`]: a `futures::Stream` of one request's outputs, ending
/// after the output marked `finished` (or an error). Dropping it before the end aborts the
/// request; its blocks are freed at the engine's next step boundary.
#[derive(Debug)]
pub struct OutputStream {
    ticket: Ticket,
    rx: tokio::sync::mpsc::UnboundedReceiver<StreamItem>,
    done: bool,
}

impl OutputStream {
    pub(super) fn new(ticket: Ticket, rx: tokio::sync::mpsc::UnboundedReceiver<StreamItem>) -> Self {
        Self { ticket, rx, done: false }
    }

    pub fn id(&self) -> &str {
        &self.ticket.id
    }

    pub fn key(&self) -> RequestKey {
        self.ticket.key
    }

    /// Aborts this admission from elsewhere: another task or thread, even while this stream
    /// is being awaited (a binding whose caller cancelled a pending read cannot reach the
    /// stream to drop it).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle { ticket: self.ticket.clone() }
    }

    /// The next output; `None` once the final one was returned.
    pub async fn recv(&mut self) -> Option<Result<RequestOutput, StreamError>> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamItem>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = match self.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item.unwrap_or(Err(StreamError::EngineStopped)),
        };
        self.done = is_last(&item);
        Poll::Ready(Some(item))
    }
}

/// Aborts exactly one admission (never a later request that took over its id); once the
/// request has finished it does nothing. Its stream then ends with an `Abort` output.
#[derive(Debug, Clone)]
pub struct AbortHandle {
    ticket: Ticket,
}

impl AbortHandle {
    pub fn abort(&self) {
        self.ticket.abort();
    }
}

impl futures_core::Stream for OutputStream {
    type Item = Result<RequestOutput, StreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}

impl Drop for OutputStream {
    fn drop(&mut self) {
        if !self.done {
            self.ticket.abort();
        }
    }
}
