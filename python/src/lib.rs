//! `paged_llm._core`: the engine as a CPython extension module (PyO3, stable ABI 3.9+), the
//! Rust half of the `paged_llm` package; `paged_llm/` beside this crate is the Python half
//! (`LLM`, `AsyncLLM`, `SamplingParams`, the output dataclasses).
//!
//! - `core.rs` — `Engine`: a loaded model on its engine thread; the offline batch, asyncio
//!   submission, abort, metrics, tokenization.
//! - `stream.rs` — `AsyncStream`: one request's outputs as awaitables, and its abort.
//! - `http.rs` — `HttpApp`: the `server` crate's OpenAI-compatible router in process (what a
//!   Ray Serve replica answers with), its response bodies as awaitable chunks.
//! - `tokens.rs` — `PromptTokenizer`: a request's prompt token ids without the weights (the
//!   KV-events router's).
//! - `args.rs` — engine arguments, sampling parameters and prompts, as JSON from Python.
//! - `outputs.rs` — outputs as JSON shaped like vLLM's `RequestOutput`.
//! - `errors.rs` — the exceptions and the engine errors they stand for.
//! - `cli_main` — the `paged-llm` program (crate `paged-llm`), the wheel's console script.
//!
//! Invariants: nothing here waits on the engine while holding the GIL; a request whose
//! Python side goes away (an exception in a batch, a dropped or aborted stream) is aborted.

mod args;
mod core;
mod errors;
mod http;
mod outputs;
mod stream;
mod tokens;

use pyo3::prelude::*;

/// The Rust half of `paged_llm`; import `paged_llm`, not this.
#[pymodule(name = "_core")]
fn paged_llm_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // One worker runs every awaited read and metrics call (they only wait on channels) and the
    // in-process HTTP router's handlers; its timers pace SSE keep-alives.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(1).thread_name("paged-llm-asyncio").enable_all();
    pyo3_async_runtimes::tokio::init(runtime);
    errors::register(m)?;
    m.add_class::<core::PyEngine>()?;
    m.add_class::<stream::AsyncStream>()?;
    m.add_class::<http::HttpApp>()?;
    m.add_class::<http::HttpBody>()?;
    m.add_class::<tokens::PyPromptTokenizer>()?;
    m.add_function(wrap_pyfunction!(check_sampling_params, m)?)?;
    m.add_function(wrap_pyfunction!(sampling_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}

/// Runs the `paged-llm` program on `argv` (its name first), the GIL released; its exit code.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| paged_llm_cli::run_with(argv.into_iter().map(Into::into)))
}

/// Raises what submitting `fields` (a JSON object of sampling parameters over vLLM's
/// defaults) would: `InvalidRequestError` for a value out of range, `TypeError` for a wrong type.
#[pyfunction]
fn check_sampling_params(fields: &str) -> PyResult<()> {
    args::sampling_params(Some(fields), &engine::SamplingParams::default()).map(drop)
}

/// vLLM's `SamplingParams` defaults as the engine has them (JSON): every field's name and value.
#[pyfunction]
fn sampling_defaults() -> String {
    // A struct of numbers, strings and maps: serializing it cannot fail.
    serde_json::to_string(&engine::SamplingParams::default()).unwrap_or_default()
}
