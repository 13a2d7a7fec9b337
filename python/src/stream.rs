//! `_core.AsyncStream`: one request's outputs for asyncio. `next()` is an awaitable run on the
//! bridge's tokio runtime (`pyo3-async-runtimes`), so waiting holds neither the GIL nor a
//! thread; `abort()` ends the request from the Python side even while a `next()` is pending
//! (a cancelled task's read may not have been dropped yet when its `finally` runs).

use std::sync::Arc;

use engine::{AbortHandle, OutputStream};
use pyo3::prelude::*;
use tokio::sync::Mutex;

use crate::errors;
use crate::outputs::Accumulator;

/// A submitted request's stream and what has been folded from it.
#[derive(Debug)]
#[pyclass(frozen, module = "paged_llm._core")]
pub struct AsyncStream {
    /// `None` once the stream ended (its last output or an error was returned).
    state: Arc<Mutex<Option<(OutputStream, Accumulator)>>>,
    aborter: AbortHandle,
}

impl AsyncStream {
    pub fn new(stream: OutputStream, acc: Accumulator) -> Self {
        let aborter = stream.abort_handle();
        Self { state: Arc::new(Mutex::new(Some((stream, acc)))), aborter }
    }
}

#[pymethods]
impl AsyncStream {
    /// Awaitable: the next output's JSON, or `None` after the last one.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.state.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let mut state = state.lock().await;
            while let Some((stream, acc)) = state.as_mut() {
                match stream.recv().await {
                    Some(Ok(out)) => {
                        if out.finished {
                            let json = acc.absorb(&out);
                            *state = None;
                            return Ok(json);
                        }
                        if let Some(json) = acc.absorb(&out) {
                            return Ok(Some(json));
                        }
                    }
                    Some(Err(e)) => {
                        *state = None;
                        return Err(errors::stream(e));
                    }
                    None => *state = None,
                }
            }
            Ok(None)
        })
    }

    /// Aborts the request (nothing happens once it has finished); its stream then ends.
    fn abort(&self) {
        self.aborter.abort();
    }
}
