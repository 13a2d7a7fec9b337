//! The async half of `EngineHandle` on a single-threaded tokio runtime (so any blocking call
//! would stall the test): `submit` + `OutputStream` give what the in-process engine gives,
//! dropping a stream aborts its request and frees its blocks, so does its `AbortHandle` while
//! the stream is being awaited elsewhere, and a full waiting queue refuses
//! at once with `QueueFull` while the engine keeps serving (and `generate` waits for room).

use std::time::Duration;

use engine::{
    EngineConfig, EngineHandle, FinishReason, OutputStream, Prompt, RequestError, RequestOptions,
    SamplingParams,
};
use futures_util::StreamExt;

use crate::support::{Fixture, forced, prompt_tokens, runtime, small_config};

fn submit(handle: &EngineHandle, id: &str, prompt: Vec<u32>, params: SamplingParams) -> OutputStream {
    handle.submit(id, prompt, params, RequestOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// Polls (without blocking the runtime) until the engine holds no request and no block.
async fn wait_idle(handle: &EngineHandle) {
    // A deadline, not a count: CI runs many engines at once on two cores.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let m = handle.metrics_async().await.unwrap_or_else(|e| panic!("{e}"));
        if m.gauges.num_running + m.gauges.num_waiting + m.gauges.num_swapped == 0
            && m.gauges.kv_usage == 0.0
            && handle.num_waiting() == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the engine never became idle (leaked request or block)");
}

#[test]
fn async_streams_match_the_in_process_engine() {
    let fx = Fixture::new();
    let params = forced(12);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt_tokens(70 + i, 9 + i as usize)).collect();
    let want: Vec<Vec<u32>> = fx
        .engine(small_config(64))
        .generate(prompts.iter().cloned().map(Prompt::from).collect(), &params)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")).completions[0].token_ids.clone())
        .collect();

    let handle = fx.spawn(small_config(64));
    runtime().block_on(async {
        let streams: Vec<OutputStream> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| submit(&handle, &format!("a{i}"), p.clone(), params.clone()))
            .collect();
        for (stream, want) in streams.into_iter().zip(&want) {
            let id = stream.id().to_owned();
            let outputs: Vec<_> = stream.collect().await;
            let mut ids = Vec::new();
            for (k, out) in outputs.iter().enumerate() {
                let out = out.as_ref().unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(out.request_id, id);
                assert_eq!(out.finished, k + 1 == outputs.len(), "only the last output is final");
                ids.extend_from_slice(&out.outputs[0].token_ids);
            }
            assert_eq!(&ids, want, "{id}: async greedy tokens differ from Engine::generate");
        }
        wait_idle(&handle).await;
    });
}

#[test]
fn dropping_an_async_stream_aborts_and_frees_its_blocks() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    runtime().block_on(async {
        let long = forced(300);
        let mut stream = submit(&handle, "dropped", prompt_tokens(5, 40), long);
        let first = stream.next().await.unwrap_or_else(|| panic!("no output"));
        assert!(first.is_ok_and(|o| !o.finished));
        drop(stream);
        wait_idle(&handle).await;
        let m = handle.metrics_async().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.requests_aborted, 1);
        // The id is free again and the engine keeps serving.
        let mut again = submit(&handle, "dropped", prompt_tokens(6, 8), SamplingParams::greedy(3));
        let mut last = None;
        while let Some(item) = again.recv().await {
            last = Some(item.unwrap_or_else(|e| panic!("{e}")));
        }
        let last = last.unwrap_or_else(|| panic!("no output"));
        assert!(last.finished);
        assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Length));
    });
}

#[test]
fn an_abort_handle_ends_a_stream_being_awaited_and_spares_a_later_request() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    runtime().block_on(async {
        let mut stream = submit(&handle, "held", prompt_tokens(5, 40), forced(300));
        let aborter = stream.abort_handle();
        // The reader holds the stream throughout: the abort can only come from beside it.
        let reader = async move {
            let mut last = None;
            while let Some(item) = stream.recv().await {
                last = Some(item.unwrap_or_else(|e| panic!("{e}")));
            }
            last
        };
        let abort = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            aborter.abort();
        };
        let (last, ()) = tokio::join!(reader, abort);
        let last = last.unwrap_or_else(|| panic!("no output"));
        assert!(last.finished);
        assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Abort));
        wait_idle(&handle).await;
        // The id is reused at once; the old handle names the finished admission only.
        let mut again = submit(&handle, "held", prompt_tokens(6, 8), SamplingParams::greedy(3));
        aborter.abort();
        let mut reason = None;
        while let Some(item) = again.recv().await {
            let out = item.unwrap_or_else(|e| panic!("{e}"));
            reason = out.outputs.first().and_then(|c| c.finish_reason.clone()).or(reason);
        }
        assert_eq!(reason, Some(FinishReason::Length));
    });
}

#[test]
fn a_full_waiting_queue_refuses_at_once_and_recovers() {
    let fx = Fixture::new();
    // One sequence at a time, so later requests stay waiting while the first one runs.
    let config = EngineConfig { max_num_seqs: 1, max_waiting: 2, ..small_config(64) };
    let handle = fx.spawn(config);
    runtime().block_on(async {
        let long = forced(400);
        let mut running = submit(&handle, "running", prompt_tokens(1, 10), long.clone());
        assert!(running.recv().await.is_some_and(|o| o.is_ok()), "the first request runs");
        let queued: Vec<OutputStream> = (0..2)
            .map(|i| submit(&handle, &format!("w{i}"), prompt_tokens(2 + i, 10), long.clone()))
            .collect();
        assert_eq!(handle.num_waiting(), 2);
        let refused = handle.submit("w2", prompt_tokens(9, 10), long.clone(), RequestOptions::default());
        assert!(matches!(refused, Err(RequestError::QueueFull { waiting: 2, .. })), "{refused:?}");
        // The refusal reserved nothing: the same id is free once there is room.
        drop(queued);
        drop(running);
        wait_idle(&handle).await;
        let mut late = submit(&handle, "w2", prompt_tokens(9, 10), SamplingParams::greedy(2));
        while let Some(item) = late.recv().await {
            assert!(item.is_ok());
        }
        let m = handle.metrics_async().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.requests_rejected, 1);
    });
}

#[test]
fn generate_waits_for_room_in_a_bounded_queue() {
    let (_fx, mut engine) =
        Fixture::with_engine(EngineConfig { max_num_seqs: 1, max_waiting: 2, ..small_config(64) });
    let params = forced(3);
    let prompts: Vec<Prompt> = (0..5).map(|i| Prompt::from(prompt_tokens(20 + i, 6))).collect();
    let results = engine.generate(prompts, &params).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(results.len(), 5);
    for r in results {
        let fin = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fin.completions[0].token_ids.len(), 3);
    }
    assert!(engine.kv_is_idle());
}
