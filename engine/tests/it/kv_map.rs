//! The live KV map: an `EngineHandle` asked for a snapshot while requests run shows their
//! blocks owned (and a long prompt shared by two requests as shared blocks), each table under
//! its request's id, and after they finish shows no held block and no table; an engine nobody
//! asks publishes nothing.

use std::time::Duration;

use engine::{BlockState, EngineHandle, KvSnapshot, OutputStream, RequestOptions};

use crate::support::{Fixture, forced, prompt_tokens, runtime, small_config};

fn count(snapshot: &KvSnapshot, state: BlockState) -> usize {
    snapshot.map.count_device(state)
}

fn held(snapshot: &KvSnapshot) -> usize {
    count(snapshot, BlockState::Owned) + count(snapshot, BlockState::Shared)
}

async fn kv_map(handle: &EngineHandle) -> std::sync::Arc<KvSnapshot> {
    tokio::time::timeout(Duration::from_secs(10), handle.kv_map())
        .await
        .unwrap_or_else(|_| panic!("no snapshot within 10 s"))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_snapshot_shows_running_requests_blocks_and_none_after_they_finish() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    assert!(handle.latest_kv_map().is_none(), "nothing is taken before someone asks");
    runtime().block_on(async {
        let idle = kv_map(&handle).await;
        assert_eq!(idle.map.device.len(), 64);
        assert_eq!((held(&idle), idle.map.tables.len()), (0, 0), "an idle engine answers too");

        // Two requests with the same 40-token prompt (two full 16-token blocks to share).
        let long = forced(200);
        let prompt = prompt_tokens(11, 40);
        let mut a: OutputStream = handle
            .submit("kv-a", prompt.clone(), long.clone(), RequestOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(a.recv().await.is_some_and(|o| o.is_ok_and(|o| !o.finished)));
        let mut b =
            handle.submit("kv-b", prompt, long, RequestOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.recv().await.is_some_and(|o| o.is_ok_and(|o| !o.finished)));

        let running = kv_map(&handle).await;
        assert!(running.generation > idle.generation);
        let map = &running.map;
        assert_eq!(map.counters.num_running, 2);
        assert_eq!(running.request_ids.len(), map.tables.len());
        let mut ids = running.request_ids.clone();
        ids.sort();
        assert_eq!(ids, ["kv-a", "kv-b"]);
        let tables: Vec<&[u32]> = map.tables.iter().map(|t| map.table_blocks(t)).collect();
        assert_eq!(tables[0][..2], tables[1][..2], "the prompt's full blocks are a prefix hit");
        for &blk in &tables[0][..2] {
            assert_eq!(map.device[blk as usize], BlockState::Shared.code());
        }
        for t in &tables {
            for &blk in &t[2..] {
                assert_eq!(map.device[blk as usize], BlockState::Owned.code());
            }
        }
        let distinct: std::collections::HashSet<u32> =
            tables.iter().flat_map(|t| t.iter().copied()).collect();
        assert_eq!(held(&running), distinct.len(), "every held block is in a listed table");
        assert_eq!(map.counters.device_blocks_used, distinct.len());
        assert!(map.counters.prefix_hit_rate > 0.0);

        drop((a, b)); // aborts both
        let mut after = kv_map(&handle).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if after.map.tables.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            after = kv_map(&handle).await;
        }
        assert!(after.map.tables.is_empty() && after.request_ids.is_empty());
        assert_eq!(held(&after), 0);
        assert_eq!(after.map.counters.kv_usage, 0.0);
        assert!(count(&after, BlockState::Cached) >= 2, "the shared prompt blocks stay cached");
    });
    handle.shutdown(engine::ShutdownMode::Abort);
    assert!(runtime().block_on(handle.kv_map()).is_err(), "a stopped engine answers no request");
}

#[test]
fn an_engine_snapshot_between_steps_lists_the_request() {
    let (_fx, mut engine) = Fixture::with_engine(small_config(64));
    engine.add_request("direct", prompt_tokens(3, 20), forced(4)).unwrap_or_else(|e| panic!("{e}"));
    engine.step().unwrap_or_else(|e| panic!("{e}"));
    let snap = engine.kv_snapshot();
    assert_eq!(snap.request_ids, ["direct"]);
    assert_eq!(snap.map.tables[0].num_tokens, 20);
    assert_eq!(held(&snap), 2);
    while engine.has_unfinished() {
        engine.step().unwrap_or_else(|e| panic!("{e}"));
    }
    let mut reused = snap;
    engine.kv_snapshot_into(&mut reused);
    assert_eq!((held(&reused), reused.map.tables.len(), reused.request_ids.len()), (0, 0, 0));
}
