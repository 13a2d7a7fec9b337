//! KV cache events from a running engine: a subscriber that joins before the workload, misses
//! what a PUB socket drops before its subscription lands, and fills the gap through the replay
//! socket, rebuilds exactly the engine's prefix-cache contents through evictions and both
//! kinds of preemption. (`python/tests/test_kv_events.py` decodes the same stream with libzmq
//! and vLLM's msgspec types.)

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use engine::{EngineConfig, PreemptionMode, SamplingParams};
use kv_events::{END_SEQ, KvEventsConfig};
use rmpv::Value;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::support::*;

fn events_config() -> KvEventsConfig {
    KvEventsConfig::from_json(
        r#"{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:0",
            "replay_endpoint": "tcp://127.0.0.1:0", "topic": "kv"}"#,
    )
    .unwrap()
}

/// A subscriber's view: the hashes each medium holds, and how many events of each kind it saw.
#[derive(Default)]
struct View {
    gpu: HashSet<u64>,
    cpu: HashSet<u64>,
    cpu_events: usize,
}

/// Applies one decoded `KVEventBatch` to a subscriber's sets; returns how many events it held.
fn apply(view: &mut View, payload: &[u8], block_size: u64) -> usize {
    let batch = rmpv::decode::read_value(&mut &payload[..]).unwrap();
    let Value::Array(batch) = batch else { panic!("batch {batch:?}") };
    assert!(matches!(batch[0], Value::F64(ts) if ts > 1e9), "ts {:?}", batch[0]);
    let Value::Array(events) = &batch[1] else { panic!("events {:?}", batch[1]) };
    let uints =
        |v: &Value| -> Vec<u64> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect() };
    for e in events {
        let e = e.as_array().unwrap();
        let medium = e.last().and_then(Value::as_str);
        if medium == Some("CPU") {
            view.cpu_events += 1;
        }
        let set = if medium == Some("CPU") { &mut view.cpu } else { &mut view.gpu };
        match e[0].as_str().unwrap() {
            "BlockStored" => {
                let hashes = uints(&e[1]);
                assert_eq!(uints(&e[3]).len() as u64, hashes.len() as u64 * block_size);
                assert_eq!((e[4].as_u64(), e[5].is_nil()), (Some(block_size), true));
                assert!(matches!(medium, Some("GPU" | "CPU")), "{medium:?}");
                for h in hashes {
                    assert!(set.insert(h), "stored twice: {h}");
                }
            }
            "BlockRemoved" => {
                for h in uints(&e[1]) {
                    assert!(set.remove(&h), "removed but not stored: {h}");
                }
            }
            "AllBlocksCleared" => set.clear(),
            other => panic!("event {other}"),
        }
    }
    events.len()
}

fn workload() -> Vec<(String, Vec<u32>, SamplingParams)> {
    let shared = prompt_tokens(7, 48);
    (0..24u64)
        .map(|i| {
            let own = prompt_tokens(100 + i, 5 + (i as usize * 11) % 60);
            let prompt = if i % 2 == 0 { [shared.clone(), own].concat() } else { own };
            (format!("r{i}"), prompt, forced(6 + (i as usize * 7) % 30))
        })
        .collect()
}

#[test]
fn a_late_subscriber_rebuilds_the_cache_through_evictions_preemption_and_replay() {
    let fx = Fixture::new();
    for mode in [PreemptionMode::Recompute, PreemptionMode::Swap] {
        let cfg =
            EngineConfig { preemption_mode: mode, kv_events: Some(events_config()), ..small_config(24) };
        let mut engine = fx.engine(cfg);
        let (endpoint, replay) = engine.kv_events_endpoints().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut sub = SubSocket::new();
        rt.block_on(async {
            sub.connect(&endpoint).await.unwrap();
            sub.subscribe("kv").await.unwrap();
        });
        for (id, prompt, params) in workload() {
            engine.add_request(id, prompt, params).unwrap();
        }
        let mut steps = 0;
        while engine.has_unfinished() {
            engine.step().unwrap();
            steps += 1;
        }
        assert!(engine.metrics().gauges.num_preemptions > 0, "{mode:?}: the tiny pool should preempt");
        // Live batches as received (the first ones may be lost before the subscription lands).
        let mut live: BTreeMap<u64, Bytes> = BTreeMap::new();
        rt.block_on(async {
            while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(300), sub.recv()).await {
                let frames = m.into_vec();
                assert_eq!(frames[0].as_ref(), b"kv");
                live.insert(u64::from_be_bytes(frames[1].as_ref().try_into().unwrap()), frames[2].clone());
            }
        });
        // The gap before the first live batch, from the replay socket.
        let first_live = live.keys().next().copied().unwrap_or(u64::MAX);
        let mut dealer = DealerSocket::new();
        rt.block_on(async {
            dealer.connect(replay.as_deref().unwrap()).await.unwrap();
            let request = vec![Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())];
            dealer.send(ZmqMessage::try_from(request).unwrap()).await.unwrap();
            loop {
                let m = tokio::time::timeout(Duration::from_secs(10), dealer.recv()).await.unwrap().unwrap();
                let frames = m.into_vec();
                if frames[1].as_ref() == END_SEQ {
                    break;
                }
                let seq = u64::from_be_bytes(frames[1].as_ref().try_into().unwrap());
                if seq < first_live {
                    live.insert(seq, frames[2].clone());
                }
            }
        });
        let seqs: Vec<u64> = live.keys().copied().collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "{mode:?}: contiguous from 0");
        assert!(seqs.len() <= steps, "at most one batch a step");
        let mut view = View::default();
        let mut events = 0;
        for payload in live.values() {
            events += apply(&mut view, payload, 16);
        }
        let want: HashSet<u64> = engine.cached_block_hashes().into_iter().collect();
        assert!(!want.is_empty());
        assert_eq!(view.gpu, want, "{mode:?}: the subscriber's GPU set is the engine's prefix cache");
        let host: HashSet<u64> = engine.host_block_hashes().into_iter().collect();
        assert_eq!(view.cpu, host, "{mode:?}: the subscriber's CPU set is what the swap space holds");
        assert_eq!(view.cpu_events > 0, mode == PreemptionMode::Swap, "{mode:?}: CPU events only from swaps");
        assert!(events > seqs.len(), "{mode:?}: stores and evictions both seen");
    }
}

#[test]
fn events_without_prefix_caching_or_on_a_taken_port_are_config_errors() {
    let fx = Fixture::new();
    let cfg =
        EngineConfig { enable_prefix_caching: false, kv_events: Some(events_config()), ..small_config(24) };
    let err = engine::Engine::new(fx.dir.path(), cfg).unwrap_err().to_string();
    assert!(err.contains("prefix caching"), "{err}");
    let first = fx.engine(EngineConfig { kv_events: Some(events_config()), ..small_config(24) });
    let taken = first.kv_events_endpoints().unwrap().1.unwrap();
    let mut events = events_config();
    events.replay_endpoint = Some(taken.clone());
    let cfg = EngineConfig { kv_events: Some(events), ..small_config(24) };
    let err = engine::Engine::new(fx.dir.path(), cfg).unwrap_err().to_string();
    assert!(err.contains(&taken), "{err}");
    // Off: no publisher, no endpoints.
    let off = fx.engine(small_config(24));
    assert!(off.kv_events_endpoints().is_none());
}
