//! The calculator's step: it draws its chart with the endpoint's numbers, and a custom shape
//! past the bounds shows the server's 400 as an error.

use fantoccini::Locator;
use serde_json::{Value, json};

use crate::driver::Ctx;

pub(crate) async fn calculator(c: &Ctx) {
    c.fresh_page().await;
    c.until("the calculator's presets", 30, "return document.getElementById('calc-model').options.length >= 4 && !document.getElementById('calc-run').disabled").await;
    c.set_value("calc-model", "smollm2-135m").await;
    c.set_value("calc-hw", "a100-40gb").await;
    c.set_value("calc-requests", "300").await;
    c.click("calc-run").await;
    c.until("the result", 30, "return !document.getElementById('calc-run').disabled && document.getElementById('calc-status').textContent.includes('300 requests')").await;
    let v = c.js("return {figures: document.getElementById('calc-figures').textContent, bars: document.querySelectorAll('#calc-chart svg rect').length, error: !document.getElementById('calc-error').hidden};").await;
    // SmolLM2-135M: 2 × 30 layers × 3 KV heads × 64 × 2 bytes = 23 040 B = 22.5 KiB per token.
    assert!(v["figures"].as_str().is_some_and(|f| f.contains("22.5 KiB")), "{v:#}");
    assert_eq!(v["bars"], 6, "four simulated systems and two static fits: {v:#}");
    assert_eq!(v["error"], false);
    // The same numbers as the endpoint gives (the page shows the server's simulation).
    let memory: f64 = c
        .js("return document.getElementById('calc-mem').value")
        .await
        .as_str()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0.0);
    let direct = c
        .http
        .post(format!("{}/v1/plan", c.base))
        .json(&json!({"model": "smollm2-135m", "hardware": "a100-40gb", "gpu_memory_gib": memory, "num_requests": 300, "max_model_len": 2048, "max_num_seqs": 256, "block_size": 16, "gpu_memory_utilization": 0.9}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let direct: Value = direct.json().await.unwrap_or_else(|e| panic!("{e}"));
    let blocks = direct["num_blocks"].as_u64().unwrap_or(0);
    let shown = v["figures"].as_str().unwrap_or_default().replace(',', "");
    assert!(shown.contains(&format!("{blocks} × 16")), "{blocks} blocks: {shown}");
    // An int8 KV cache: bytes per token of 30 layers × 3 KV heads × (64 + 64 codes, 2 key
    // scales and a value scale of 2 bytes) = 12 060 B = 11.8 KiB.
    c.set_value("calc-kv-dtype", "int8").await;
    c.click("calc-run").await;
    c.until("the int8 result", 30, "return !document.getElementById('calc-run').disabled && document.getElementById('calc-figures').textContent.includes('11.8 KiB')").await;
    c.set_value("calc-kv-dtype", "").await;
    // The screenshot: Llama-2-7B on an A100-40GB, where memory is the limit.
    c.set_value("calc-model", "llama2-7b").await;
    c.set_value("calc-requests", "500").await;
    c.click("calc-run").await;
    c.until("the Llama-2 result", 30, "return !document.getElementById('calc-run').disabled && document.getElementById('calc-figures').textContent.includes('512 KiB')").await;
    let panel = c.client.find(Locator::Css(".calc-panel")).await.unwrap_or_else(|e| panic!("{e}"));
    c.client
        .execute("arguments[0].scrollIntoView()", vec![serde_json::to_value(&panel).unwrap_or_default()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let png = panel.screenshot().await.unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(c.shots.join("08-calculator.png"), png).unwrap_or_else(|e| panic!("{e}"));
    c.assert_no_console_errors().await;
    // A custom shape past the bounds (the form's own checks pass it): the 400's message is shown.
    c.set_value("calc-layers", "100000").await;
    assert_eq!(c.js("return document.getElementById('calc-model').value").await, "custom");
    c.click("calc-run").await;
    let err = c
        .until(
            "the calculator's error",
            20,
            "const e = document.getElementById('calc-error'); return !e.hidden && e.textContent",
        )
        .await;
    assert!(
        err.as_str()
            .is_some_and(|e| e.contains("layers must be between 1 and 4096") && e.contains("HTTP 400")),
        "{err}"
    );
    let severe: Vec<Value> = c.console().await.into_iter().filter(|e| e["level"] == "SEVERE").collect();
    assert!(severe.iter().all(|e| e["message"].as_str().is_some_and(|m| m.contains("400"))), "{severe:#?}");
}
