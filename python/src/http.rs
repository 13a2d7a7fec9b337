//! `_core.HttpApp`: the `server` crate's OpenAI-compatible router in process, over the engine
//! of a `_core.Engine`. A request given as (method, path, headers, body) is answered exactly
//! as `cargo xtask serve` answers it over a socket, its body as awaitable chunks (one per SSE
//! event when streaming): what a Ray Serve replica (`paged_llm.serve`) forwards to.

use std::sync::Arc;

use axum::body::{Body, BodyDataStream};
use axum::http::{HeaderName, HeaderValue, Method, Request};
use futures_util::StreamExt;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use server::{AppState, ServerConfig};
use tokio::sync::Mutex;
use tower::ServiceExt;

use crate::core::PyEngine;
use crate::errors;

#[derive(Debug)]
#[pyclass(frozen, module = "paged_llm._core", name = "HttpApp")]
pub struct HttpApp {
    router: axum::Router,
}

#[pymethods]
impl HttpApp {
    /// The router over `engine`'s engine thread, with the server's default settings (no API
    /// key: the ingress in front of it is the one that faces clients).
    #[new]
    fn new(engine: &PyEngine) -> PyResult<Self> {
        let config = ServerConfig::default();
        let state = AppState::new(engine.handle.clone(), &config)
            .map_err(|e| errors::EngineError::new_err(format!("metrics registry: {e}")))?;
        Ok(Self { router: server::router(Arc::new(state), &config) })
    }

    /// Awaitable: `(status, headers, body)` for one request; `headers` a list of (name,
    /// value) pairs, `body` an `HttpBody`. Resolves once the response's head is ready (for
    /// a stream, before its first event).
    fn call<'py>(
        &self,
        py: Python<'py>,
        method: &str,
        path: &str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let method =
            Method::from_bytes(method.as_bytes()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in &headers {
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| PyValueError::new_err(e.to_string()))?;
            let value = HeaderValue::from_str(value).map_err(|e| PyValueError::new_err(e.to_string()))?;
            request = request.header(name, value);
        }
        let request = request.body(Body::from(body)).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let router = self.router.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let (parts, body) = response.into_parts();
            let headers: Vec<(String, String)> = parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect();
            let body = HttpBody { stream: Arc::new(Mutex::new(Some(body.into_data_stream()))) };
            Ok((parts.status.as_u16(), headers, body))
        })
    }
}

/// A response body being produced. Dropping it (or `close()`) drops the response, which
/// aborts the requests it was streaming, as a client that hangs up does.
#[derive(Debug)]
#[pyclass(frozen, module = "paged_llm._core")]
pub struct HttpBody {
    stream: Arc<Mutex<Option<BodyDataStream>>>,
}

#[pymethods]
impl HttpBody {
    /// Awaitable: the next chunk as `bytes`, or `None` after the last one.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stream = self.stream.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let mut guard = stream.lock().await;
            let Some(body) = guard.as_mut() else { return Ok(None) };
            loop {
                match body.next().await {
                    Some(Ok(chunk)) if chunk.is_empty() => {}
                    Some(Ok(chunk)) => {
                        return Ok(Some(Python::attach(|py| PyBytes::new(py, &chunk).unbind())));
                    }
                    Some(Err(e)) => {
                        *guard = None;
                        return Err(errors::EngineError::new_err(format!("response body: {e}")));
                    }
                    None => {
                        *guard = None;
                        return Ok(None);
                    }
                }
            }
        })
    }

    /// Drops the response (once a pending `next()` has returned or been cancelled).
    fn close(&self) {
        let stream = self.stream.clone();
        pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
            *stream.lock().await = None;
        });
    }
}
