//! The KV map's steps: the live map on load (a 100 000-block pool aggregated into cells, a
//! swapped sequence drawn in the host pool), and two requests sharing a long prompt shown as
//! shared blocks with each sequence's block table, none held after they finish.

use fantoccini::Locator;
use fantoccini::actions::{InputSource, MouseActions, PointerAction};
use serde_json::json;

use crate::driver::{BLOCKS, Ctx};

pub(crate) async fn page_loads_without_console_errors(c: &Ctx) {
    c.fresh_page().await;
    let v = c.js("return {name: document.getElementById('model-name').textContent, len: document.getElementById('model-len').textContent, title: document.title};").await;
    assert_eq!(v["name"], "SmolLM2-135M-Instruct", "{v}");
    assert!(v["len"].as_str().is_some_and(|s| s.contains("2,048")), "max length shown: {v}");
    let blocks = c.page_blocks().await;
    assert_eq!(
        blocks["free"].as_u64().unwrap_or(0) + blocks["cached"].as_u64().unwrap_or(0),
        BLOCKS as u64,
        "{blocks}"
    );
    assert_eq!(c.js("return document.getElementById('kv-status').textContent").await, "live");
    // The calculator runs once on load.
    c.until("the calculator's first result", 30, "return !document.getElementById('calc-results').hidden")
        .await;
    // A large pool aggregates blocks per cell (at most 4096 cells), and drawing it stays cheap.
    // The KV map is an ES module: its functions are reached through the page's own instance of
    // it (a dynamic import of the same URL), whose promise WebDriver awaits.
    let big = c.js("return import('/kv_map.js').then(({gridLayout, drawPool}) => { const L = gridLayout(100000, 600); const cv = document.createElement('canvas'); const wrap = document.createElement('div'); wrap.style.width = '600px'; wrap.appendChild(cv); document.body.appendChild(wrap); const states = '.cos'.repeat(25000); const t = performance.now(); drawPool(cv, states, false, new Set([5, 99999])); const ms = performance.now() - t; wrap.remove(); return {per: L.per, cells: L.cells, ms}; });").await;
    assert_eq!((big["per"].clone(), big["cells"].clone()), (json!(25), json!(4000)), "{big}");
    assert!(big["ms"].as_f64().is_some_and(|ms| ms < 100.0), "drawing 100 000 blocks: {big}");
    c.shot("01-loaded").await;
    // The host swap pool (the test engine has none): a snapshot with a swapped sequence draws
    // the host grid in the swapped colour and lists the sequence as swapped, its table in the
    // host pool. The next live snapshot replaces it.
    let swapped = c.js(r#"
      return import('/kv_map.js').then(({kv, applySnapshot, render}) => {
        const fake = {generation: 1, block_size: 16, device: 'c...', host: 'o.o.',
          tables: [{id: 'req-swapped', key: 9, seq: 0, swapped: true, tokens: 20, blocks: [0, 2]}],
          counters: {kv_usage: 0, prefix_hit_rate: 0, prefix_queried_tokens: 0, num_running: 0,
                     num_waiting: 0, num_swapped: 1, num_preemptions: 1}};
        applySnapshot(fake);
        kv.selected = '9:0';
        render();
        const px = Array.from(document.getElementById('host-canvas').getContext('2d').getImageData(3, 3, 1, 1).data);
        const out = {shown: !document.getElementById('host-wrap').hidden, px,
          item: document.querySelector('#tables li').textContent,
          table: document.getElementById('block-table').textContent,
          swappedCount: document.getElementById('c-swapped').textContent};
        kv.selected = null;
        return out;
      });
    "#).await;
    assert_eq!(swapped["shown"], true, "{swapped}");
    assert_eq!(swapped["px"], json!([139, 92, 246, 255]), "the swapped colour: {swapped}");
    assert!(
        swapped["item"].as_str().is_some_and(|t| t.contains("req-swapped") && t.contains("swapped")),
        "{swapped}"
    );
    assert!(
        swapped["table"].as_str().is_some_and(|t| t.contains("host pool") && t.contains("1 → 2")),
        "{swapped}"
    );
    assert_eq!(swapped["swappedCount"], "1");
    c.until("the live map back", 10, "return document.getElementById('host-wrap').hidden && document.querySelectorAll('#tables li').length === 0").await;
    c.assert_no_console_errors().await;
}

/// A prompt of several blocks (the test engine's blocks hold 16 tokens).
fn long_prompt() -> String {
    let mut s = String::from("You are reading a long shared system prompt about paged attention. ");
    for i in 0..6 {
        s.push_str(&format!("Paragraph {i}: the key-value cache is split into fixed-size blocks, and a block table maps each sequence's logical blocks onto physical ones. "));
    }
    s
}

pub(crate) async fn shared_prompt_blocks(c: &Ctx) {
    c.fresh_page().await;
    let prompt = long_prompt();
    let body =
        json!({"prompt": prompt, "max_tokens": 24, "ignore_eos": true, "temperature": 0, "stream": true});
    let url = format!("{}/v1/completions", c.base);
    // The first request; the second starts once the first is decoding (its prompt blocks are
    // in the prefix cache by then), so its full prompt blocks are prefix hits: shared.
    let first = c.http.post(&url).json(&body).send().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(first.status().is_success());
    let mut first_body = first.bytes_stream();
    let _ = futures_util::StreamExt::next(&mut first_body).await;
    let second = c.http.post(&url).json(&body).send().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(second.status().is_success());
    let seen = c.until("shared blocks in the page's map", 20, "const d = document.getElementById('kv-canvas').dataset; return +d.shared > 0 && document.querySelectorAll('#tables li').length >= 2 ? {shared: +d.shared, owned: +d.owned} : null").await;
    assert!(
        seen["shared"].as_u64().unwrap_or(0) >= 4,
        "a prompt of {} chars spans several shared blocks: {seen}",
        prompt.len()
    );
    // Hover the first sequence: its block table appears and its blocks are outlined.
    let li = c.client.find(Locator::Css("#tables li")).await.unwrap_or_else(|e| panic!("{e}"));
    let hover = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: li,
        duration: None,
        x: 0.0,
        y: 0.0,
    });
    c.client.perform_actions(hover).await.unwrap_or_else(|e| panic!("hovering the sequence: {e}"));
    let table = c
        .until("the block table", 5, "return document.querySelectorAll('#block-table .bt-cell').length")
        .await;
    let shared_cells = c.js("return document.querySelectorAll('#block-table .bt-cell.shared').length").await;
    assert!(
        table.as_u64().unwrap_or(0) >= 5 && shared_cells.as_u64().unwrap_or(0) >= 4,
        "{table} cells, {shared_cells} shared"
    );
    c.client.execute("window.scrollTo(0, 0)", vec![]).await.unwrap_or_else(|e| panic!("{e}"));
    c.shot("03-shared-blocks").await;
    // The keyboard reaches the same view: the second sequence, focused, shows its own table.
    let v = c.js("const li = document.querySelectorAll('#tables li')[1]; li.focus(); return {focused: document.activeElement === li, selected: li.classList.contains('selected'), title: document.querySelector('#block-table .bt-title').textContent, id: li.querySelector('.rid').textContent};").await;
    assert_eq!((v["focused"].clone(), v["selected"].clone()), (json!(true), json!(true)), "{v}");
    assert!(v["title"].as_str().zip(v["id"].as_str()).is_some_and(|(t, id)| t.contains(id)), "{v}");
    // Let both finish.
    while futures_util::StreamExt::next(&mut first_body).await.is_some() {}
    let _ = second.bytes().await;
    c.wait_server_idle(10).await;
    let after = c.until("no held blocks in the page's map", 10, "const d = document.getElementById('kv-canvas').dataset; return +d.owned === 0 && +d.shared === 0 && document.querySelectorAll('#tables li').length === 0 ? {cached: +d.cached} : null").await;
    assert!(after["cached"].as_u64().unwrap_or(0) > 0, "finished prompts stay cached (evictable): {after}");
    c.shot("04-after-finish").await;
    c.assert_no_console_errors().await;
}
