//! `_core.Engine`: one loaded model and its engine thread (`engine::EngineHandle`), what
//! `paged_llm.LLM` and `AsyncLLM` wrap. Every wait on the engine (loading, a batch, a metrics
//! snapshot, shutdown) releases the GIL; a blocking batch wakes every 100 ms to let Ctrl-C
//! through, and a Python exception there aborts the batch's requests (dropping their streams).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::{
    Engine, EngineHandle, PoolingParams, Prompt, RequestError, RequestOptions, RequestStream, ShutdownMode,
    ValidSamplingParams,
};
use pyo3::prelude::*;

use crate::args::{self, PromptArg};
use crate::errors;
use crate::outputs::{Accumulator, OutputKind, TokenText};
use crate::stream::AsyncStream;

/// How long a blocking wait holds off Python's signal handlers (Ctrl-C) at most.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

#[derive(Debug)]
#[pyclass(frozen, module = "paged_llm._core", name = "Engine")]
pub struct PyEngine {
    pub(crate) handle: EngineHandle,
}

/// A request ready to submit: its prompt tokenized on the caller's thread, as the engine
/// would, so that its outputs can report the prompt's token ids.
struct Request {
    prompt: Option<String>,
    token_ids: Arc<[u32]>,
    params: ValidSamplingParams,
}

impl PyEngine {
    /// Checks and tokenizes one prompt with its parameters (JSON, `None`: the model's defaults).
    fn request(&self, prompt: &str, params: Option<&str>) -> PyResult<Request> {
        let prompt = PromptArg::parse(prompt)?;
        let params = args::sampling_params(params, self.handle.default_sampling_params())?;
        let text = prompt.text().map(str::to_owned);
        let is_chat = matches!(prompt, PromptArg::Conversation(_));
        let ids = self.handle.tokenize(prompt.into_prompt()).map_err(errors::request)?;
        // A conversation's prompt is the text its template rendered, as vLLM reports it.
        let text = if is_chat {
            Some(self.handle.tokenizer().decode(&ids, false).map_err(|e| errors::engine(e.into()))?)
        } else {
            text
        };
        Ok(Request { prompt: text, token_ids: ids.into(), params })
    }

    fn accumulator(&self, kind: OutputKind, id: &str, request: &Request) -> Accumulator {
        let tokenizer = TokenText(self.handle.clone());
        Accumulator::new(kind, id.to_owned(), request.prompt.clone(), request.token_ids.clone(), tokenizer)
    }
}

/// Waits for a stream's end (the GIL released, signals checked between waits) and returns the
/// final output's JSON.
fn finish(py: Python<'_>, mut stream: RequestStream, acc: &mut Accumulator) -> PyResult<String> {
    loop {
        match py.detach(|| stream.recv_timeout(SIGNAL_CHECK)) {
            Some(Ok(Some(out))) => {
                if let Some(json) = acc.absorb(&out) {
                    return Ok(json);
                }
            }
            Some(Ok(None)) => py.check_signals()?,
            Some(Err(e)) => return Err(errors::stream(e)),
            None => return Err(errors::EngineError::new_err("the request ended without a final output")),
        }
    }
}

#[pymethods]
impl PyEngine {
    /// Loads `model` (a Hugging Face folder or a GGUF file) with `engine_args` (a JSON object)
    /// and starts the engine thread.
    #[new]
    fn new(py: Python<'_>, model: PathBuf, engine_args: &str) -> PyResult<Self> {
        let config = args::engine_config(engine_args)?;
        let engine = py.detach(|| Engine::new(&model, config)).map_err(errors::engine)?;
        let handle = EngineHandle::spawn(engine).map_err(errors::engine)?;
        Ok(Self { handle })
    }

    #[getter]
    fn model_name(&self) -> &str {
        self.handle.model_name()
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.handle.max_model_len()
    }

    #[getter]
    fn has_chat_template(&self) -> bool {
        self.handle.chat_template().is_some()
    }

    /// The sampling parameters a request without any gets (JSON): vLLM's defaults with the
    /// model's generation config on top.
    fn default_sampling_params(&self) -> String {
        // A struct of numbers, strings and maps: serializing it cannot fail.
        serde_json::to_string(self.handle.default_sampling_params()).unwrap_or_default()
    }

    /// A prompt (JSON) as token ids, exactly as a submission would tokenize it.
    fn tokenize(&self, py: Python<'_>, prompt: &str) -> PyResult<Vec<u32>> {
        let prompt = PromptArg::parse(prompt)?.into_prompt();
        py.detach(|| self.handle.tokenize(prompt)).map_err(errors::request)
    }

    #[pyo3(signature = (token_ids, skip_special_tokens = true))]
    fn decode(&self, token_ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        self.handle.tokenizer().decode(&token_ids, skip_special_tokens).map_err(|e| errors::engine(e.into()))
    }

    /// The offline batch: every (prompt, params) pair submitted at once (past `max_waiting`,
    /// as room frees up), then each request's final output (JSON), in order. A refused request
    /// raises, and the batch's other requests are aborted.
    fn generate(
        &self,
        py: Python<'_>,
        requests: Vec<(String, Option<String>, Option<String>)>,
    ) -> PyResult<Vec<String>> {
        let loras = requests
            .iter()
            .map(|(_, _, lora)| args::LoraArg::parse(lora.as_deref()))
            .collect::<PyResult<Vec<_>>>()?;
        let requests: Vec<Request> = requests
            .iter()
            .map(|(prompt, params, _)| self.request(prompt, params.as_deref()))
            .collect::<PyResult<_>>()?;
        let mut results: Vec<Option<String>> = vec![None; requests.len()];
        let mut pending = VecDeque::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let id = self.handle.next_request_id();
            loop {
                let tokens = Prompt::Tokens(request.token_ids.to_vec());
                let options = RequestOptions { lora: loras[i].clone(), ..RequestOptions::default() };
                let params = request.params.clone();
                match py.detach(|| self.handle.add_request_with_options(id.clone(), tokens, params, options))
                {
                    Ok(stream) => {
                        pending.push_back((i, stream, self.accumulator(OutputKind::FinalOnly, &id, request)));
                        break;
                    }
                    // A full waiting queue drains as the engine steps: the oldest request's end
                    // makes room.
                    Err(RequestError::QueueFull { .. }) if !pending.is_empty() => {
                        if let Some((j, stream, mut acc)) = pending.pop_front() {
                            results[j] = Some(finish(py, stream, &mut acc)?);
                        }
                    }
                    Err(e) => return Err(errors::request(e)),
                }
            }
        }
        for (j, stream, mut acc) in pending {
            results[j] = Some(finish(py, stream, &mut acc)?);
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// Embeds every prompt (JSON), one pooling request each (`pooling`: vLLM's `PoolingParams`
    /// fields as JSON), all submitted at once (past `max_waiting`, as room frees up); the
    /// vectors in order. A refused prompt raises, and the batch's other requests are aborted.
    #[pyo3(signature = (prompts, pooling = None))]
    fn embed(&self, py: Python<'_>, prompts: Vec<String>, pooling: Option<&str>) -> PyResult<Vec<Vec<f32>>> {
        let pooling: PoolingParams = match pooling {
            Some(json) => serde_json::from_str(json)
                .map_err(|e| errors::json("pooling params", &e, pyo3::exceptions::PyValueError::new_err))?,
            None => PoolingParams::default(),
        };
        let prompts: Vec<Prompt> = prompts
            .iter()
            .map(|p| PromptArg::parse(p).map(PromptArg::into_prompt))
            .collect::<PyResult<_>>()?;
        let options = RequestOptions::default().with_pooling(pooling);
        py.detach(|| {
            let mut vectors: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
            let mut pending: VecDeque<(usize, RequestStream)> = VecDeque::with_capacity(prompts.len());
            let finish = |stream: RequestStream| -> PyResult<Vec<f32>> {
                let fin = stream.collect_final().map_err(errors::stream)?;
                let reason = "finished without its embedding".to_owned();
                fin.embedding
                    .ok_or_else(|| errors::request(RequestError::Pooling { id: fin.request_id, reason }))
            };
            for (i, prompt) in prompts.into_iter().enumerate() {
                let id = self.handle.next_request_id();
                loop {
                    let params = engine::SamplingParams::greedy(1);
                    match self.handle.add_request_with_options(
                        id.clone(),
                        prompt.clone(),
                        params,
                        options.clone(),
                    ) {
                        Ok(stream) => {
                            pending.push_back((i, stream));
                            break;
                        }
                        // A full waiting queue drains as the engine steps.
                        Err(RequestError::QueueFull { .. }) if !pending.is_empty() => {
                            if let Some((j, stream)) = pending.pop_front() {
                                vectors[j] = Some(finish(stream)?);
                            }
                        }
                        Err(e) => return Err(errors::request(e)),
                    }
                }
            }
            for (j, stream) in pending {
                vectors[j] = Some(finish(stream)?);
            }
            Ok(vectors.into_iter().flatten().collect())
        })
    }

    /// Submits one request for asyncio; outputs come through the returned stream as
    /// `options.output_kind` says (`cumulative`, `delta` or `final_only`).
    fn submit(
        &self,
        py: Python<'_>,
        prompt: &str,
        params: Option<&str>,
        options: &str,
    ) -> PyResult<AsyncStream> {
        let options = args::SubmitOptions::parse(options)?;
        let kind = OutputKind::parse(&options.output_kind)?;
        let request = self.request(prompt, params)?;
        let id = options.request_id.unwrap_or_else(|| self.handle.next_request_id());
        let engine_options = RequestOptions {
            priority: options.priority,
            cache_salt: options.cache_salt,
            pooling: None,
            lora: options.lora.map(Into::into),
        };
        let tokens = Prompt::Tokens(request.token_ids.to_vec());
        let stream = py
            .detach(|| self.handle.submit(id.clone(), tokens, request.params.clone(), engine_options))
            .map_err(errors::request)?;
        Ok(AsyncStream::new(stream, self.accumulator(kind, &id, &request)))
    }

    /// Aborts an unfinished request by id; false when there is none.
    fn abort(&self, request_id: &str) -> bool {
        self.handle.abort(request_id).is_ok()
    }

    /// A metrics snapshot (JSON), taken between two engine steps.
    fn metrics(&self, py: Python<'_>) -> PyResult<String> {
        let snapshot = py.detach(|| self.handle.metrics()).map_err(errors::engine)?;
        Ok(serde_json::to_string(&snapshot).unwrap_or_default())
    }

    /// Awaitable [`PyEngine::metrics`], for asyncio.
    fn metrics_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = self.handle.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let snapshot = handle.metrics_async().await.map_err(errors::engine)?;
            Ok(serde_json::to_string(&snapshot).unwrap_or_default())
        })
    }

    /// Whether the engine holds no KV block (nothing running, nothing leaked).
    fn kv_is_idle(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.handle.kv_is_idle()).map_err(errors::engine)
    }

    /// The KV events publisher's PUB and replay addresses as bound (`None`: events are off).
    fn kv_events_endpoints(&self) -> Option<(String, Option<String>)> {
        self.handle.kv_events_endpoints()
    }

    /// Each registered LoRA adapter's numeric id (the `lora_id` its KV events carry), by name.
    fn lora_ids(&self) -> std::collections::HashMap<String, u32> {
        self.handle.loras().list().into_iter().map(|l| (l.name, l.id)).collect()
    }

    /// The block hashes (as KV events publish them) of the device prefix cache and of the host
    /// swap space, between two steps.
    fn cached_block_hashes(&self, py: Python<'_>) -> PyResult<(Vec<u64>, Vec<u64>)> {
        py.detach(|| self.handle.cached_block_hashes()).map_err(errors::engine)
    }

    /// Stops the engine thread: unfinished requests are aborted, or with `drain` finished first.
    #[pyo3(signature = (drain = false))]
    fn shutdown(&self, py: Python<'_>, drain: bool) {
        let mode = if drain { ShutdownMode::Drain } else { ShutdownMode::Abort };
        py.detach(|| self.handle.shutdown(mode));
    }
}
