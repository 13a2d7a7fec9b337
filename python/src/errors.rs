//! The package's exceptions (`paged_llm.EngineError`, `InvalidRequestError`, …) and how the
//! engine's typed errors map onto them: what a request asked for is a `ValueError`, a full
//! queue is retryable, an engine failure is a `RuntimeError`.

use engine::output::StreamError;
use engine::{RequestError, SamplingParamsError};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    paged_llm,
    EngineError,
    PyRuntimeError,
    "The engine failed: a model that did not load, a step that could not run."
);
pyo3::create_exception!(
    paged_llm,
    EngineStoppedError,
    EngineError,
    "The engine has shut down; nothing more can be submitted."
);
pyo3::create_exception!(
    paged_llm,
    InvalidRequestError,
    PyValueError,
    "A request refused for what it asks: sampling parameters out of range, a prompt too long \
     for max_model_len or the KV cache, a token outside the vocabulary, no chat template."
);
pyo3::create_exception!(
    paged_llm,
    QueueFullError,
    PyRuntimeError,
    "The engine's waiting queue is full (`max_waiting`): retry later, or on another replica."
);

/// Adds the exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("EngineError", py.get_type::<EngineError>())?;
    m.add("EngineStoppedError", py.get_type::<EngineStoppedError>())?;
    m.add("InvalidRequestError", py.get_type::<InvalidRequestError>())?;
    m.add("QueueFullError", py.get_type::<QueueFullError>())?;
    Ok(())
}

pub fn request(e: RequestError) -> PyErr {
    match e {
        RequestError::QueueFull { .. } => QueueFullError::new_err(e.to_string()),
        RequestError::EngineStopped => EngineStoppedError::new_err(e.to_string()),
        _ => InvalidRequestError::new_err(e.to_string()),
    }
}

pub fn engine(e: engine::EngineError) -> PyErr {
    match e {
        engine::EngineError::Stopped => EngineStoppedError::new_err(e.to_string()),
        _ => EngineError::new_err(e.to_string()),
    }
}

pub fn stream(e: StreamError) -> PyErr {
    match e {
        StreamError::Rejected(e) => request(e),
        StreamError::EngineStopped => EngineStoppedError::new_err(e.to_string()),
        StreamError::EngineFailed(_) => EngineError::new_err(e.to_string()),
    }
}

pub fn sampling(e: SamplingParamsError) -> PyErr {
    InvalidRequestError::new_err(e.to_string())
}

/// A JSON value that does not fit its Rust type: a wrong type is Python's `TypeError`, a wrong
/// value (a negative count, an unknown name) `invalid`'s.
pub fn json(what: &str, e: &serde_json::Error, invalid: impl FnOnce(String) -> PyErr) -> PyErr {
    let message = format!("{what}: {e}");
    if e.to_string().starts_with("invalid type") || e.to_string().starts_with("unknown field") {
        PyTypeError::new_err(message)
    } else {
        invalid(message)
    }
}

/// A string naming none of `choices`.
pub fn choice(what: &str, got: &str, choices: &[&str]) -> PyErr {
    PyValueError::new_err(format!("{what} must be one of {}, got {got:?}", choices.join(", ")))
}
