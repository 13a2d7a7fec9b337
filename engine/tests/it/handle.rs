//! `EngineHandle` under concurrent load: 8 client threads × 100 requests with random aborts
//! (explicit and by dropping the stream); every other request completes exactly once, its
//! streamed deltas concatenate to the final text, and no KV block leaks.

use std::sync::Arc;

use engine::{FinishReason, RequestError, SamplingParams, ShutdownMode, StreamError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::support::{Fixture, forced, prompt_tokens, small_config};

#[test]
fn concurrent_clients_with_random_aborts() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(128));
    let tokenizer = Arc::new(fx.engine(small_config(8)).tokenizer().clone());
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let handle = handle.clone();
            let tokenizer = tokenizer.clone();
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                let (mut completed, mut aborted) = (0, 0);
                for i in 0..100u64 {
                    let params = SamplingParams {
                        temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                        max_tokens: Some(rng.random_range(1..24)),
                        ignore_eos: rng.random_bool(0.5),
                        ..SamplingParams::default()
                    };
                    let prompt = prompt_tokens(t * 1000 + i, rng.random_range(2..60));
                    let mut stream = handle.add_request(prompt, params).unwrap_or_else(|e| panic!("{e}"));
                    let action = rng.random_range(0..10);
                    if action == 0 {
                        // Drop the stream right away: the request is aborted.
                        drop(stream);
                        aborted += 1;
                        continue;
                    }
                    let mut text = String::new();
                    let mut ids = Vec::new();
                    let mut finals = 0;
                    let mut reason = None;
                    let mut n_outputs = 0;
                    while let Some(item) = stream.recv() {
                        let out = item.unwrap_or_else(|e| panic!("{e}"));
                        n_outputs += 1;
                        for c in &out.outputs {
                            text.push_str(&c.text);
                            ids.extend_from_slice(&c.token_ids);
                            if c.finish_reason.is_some() {
                                reason.clone_from(&c.finish_reason);
                            }
                        }
                        if out.finished {
                            finals += 1;
                        }
                        if action == 1 && n_outputs == 1 && !out.finished {
                            // Abort mid-stream: the stream still ends with one final output.
                            let _ = handle.abort(stream.id());
                        }
                    }
                    assert_eq!(finals, 1, "exactly one final output");
                    assert!(stream.recv().is_none());
                    if reason == Some(FinishReason::Abort) {
                        aborted += 1;
                    } else {
                        completed += 1;
                        assert!(
                            matches!(reason, Some(FinishReason::Length | FinishReason::Eos(_))),
                            "{reason:?}"
                        );
                        assert_eq!(text, tokenizer.decode(&ids, true).unwrap_or_default());
                    }
                }
                (completed, aborted)
            })
        })
        .collect();
    let mut totals = (0, 0);
    for t in threads {
        let (c, a) = t.join().unwrap_or_else(|_| panic!("client thread panicked"));
        totals = (totals.0 + c, totals.1 + a);
    }
    assert_eq!(totals.0 + totals.1, 800);
    assert!(totals.0 > 600 && totals.1 > 50, "{totals:?}");
    // Dropped streams are aborted asynchronously; wait until the engine has seen them.
    let mut idle = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let m = handle.metrics().unwrap_or_else(|e| panic!("{e}"));
        if m.gauges.num_running + m.gauges.num_waiting + m.gauges.num_swapped == 0 {
            idle = handle.kv_is_idle().unwrap_or(false);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(idle, "KV blocks leaked");
    let m = handle.metrics().unwrap_or_else(|e| panic!("{e}"));
    // Each request ended exactly once in the engine's books. A stream dropped (or aborted)
    // just after its request finished counts as finished there and as aborted here.
    assert_eq!(m.requests_finished + m.requests_aborted, 800);
    assert!(m.requests_finished >= totals.0 as u64);
    handle.shutdown(ShutdownMode::Drain);
}

#[test]
fn shutdown_drain_finishes_and_abort_cancels() {
    let fx = Fixture::new();
    let params = forced(30);

    let handle = fx.spawn(small_config(64));
    let batch = (0..4).map(|i| (format!("d{i}"), prompt_tokens(i, 10).into(), params.clone())).collect();
    let streams: Vec<_> =
        handle.add_requests(batch).into_iter().map(|s| s.unwrap_or_else(|e| panic!("{e}"))).collect();
    assert_eq!(streams[3].id(), "d3");
    let h2 = handle.clone();
    let stopper = std::thread::spawn(move || h2.shutdown(ShutdownMode::Drain));
    for s in streams {
        let fin = s.collect_final().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fin.completions[0].token_ids.len(), 30);
        assert_eq!(fin.completions[0].finish_reason, Some(FinishReason::Length));
    }
    let _ = stopper.join();
    assert!(matches!(handle.add_request("late", params.clone()), Err(RequestError::EngineStopped)));

    let handle = fx.spawn(small_config(64));
    let long = SamplingParams { max_tokens: Some(400), ..params };
    let mut stream = handle.add_request(prompt_tokens(9, 10), long).unwrap_or_else(|e| panic!("{e}"));
    assert!(stream.recv().is_some_and(|o| o.is_ok()));
    handle.shutdown(ShutdownMode::Abort);
    let rest: Vec<_> = stream.by_ref().collect();
    let last = rest.last().cloned().unwrap_or(Err(StreamError::EngineStopped));
    let last = last.unwrap_or_else(|e| panic!("{e}"));
    assert!(last.finished);
    assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Abort));
    assert!(handle.metrics().is_err());
}

#[test]
fn handle_reports_admission_errors_and_unknown_aborts() {
    let fx = Fixture::new();
    let handle = fx.spawn(small_config(64));
    let bad = SamplingParams { top_p: 2.0, ..SamplingParams::default() };
    assert!(matches!(handle.add_request("x", bad), Err(RequestError::InvalidParams { .. })));
    assert!(matches!(handle.abort("ghost"), Err(RequestError::UnknownRequest(_))));
    // The first "same" must still be in flight when the second arrives (a finished id may be
    // reused, as in vLLM): 400 forced tokens are hundreds of engine steps, and it is aborted below.
    let long = forced(400);
    let s = handle.add_request_with_id("same", "hi", long).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        handle.add_request_with_id("same", "hi", SamplingParams::greedy(3)),
        Err(RequestError::DuplicateId(_))
    ));
    assert!(handle.abort("same").is_ok());
    let fin = s.collect_final().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fin.completions[0].finish_reason, Some(FinishReason::Abort));
    assert!(handle.kv_is_idle().unwrap_or(false));
}
