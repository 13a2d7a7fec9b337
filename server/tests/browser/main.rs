//! The web page in a real browser: headless Chromium (Debian's `chromium`) driven over
//! WebDriver (`fantoccini` → Debian's `chromium-driver`, started here on a free loopback port)
//! against the server on 127.0.0.1 over the real SmolLM2 model (whose tokens arrive slowly
//! enough on a CPU to watch them stream). One browser and one server serve every step, in
//! order; each step reloads the page and starts from an idle engine.
//!
//! Steps: the page loads without console errors (a 100 000-block pool aggregates into cells, a
//! swapped sequence draws in the host pool); every control has an accessible label; Shift+Enter
//! is a new line, and a chat message sent with Enter streams into the page token by token
//! while the KV map shows owned blocks; two requests sharing a long prompt show shared blocks
//! (and a hovered or focused sequence its block table), none held after they finish; Stop and
//! Escape abort a long generation and free its blocks (the page's map, `GET /v1/kv_map` and
//! `/metrics` agree); a 400 and an SSE error event show as errors; a reasoning model's thinking
//! shows collapsed above its answer; the calculator draws its
//! chart and shows a 400 as an error; at 390 px nothing overflows horizontally. Screenshots of
//! each state go to `target/web-screenshots/`.
//!
//! Its own harness (`harness = false`): the steps share one browser, run in order, and print
//! libtest's lines (`test … ok`, `test result: …`) so `cargo xtask test` counts them. Needs
//! `chromium` and `chromium-driver` (`cargo xtask test` installs them as root; otherwise
//! `apt-get install -y chromium chromium-driver`) and the model (`cargo xtask fetch-model`).
//! Never skips: a missing piece fails with what to install.
//!
//! The steps live with the app they drive (`chat.rs`, `kv_map.rs`, `calculator.rs`; `page.rs`
//! for the whole page), the browser, the server and the helpers every step uses in
//! `driver.rs`; this file is the harness.

mod calculator;
mod chat;
mod driver;
mod kv_map;
mod page;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Instant;

use futures_util::FutureExt;

use calculator::calculator;
use chat::{
    enter_sends_and_the_reply_streams, escape_frees_blocks, reasoning_shows_collapsed_above_the_answer,
    server_errors_show_as_errors, sse_error_event_shows_as_error, stop_button_frees_blocks,
};
use driver::Ctx;
use kv_map::{page_loads_without_console_errors, shared_prompt_blocks};
use page::{every_control_has_an_accessible_label, phone_width};

type StepFn = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

fn main() {
    // libtest's arguments: filters, and flags (some with a value) that this harness ignores.
    let (mut filter, mut args) = (Vec::new(), std::env::args().skip(1));
    while let Some(a) = args.next() {
        if ["--test-threads", "--skip", "--format", "--color", "--logfile", "-Z"].contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            filter.push(a);
        }
    }
    let steps: [(&str, StepFn); 11] = [
        ("page_loads_without_console_errors", |c| Box::pin(page_loads_without_console_errors(c))),
        ("every_control_has_an_accessible_label", |c| Box::pin(every_control_has_an_accessible_label(c))),
        ("enter_sends_and_the_reply_streams_token_by_token", |c| {
            Box::pin(enter_sends_and_the_reply_streams(c))
        }),
        ("shared_prompt_blocks_show_as_shared_and_none_after", |c| Box::pin(shared_prompt_blocks(c))),
        ("stop_button_aborts_and_frees_the_blocks", |c| Box::pin(stop_button_frees_blocks(c))),
        ("escape_aborts_and_frees_the_blocks", |c| Box::pin(escape_frees_blocks(c))),
        ("server_errors_show_as_errors", |c| Box::pin(server_errors_show_as_errors(c))),
        ("sse_error_events_show_as_errors", |c| Box::pin(sse_error_event_shows_as_error(c))),
        ("reasoning_shows_collapsed_above_the_answer", |c| {
            Box::pin(reasoning_shows_collapsed_above_the_answer(c))
        }),
        ("calculator_draws_its_chart_and_shows_bad_sizes", |c| Box::pin(calculator(c))),
        ("phone_width_has_no_horizontal_overflow", |c| Box::pin(phone_width(c))),
    ];
    let chosen: Vec<_> = steps
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if chosen.is_empty() {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {} filtered out\n",
            steps.len()
        );
        return;
    }
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ctx = runtime.block_on(Ctx::start());
    println!("\nrunning {} tests (one browser, in order)", chosen.len());
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, step) in &chosen {
        let t = Instant::now();
        let result = runtime.block_on(AssertUnwindSafe(step(&ctx)).catch_unwind());
        match result {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
            }
            Err(_) => {
                println!("test {name} ... FAILED ({:.1} s)", t.elapsed().as_secs_f64());
                failed.push(*name);
            }
        }
    }
    runtime.block_on(ctx.stop());
    drop(runtime);
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        steps.len() - chosen.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        eprintln!("failed: {}", failed.join(", "));
        std::process::exit(101);
    }
}
