//! Whole-page steps: every control has an accessible label and nothing has a positive
//! tabindex; at a phone's 390 px nothing overflows horizontally.

use serde_json::json;

use crate::driver::{Cdp, Ctx, v_arr};

pub(crate) async fn every_control_has_an_accessible_label(c: &Ctx) {
    c.fresh_page().await;
    let unlabeled = c
        .js(r#"
        const bad = [];
        for (const e of document.querySelectorAll('input, select, textarea, button')) {
          const byLabel = Array.from(e.labels || []).some((l) => l.textContent.trim().length > 0);
          const byAria = (e.getAttribute('aria-label') || '').trim().length > 0 ||
            (e.getAttribute('aria-labelledby') || '').split(' ').some((id) => id && document.getElementById(id));
          const byText = e.tagName === 'BUTTON' && e.textContent.trim().length > 0;
          if (!byLabel && !byAria && !byText) bad.push(e.outerHTML.slice(0, 120));
        }
        const focusable = document.querySelectorAll('#tables li[tabindex="0"]').length;
        return {bad, count: document.querySelectorAll('input, select, textarea, button').length, focusable};
        "#)
        .await;
    assert_eq!(v_arr(&unlabeled["bad"]).len(), 0, "controls without an accessible label: {unlabeled:#}");
    assert!(unlabeled["count"].as_u64().unwrap_or(0) >= 20, "{unlabeled}");
    // Keyboard: the prompt takes focus with Tab order intact (nothing has a positive tabindex).
    let positive = c
        .js("return Array.from(document.querySelectorAll('[tabindex]')).filter((e) => e.tabIndex > 0).length")
        .await;
    assert_eq!(positive, 0);
    c.assert_no_console_errors().await;
}

pub(crate) async fn phone_width(c: &Ctx) {
    c.client
        .issue_cmd(Cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
        ))
        .await
        .unwrap_or_else(|e| panic!("emulating a phone: {e}"));
    c.fresh_page().await;
    // Some content in every panel: a message, the calculator's chart.
    c.set_value("max-tokens", "12").await;
    c.type_into("prompt", "Hi!\u{E007}").await;
    c.until_reply("the reply", 60, "state === 'done'").await;
    c.until("the calculator's chart", 30, "return document.querySelectorAll('#calc-chart svg rect').length")
        .await;
    let v = c.js("return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, body: document.body.scrollWidth};").await;
    assert_eq!(v["inner"], 390, "{v}");
    assert!(
        v["scroll"].as_u64() <= v["inner"].as_u64() && v["body"].as_u64() <= v["inner"].as_u64(),
        "horizontal overflow at 390 px: {v}"
    );
    // Which element sticks out, if any (a clearer failure than the widths alone).
    let wide = c.js("return Array.from(document.querySelectorAll('body *')).filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5 && e.offsetParent !== null).map((e) => e.tagName + '#' + e.id + '.' + e.className).slice(0, 10)").await;
    assert_eq!(v_arr(&wide).len(), 0, "elements past the right edge: {wide}");
    c.shot("09-phone").await;
    c.js("document.getElementById('calc-results').scrollIntoView()").await;
    c.shot("10-phone-calculator").await;
    c.assert_no_console_errors().await;
    c.client
        .issue_cmd(Cdp("Emulation.clearDeviceMetricsOverride", json!({})))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
