//! Server integration tests over the tiny random model: the OpenAI endpoints (JSON and SSE),
//! the small routes, the web page's routes and the calculator (`/v1/plan`), bad requests,
//! disconnects, the queue bound and the API key, LoRA adapters by `model`; what clients of vLLM
//! rely on (`conformance*`);
//! and the real
//! model behind a socket, driven by the `openai` Python package and curl; the binary and SIGTERM.

mod anthropic;
mod api;
mod bad_input;
mod conformance;
mod conformance_serving;
mod echo;
mod embeddings;
mod kv_map;
mod lora;
mod real_client;
mod reasoning;
mod responses;
mod structured;
mod support;
mod tools;
mod web;
