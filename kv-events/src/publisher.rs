//! [`KvEventPublisher`]: vLLM's `ZmqEventPublisher` — a PUB socket sending
//! `(topic, 8-byte big-endian sequence number, payload)` per batch and a ROUTER socket that
//! replays buffered batches from a requested sequence number, on a thread of its own.
//!
//! The engine thread never waits on a socket: [`KvEventPublisher::publish`] encodes the batch,
//! numbers it, and puts it in the replay buffer and the live queue under a short lock. When the
//! live queue is full its oldest batch is dropped from the live stream only; a subscriber that
//! sees the gap asks the replay socket, which still holds it (while within `buffer_steps`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::{KvEventBatch, KvEventsConfig, KvEventsError};

/// The sequence number of the replay stream's end marker (`-1` as a signed 8-byte integer).
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// How long dropping a publisher waits for its thread to hand over what is queued.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one replay message may wait for room in its client's queue.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// A running publisher. Dropping it hands what is queued to the PUB socket (waiting at most
/// `SHUTDOWN_TIMEOUT`) and closes the sockets; as with any PUB socket, messages still in flight
/// then may not reach subscribers.
#[derive(Debug)]
pub struct KvEventPublisher {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    endpoint: String,
    replay_endpoint: Option<String>,
    block_size: usize,
    next_seq: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Batches not yet sent on the PUB socket, oldest first.
    live: VecDeque<(u64, Bytes)>,
    /// The last `buffer_steps` batches, oldest first, for replay.
    replay: VecDeque<(u64, Bytes)>,
    max_queue_size: usize,
    buffer_steps: usize,
    /// Batches dropped from the live queue because it was full, or sent to no peer while a
    /// connecting socket had none yet.
    dropped: u64,
    closed: bool,
}

impl KvEventPublisher {
    /// Binds (or connects) the sockets of `cfg` and starts the publisher thread. Errors name
    /// the endpoint that could not be bound. `block_size`: tokens per block, for `BlockStored`.
    pub fn start(cfg: &KvEventsConfig, block_size: usize) -> Result<Self, KvEventsError> {
        cfg.validate()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                max_queue_size: cfg.max_queue_size,
                buffer_steps: cfg.buffer_steps,
                ..State::default()
            }),
            wake: Notify::new(),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (shared, thread_cfg) = (shared.clone(), cfg.clone());
            std::thread::Builder::new()
                .name("kv-events".into())
                .spawn(move || run(&thread_cfg, &shared, &ready_tx))
                .map_err(|e| KvEventsError::Socket {
                    endpoint: cfg.endpoint.clone(),
                    reason: e.to_string(),
                })?
        };
        let (endpoint, replay_endpoint) = ready_rx.recv().map_err(|_| KvEventsError::Socket {
            endpoint: cfg.endpoint.clone(),
            reason: "the publisher thread stopped while starting".into(),
        })??;
        Ok(Self { shared, thread: Some(thread), endpoint, replay_endpoint, block_size, next_seq: 0 })
    }

    /// The PUB socket's address as bound (a port of 0 resolved) or connected.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay socket's address as bound, if there is one.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues a batch under the next sequence number (returned); never blocks on the network.
    pub fn publish(&mut self, batch: &KvEventBatch) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(batch.encode(self.block_size));
        self.shared.state.lock().push(seq, payload);
        self.shared.wake.notify_one();
        seq
    }

    /// Batches dropped from the live stream because the queue was full or a connecting socket had
    /// no peer yet (replay still has them while they are among the last `buffer_steps`).
    pub fn num_dropped(&self) -> u64 {
        self.shared.state.lock().dropped
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.shared.state.lock().closed = true;
        self.shared.wake.notify_one();
        let Some(thread) = self.thread.take() else { return };
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            tracing::warn!(
                "kv events: the publisher thread did not finish within {SHUTDOWN_TIMEOUT:?}; left behind"
            );
        }
    }
}

impl State {
    /// Queues batch `seq` for the live stream and keeps it for replay, each queue dropping its
    /// oldest entry when full.
    fn push(&mut self, seq: u64, payload: Bytes) {
        if self.replay.len() == self.buffer_steps {
            self.replay.pop_front();
        }
        self.replay.push_back((seq, payload.clone()));
        if self.live.len() == self.max_queue_size {
            self.live.pop_front();
            self.dropped += 1;
        }
        self.live.push_back((seq, payload));
    }
}

type Ready = Result<(String, Option<String>), KvEventsError>;

/// The publisher thread: a one-thread runtime for the sockets. Replay requests are served by a
/// task of their own, so a replay client that reads slowly never holds up the live stream.
fn run(cfg: &KvEventsConfig, shared: &Arc<Shared>, ready: &std::sync::mpsc::Sender<Ready>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready
                .send(Err(KvEventsError::Socket { endpoint: cfg.endpoint.clone(), reason: e.to_string() }));
            return;
        }
    };
    runtime.block_on(async {
        let (mut publisher, replay) = match open(cfg).await {
            Ok((publisher, replay, endpoints)) => {
                let _ = ready.send(Ok(endpoints));
                (publisher, replay)
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let replays = replay.map(|socket| tokio::spawn(serve_replays(socket, shared.clone())));
        if !KvEventsConfig::binds(&cfg.endpoint) && !connect(&mut publisher, &cfg.endpoint, shared).await {
            if let Some(task) = replays {
                task.abort();
            }
            return;
        }
        let topic = Bytes::from(cfg.topic.clone().into_bytes());
        'serve: loop {
            shared.wake.notified().await;
            loop {
                // One lock for both: a batch published just before closing is still sent.
                let (next, closed) = {
                    let mut state = shared.state.lock();
                    (state.live.pop_front(), state.closed)
                };
                let Some((seq, payload)) = next else {
                    if closed {
                        break 'serve;
                    }
                    break;
                };
                let message =
                    message(vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload]);
                if let Err(e) = publisher.send(message).await {
                    tracing::warn!("kv events: publishing batch {seq}: {e}");
                }
            }
        }
        if let Some(task) = replays {
            task.abort();
        }
        // The PUB socket's fan-out is a task of this runtime: let it take what was just sent.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    });
}

/// `tcp://*:PORT` as a socket address: `*` is every IPv4 interface (the zmq.rs transport
/// resolves a host name, and `*` names none).
fn bind_address(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// Connects the PUB socket to `endpoint` (a proxy's SUB side), as long as it takes, as libzmq
/// keeps trying: until then the live batches go nowhere (a PUB without peers drops them; replay
/// keeps them). False when the publisher closed first.
async fn connect(publisher: &mut PubSocket, endpoint: &str, shared: &Shared) -> bool {
    loop {
        let mut connecting = std::pin::pin!(publisher.connect(endpoint));
        loop {
            tokio::select! {
                connected = &mut connecting => match connected {
                    Ok(()) => return true,
                    Err(e) => {
                        tracing::warn!("kv events: connecting to {endpoint}: {e}; trying again");
                        break;
                    }
                },
                () = shared.wake.notified() => {
                    let mut state = shared.state.lock();
                    if state.closed {
                        return false;
                    }
                    let unsent = state.live.len() as u64;
                    state.live.clear();
                    state.dropped += unsent;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens the sockets; returns them with the addresses as bound. A connecting PUB socket
/// (vLLM's rule: an endpoint without a wildcard) is only checked here; [`connect`] reaches its
/// peer in the background.
async fn open(
    cfg: &KvEventsConfig,
) -> Result<(PubSocket, Option<RouterSocket>, (String, Option<String>)), KvEventsError> {
    let fail = |endpoint: &str, reason: String| KvEventsError::Socket { endpoint: endpoint.into(), reason };
    let mut publisher = PubSocket::new();
    let endpoint = if KvEventsConfig::binds(&cfg.endpoint) {
        let bound = publisher.bind(&bind_address(&cfg.endpoint)).await;
        bound.map_err(|e| fail(&cfg.endpoint, e.to_string()))?.to_string()
    } else {
        cfg.endpoint.parse::<zeromq::Endpoint>().map_err(|e| fail(&cfg.endpoint, e.to_string()))?;
        cfg.endpoint.clone()
    };
    let mut bound_replay = None;
    let replay = match &cfg.replay_endpoint {
        Some(address) => {
            let mut socket = RouterSocket::new();
            let bound =
                socket.bind(&bind_address(address)).await.map_err(|e| fail(address, e.to_string()))?;
            bound_replay = Some(bound.to_string());
            Some(socket)
        }
        None => None,
    };
    Ok((publisher, replay, (endpoint, bound_replay)))
}

/// Serves replay requests until the task is aborted.
async fn serve_replays(mut socket: RouterSocket, shared: Arc<Shared>) {
    loop {
        match socket.recv().await {
            Ok(request) => serve_replay(&mut socket, request, &shared).await,
            Err(e) => tracing::warn!("kv events: replay socket: {e}"),
        }
    }
}

/// Answers `[identity, "", start_seq]` (a REQ socket's request, or a DEALER's with an empty
/// first frame) with every buffered batch from `start_seq` on as `[identity, "", seq,
/// payload]`, then `[identity, "", END_SEQ, ""]`. Anything else is ignored. Answers queue per
/// client (zmq.rs bounds that queue); a send still waiting after `REPLY_TIMEOUT` ends the answer.
async fn serve_replay(socket: &mut RouterSocket, request: ZmqMessage, shared: &Shared) {
    let frames = request.into_vec();
    let start = match frames.as_slice() {
        [_, delimiter, seq] if delimiter.is_empty() => match <[u8; 8]>::try_from(seq.as_ref()) {
            Ok(bytes) => u64::from_be_bytes(bytes),
            Err(_) => {
                return tracing::debug!(
                    "kv events: replay request with a {}-byte sequence number",
                    seq.len()
                );
            }
        },
        _ => return tracing::debug!("kv events: replay request of {} frames ignored", frames.len()),
    };
    let identity = frames[0].clone();
    let batches: Vec<(u64, Bytes)> =
        shared.state.lock().replay.iter().filter(|(seq, _)| *seq >= start).cloned().collect();
    let replies = batches
        .into_iter()
        .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload))
        .chain(std::iter::once((Bytes::from_static(&END_SEQ), Bytes::new())));
    for (seq, payload) in replies {
        let reply = message(vec![identity.clone(), Bytes::new(), seq, payload]);
        match tokio::time::timeout(REPLY_TIMEOUT, socket.send(reply)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return tracing::debug!("kv events: replay answer not delivered: {e}"),
            Err(_) => return tracing::debug!("kv events: replay client not reading; answer cut short"),
        }
    }
}

fn message(frames: Vec<Bytes>) -> ZmqMessage {
    ZmqMessage::try_from(frames).unwrap_or_else(|_| unreachable!("a message of several frames is not empty"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_host_binds_every_ipv4_interface() {
        assert_eq!(bind_address("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(bind_address("tcp://127.0.0.1:0"), "tcp://127.0.0.1:0");
    }

    #[test]
    fn a_full_live_queue_drops_its_oldest_batches_which_replay_still_holds() {
        let mut state = State { max_queue_size: 2, buffer_steps: 4, ..State::default() };
        for seq in 0..6 {
            state.push(seq, Bytes::from(vec![seq as u8]));
        }
        let seqs = |q: &VecDeque<(u64, Bytes)>| q.iter().map(|(s, _)| *s).collect::<Vec<_>>();
        assert_eq!((seqs(&state.live), state.dropped), (vec![4, 5], 4));
        assert_eq!(seqs(&state.replay), [2, 3, 4, 5], "dropped batches 2 and 3 are still replayable");
    }
}
