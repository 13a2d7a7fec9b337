//! `PromptTokenizer`: a request's prompt token ids as a replica would admit them, from the
//! model's text side alone (what the KV-events router in the Ray ingress compares with the
//! blocks each replica's events say it holds).

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::errors;

#[derive(Debug)]
#[pyclass(frozen, module = "paged_llm._core", name = "PromptTokenizer")]
pub struct PyPromptTokenizer {
    inner: engine::PromptTokenizer,
}

#[pymethods]
impl PyPromptTokenizer {
    /// Reads the tokenizer and chat template of `model` (an HF folder or a GGUF file).
    #[new]
    fn new(py: Python<'_>, model: PathBuf) -> PyResult<Self> {
        let inner = py.detach(|| engine::PromptTokenizer::open(&model)).map_err(errors::engine)?;
        Ok(Self { inner })
    }

    /// The token ids of the prompt of an HTTP `POST` to `path` with JSON `body`, as the
    /// replica's endpoint would admit it; `None` for other routes and for bodies it would refuse.
    fn request_tokens(&self, py: Python<'_>, path: &str, body: &[u8]) -> Option<Vec<u32>> {
        py.detach(|| {
            let prompt = server::request_prompt(path, body)?;
            self.inner.tokenize(prompt).ok()
        })
    }
}
