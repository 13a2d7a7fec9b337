//! Engine integration tests over a tiny random Llama: request lifecycle and bad input,
//! batch invariance, seeded sampling, parallel samples, the threaded handle, and hostile input;
//! over every family's tiny checkpoint against transformers' greedy tokens; LoRA adapters against PEFT's.

mod async_api;
mod basics;
mod device;
mod draft_model;
mod embeddings;
mod families;
mod handle;
mod hostile;
mod invariance;
mod kv_events;
mod kv_map;
mod lora;
mod options;
mod prompt_logprobs;
mod real_model;
mod reasoning_guided;
mod speculative;
mod structured;
mod support;
