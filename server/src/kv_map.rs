//! `GET /v1/kv_map` and `GET /v1/kv_map/stream`: the engine's live KV block map as compact JSON,
//! once or as an SSE stream at a bounded rate (what the web page's KV panel draws).
//!
//! # The JSON (one snapshot)
//! ```text
//! {
//!   "generation": 7,          // which request for a snapshot this answers (grows)
//!   "block_size": 16,         // tokens per block
//!   "device": "..ccoos...",   // one ASCII character per device block, block id order
//!   "host": "o...",           // the same for the host swap pool ("" without one)
//!   "tables": [               // running sequences first, then swapped ones
//!     {"id": "chatcmpl-1", "key": 3, "seq": 0, "swapped": false, "tokens": 41,
//!      "blocks": [12, 13, 4]} // logical block i -> physical block blocks[i]
//!   ],                        // (in the host pool when "swapped")
//!   "counters": {"kv_usage": 0.05, "device_blocks_used": 3, "device_blocks_cached": 2,
//!     "host_blocks_used": 1, "prefix_hit_rate": 0.4, "prefix_queried_tokens": 80,
//!     "prefix_hit_tokens": 32, "num_running": 1, "num_waiting": 0, "num_swapped": 1,
//!     "num_preemptions": 1, "steps": 120}
//! }
//! ```
//! Block characters (`block_alloc::BlockState`): `.` free, `c` cached (free, but its content
//! is in the prefix cache until an allocation evicts it), `o` owned (ref count 1), `s` shared
//! (ref count > 1: a prefix hit on a held block, or the prompt blocks of `n > 1` samples).
//! A string of them costs one byte per block, needs no decoding (`device[i]` is block `i`'s
//! state) and no escaping. `id` is the client's request id, `key` the engine's admission key
//! (two samples of one request share both; `seq` tells them apart).
//!
//! The snapshot is taken by the engine thread between two steps, only when asked; no handler
//! waits on more than that (see `engine::kv_map`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use engine::{EngineHandle, KvSnapshot};
use futures_util::Stream;
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

/// Longest a handler waits for the engine's next step boundary before answering with the last
/// snapshot it has (or 503 when there is none).
const WAIT: Duration = Duration::from_secs(5);
/// Bounds of the stream's period (`?interval_ms=`).
pub const MIN_INTERVAL: Duration = Duration::from_millis(50);
pub const MAX_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Serialize)]
struct KvMapJson<'a> {
    generation: u64,
    block_size: usize,
    device: &'a str,
    host: &'a str,
    tables: Vec<TableJson<'a>>,
    counters: CountersJson,
}

#[derive(Serialize)]
struct TableJson<'a> {
    id: &'a str,
    key: u64,
    seq: u32,
    /// KV cache group, and its sliding window (`null`: full attention).
    group: u32,
    window: Option<usize>,
    /// Logical index of `blocks[0]`: the blocks before it left the window.
    first_block: usize,
    swapped: bool,
    tokens: usize,
    blocks: &'a [u32],
}

#[derive(Serialize)]
struct CountersJson {
    kv_usage: f64,
    device_blocks_used: usize,
    device_blocks_cached: usize,
    host_blocks_used: usize,
    prefix_hit_rate: f64,
    prefix_queried_tokens: u64,
    prefix_hit_tokens: u64,
    num_running: usize,
    num_waiting: usize,
    num_swapped: usize,
    num_preemptions: u64,
    steps: u64,
}

/// The snapshot as the JSON documented in this module.
pub fn kv_map_json(snapshot: &KvSnapshot) -> String {
    let map = &snapshot.map;
    let ascii = |bytes: &[u8]| -> String {
        bytes.iter().map(|&b| if b.is_ascii() { b as char } else { '?' }).collect()
    };
    // The state bytes are ASCII by construction; the fallback only guards the conversion.
    let (device_owned, host_owned);
    let device = match std::str::from_utf8(&map.device) {
        Ok(s) => s,
        Err(_) => {
            device_owned = ascii(&map.device);
            &device_owned
        }
    };
    let host = match std::str::from_utf8(&map.host) {
        Ok(s) => s,
        Err(_) => {
            host_owned = ascii(&map.host);
            &host_owned
        }
    };
    let c = &map.counters;
    let json = KvMapJson {
        generation: snapshot.generation,
        block_size: map.block_size,
        device,
        host,
        tables: map
            .tables
            .iter()
            .zip(&snapshot.request_ids)
            .map(|(t, id)| TableJson {
                id,
                key: t.request.0,
                seq: t.seq,
                group: t.group,
                window: map.group_windows.get(t.group as usize).copied().flatten(),
                first_block: t.first_block,
                swapped: t.swapped,
                tokens: t.num_tokens,
                blocks: map.table_blocks(t),
            })
            .collect(),
        counters: CountersJson {
            kv_usage: c.kv_usage,
            device_blocks_used: c.device_blocks_used,
            device_blocks_cached: c.device_blocks_cached,
            host_blocks_used: c.host_blocks_used,
            prefix_hit_rate: c.prefix_hit_rate,
            prefix_queried_tokens: c.prefix_queried_tokens,
            prefix_hit_tokens: c.prefix_hit_tokens,
            num_running: c.num_running,
            num_waiting: c.num_waiting,
            num_swapped: c.num_swapped,
            num_preemptions: c.num_preemptions,
            steps: c.steps,
        },
    };
    // Serializing plain numbers, strings and arrays cannot fail.
    serde_json::to_string(&json).unwrap_or_default()
}

/// A snapshot taken at a step boundary after the call, or the latest one if the engine is
/// in a step longer than [`WAIT`]; `None` when the engine has stopped (or never answered).
async fn fresh_snapshot(handle: &EngineHandle) -> Option<Arc<KvSnapshot>> {
    match tokio::time::timeout(WAIT, handle.kv_map()).await {
        Ok(Ok(snapshot)) => Some(snapshot),
        Ok(Err(_)) => None,
        Err(_) => handle.latest_kv_map(),
    }
}

fn unavailable() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "the engine is not running".into(),
        param: None,
    }
}

/// `GET /v1/kv_map`: one snapshot of the KV block pools, taken between two engine steps, as
/// the JSON documented in this module (`server::kv_map`): `device` and `host` are strings of
/// one character per block (`.` free, `c` cached, `o` owned, `s` shared), `tables` each running
/// or swapped sequence's `blocks` (logical → physical), `counters` the usage, prefix hit rate,
/// queue lengths and preemptions. 503 when the engine has stopped.
pub(crate) async fn kv_map(
    State(state): State<Arc<AppState>>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let snapshot = fresh_snapshot(&state.handle).await.ok_or_else(unavailable)?;
    let body = kv_map_json(&snapshot);
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body))
}

/// `?interval_ms=` of the stream.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamQuery {
    interval_ms: Option<u64>,
}

/// `GET /v1/kv_map/stream[?interval_ms=N]`: an SSE stream of snapshots (each event's `data` is
/// the JSON of `GET /v1/kv_map`), one per period: `interval_ms` clamped to 50..=10 000, by
/// default the server's `kv_map_interval` (250 ms). A snapshot is asked for only when the
/// period is due, so the engine takes at most one per period for each client. It ends when the
/// client goes away (the body and its timer are dropped) or when the engine stops.
pub(crate) async fn kv_map_stream(
    State(state): State<Arc<AppState>>,
    Query(query): Query<StreamQuery>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let period = query
        .interval_ms
        .map_or(state.kv_map_interval, Duration::from_millis)
        .clamp(MIN_INTERVAL, MAX_INTERVAL);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events = futures_util::stream::unfold((state, ticker), |(state, mut ticker)| async move {
        ticker.tick().await;
        let snapshot = fresh_snapshot(&state.handle).await?;
        let event = Event::default().data(crate::generate::sse_safe_json(kv_map_json(&snapshot)));
        Some((Ok(event), (state, ticker)))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
