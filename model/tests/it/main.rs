//! Integration tests of the model crate: the tiny random Llama (paged vs naive forward,
//! loader errors) and the real SmolLM2 model against the reference goldens.

mod chat_templates;
mod harness;
mod loader;
mod smollm2;
mod tiny;
