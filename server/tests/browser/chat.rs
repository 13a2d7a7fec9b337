//! The chat's steps: Enter sends and Shift+Enter is a new line, the reply streams token by
//! token while the map shows owned blocks; Stop and Escape abort a long generation and free its
//! blocks; a 400 and an SSE error event inside a 200 stream show as errors; a reasoning model's
//! `reasoning_content` shows collapsed above its answer and stays out of the conversation sent
//! back.

use std::time::Duration;

use serde_json::{Value, json};

use crate::driver::{Ctx, v_arr};

/// Records every length the newest assistant message's text takes (a MutationObserver).
const WATCH_LENGTHS: &str = r#"
  window.__lengths = [];
  window.__owned = 0;
  new MutationObserver(() => {
    const m = document.querySelectorAll('.msg.assistant .body');
    const last = m[m.length - 1];
    if (!last) return;
    const n = last.textContent.length;
    if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
  }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
  new MutationObserver(() => {
    window.__owned = Math.max(window.__owned, +document.getElementById('kv-canvas').dataset.owned || 0);
  }).observe(document.getElementById('kv-canvas'), {attributes: true});
"#;

pub(crate) async fn enter_sends_and_the_reply_streams(c: &Ctx) {
    c.fresh_page().await;
    c.js(WATCH_LENGTHS).await;
    c.set_value("max-tokens", "48").await;
    c.set_value("temperature", "0").await;
    // Shift+Enter is a new line, not a send.
    c.type_into("prompt", "first line\u{E008}\u{E007}\u{E000}second line").await;
    let v = c.js("return {value: document.getElementById('prompt').value, sent: document.querySelectorAll('.msg').length}").await;
    assert_eq!(v, json!({"value": "first line\nsecond line", "sent": 0}));
    c.set_value("prompt", "").await;
    c.type_into("prompt", "Write three sentences about the ocean.").await;
    c.type_into("prompt", "\u{E007}").await; // Enter
    c.until_reply("streaming to start", 30, "+m.dataset.deltas >= 4 && state === 'streaming'").await;
    assert_eq!(c.js("return document.getElementById('prompt').value").await, "", "Enter sent the message");
    assert_eq!(c.js("return document.querySelectorAll('.msg.user').length").await, 1);
    c.until(
        "owned blocks in the page's map",
        20,
        "return window.__owned > 0 || +document.getElementById('kv-canvas').dataset.owned > 0",
    )
    .await;
    c.shot("02-streaming").await;
    c.until_reply("the reply to finish", 60, "state !== 'streaming'").await;
    let v = c.js("const m = document.querySelector('.msg.assistant'); return {state: m.dataset.state, deltas: +m.dataset.deltas, updates: +m.dataset.updates, text: m.querySelector('.body').textContent, meta: m.querySelector('.meta').textContent, lengths: window.__lengths};").await;
    assert_eq!(v["state"], "done", "{v:#}");
    let deltas = v["deltas"].as_u64().unwrap_or(0);
    let tokens: u64 =
        v["meta"].as_str().and_then(|m| m.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    // One content chunk per generated token (the last may be the end-of-sequence token, sent as
    // an empty delta with the finish reason), each applied as it came.
    assert!(deltas >= 2 && tokens >= 2, "{v:#}");
    assert!(deltas + 1 >= tokens && deltas <= tokens, "one delta per token: {v:#}");
    let lengths: Vec<u64> = v_arr(&v["lengths"]).iter().filter_map(Value::as_u64).collect();
    assert!(lengths.len() as u64 >= tokens / 2, "the text grew in many steps, not at once: {v:#}");
    assert!(lengths.windows(2).all(|w| w[0] < w[1]), "the text only grew: {v:#}");
    assert!(v["text"].as_str().is_some_and(|t| t.len() > 10), "{v:#}");
    c.wait_server_idle(10).await;
    c.until("the page's map to show no owned blocks", 10, "return +document.getElementById('kv-canvas').dataset.owned === 0 && +document.getElementById('kv-canvas').dataset.shared === 0").await;
    c.assert_no_console_errors().await;
}

/// Starts a long generation from the page and waits until it streams with blocks held.
async fn start_long_generation(c: &Ctx) {
    c.fresh_page().await;
    c.set_value("max-tokens", "1500").await;
    c.client
        .execute("document.getElementById('ignore-eos').checked = true", vec![])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    c.type_into("prompt", "Tell me a very long story about a lighthouse keeper.").await;
    c.click("send").await;
    c.until_reply(
        "streaming with blocks held",
        30,
        "+m.dataset.deltas >= 3 && +document.getElementById('kv-canvas').dataset.owned > 0",
    )
    .await;
    let server = c.server_json("/v1/kv_map").await;
    assert_eq!(server["tables"].as_array().map(Vec::len), Some(1), "{server}");
}

/// After a stop: the page says so, the server aborted the request (it never finished, no token
/// is generated any more) and holds no block, and the page's map agrees.
async fn assert_stopped_and_freed(c: &Ctx, finished_before: f64, name: &str) {
    c.until_reply("the message to show it stopped", 10, "state === 'stopped'").await;
    let v = c.js("const m = document.querySelector('.msg.assistant'); return {deltas: +m.dataset.deltas, meta: m.querySelector('.meta').textContent, send: document.getElementById('send').disabled, stop: document.getElementById('stop').disabled};").await;
    assert!(v["deltas"].as_u64().unwrap_or(0) < 1500, "{v}");
    assert!(v["meta"].as_str().is_some_and(|m| m.contains("stopped")), "{v}");
    assert_eq!((v["send"].clone(), v["stop"].clone()), (json!(false), json!(true)), "{v}");
    let map = c.wait_server_idle(5).await;
    assert_eq!(map["counters"]["num_running"], 0, "{map}");
    let tokens = c.metric("vllm:generation_tokens_total").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.metric("vllm:generation_tokens_total").await, tokens, "the engine stopped generating");
    assert_eq!(
        c.metric("vllm:request_success_total").await,
        finished_before,
        "the request was aborted, not finished"
    );
    c.until("the page's map to free the blocks", 5, "const d = document.getElementById('kv-canvas').dataset; return +d.owned === 0 && +d.shared === 0 && document.querySelectorAll('#tables li').length === 0").await;
    c.shot(name).await;
    c.assert_no_console_errors().await;
}

pub(crate) async fn stop_button_frees_blocks(c: &Ctx) {
    start_long_generation(c).await;
    let finished = c.metric("vllm:request_success_total").await;
    c.click("stop").await;
    assert_stopped_and_freed(c, finished, "05-after-stop").await;
}

pub(crate) async fn escape_frees_blocks(c: &Ctx) {
    start_long_generation(c).await;
    let finished = c.metric("vllm:request_success_total").await;
    c.type_into("prompt", "\u{E00C}").await; // Escape
    assert_stopped_and_freed(c, finished, "06-after-escape").await;
}

pub(crate) async fn server_errors_show_as_errors(c: &Ctx) {
    c.fresh_page().await;
    // More tokens than the model's length: the server answers 400 with a message.
    c.set_value("max-tokens", "100000").await;
    c.type_into("prompt", "hello\u{E007}").await;
    let err = c
        .until(
            "an error message",
            20,
            "const e = document.querySelector('.msg.error'); return e && e.textContent",
        )
        .await;
    let text = err.as_str().unwrap_or_default();
    assert!(text.contains("HTTP 400") && text.contains("maximum context length is 2048 tokens"), "{text}");
    assert_eq!(c.js("return document.getElementById('send').disabled").await, false);
    // The one console entry is the browser's own report of the 400.
    let severe: Vec<Value> = c.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(severe.iter().all(|e| e["message"].as_str().is_some_and(|m| m.contains("400"))), "{severe:#?}");
    c.shot("07-server-error").await;
}

/// An error event inside a 200 stream (what the server sends when a request fails after its
/// first chunk) shows as an error, after the text that came before it. The page's `fetch` of
/// the chat endpoint is replaced by such a stream: the engine has no way to fail on demand.
pub(crate) async fn sse_error_event_shows_as_error(c: &Ctx) {
    c.fresh_page().await;
    c.js(r#"
      const real = window.fetch;
      window.fetch = (url, opts) => {
        if (url !== '/v1/chat/completions') return real(url, opts);
        const events = [
          {choices: [{index: 0, delta: {role: 'assistant', content: ''}}]},
          {choices: [{index: 0, delta: {content: 'Partial'}}]},
          {choices: [{index: 0, delta: {content: ' answer'}}]},
          {error: {message: 'the engine failed: boom', type: 'server_error', code: 500}},
        ].map((e) => 'data: ' + JSON.stringify(e) + '\n\n').join('') + 'data: [DONE]\n\n';
        return Promise.resolve(new Response(events, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
      };
    "#)
    .await;
    c.type_into("prompt", "hello\u{E007}").await;
    let v = c.until("the error", 10, "const e = document.querySelector('.msg.error'); const m = document.querySelector('.msg.assistant'); return e && m && {error: e.textContent, text: m.querySelector('.body').textContent, state: m.dataset.state}").await;
    assert_eq!(v["text"], "Partial answer", "{v}");
    assert_eq!(v["state"], "error", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("the engine failed: boom")), "{v}");
    c.assert_no_console_errors().await;
}

/// A reasoning model's thinking (`reasoning_content` deltas, as `--reasoning-parser` streams
/// them) shows in a collapsed `details` above the answer; the next request's history holds the
/// answer only. The page's `fetch` of the chat endpoint is a scripted stream (SmolLM2 does not
/// think), then records the next request's body.
pub(crate) async fn reasoning_shows_collapsed_above_the_answer(c: &Ctx) {
    c.fresh_page().await;
    c.js(r#"
      const real = window.fetch;
      window.__bodies = [];
      window.fetch = (url, opts) => {
        if (url !== '/v1/chat/completions') return real(url, opts);
        window.__bodies.push(JSON.parse(opts.body));
        const events = [
          {choices: [{index: 0, delta: {role: 'assistant', content: ''}}]},
          {choices: [{index: 0, delta: {reasoning_content: 'Paris is the '}}]},
          {choices: [{index: 0, delta: {reasoning_content: 'capital.'}}]},
          {choices: [{index: 0, delta: {content: 'In France.'}}]},
          {choices: [{index: 0, delta: {}, finish_reason: 'stop'}]},
        ].map((e) => 'data: ' + JSON.stringify(e) + '\n\n').join('') + 'data: [DONE]\n\n';
        return Promise.resolve(new Response(events, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
      };
    "#)
    .await;
    c.type_into("prompt", "Where is Paris?\u{E007}").await;
    let v = c.until("the answer", 10, "const m = document.querySelector('.msg.assistant'); const r = m && m.querySelector('details.reasoning'); return m && m.dataset.state === 'done' && r && {open: r.open, reasoning: r.lastElementChild.textContent, summary: r.querySelector('summary').textContent, text: m.querySelector('.body').textContent, before: r.nextElementSibling === m.querySelector('.body')}").await;
    assert_eq!(
        v,
        serde_json::json!({"open": false, "reasoning": "Paris is the capital.", "summary": "Reasoning", "text": "In France.", "before": true})
    );
    c.type_into("prompt", "And Lyon?\u{E007}").await;
    let history = c
        .until("the second request", 10, "return window.__bodies.length === 2 && window.__bodies[1].messages")
        .await;
    assert_eq!(history[1], serde_json::json!({"role": "assistant", "content": "In France."}), "{history}");
    c.shot("08-reasoning").await;
    c.assert_no_console_errors().await;
}
