//! Integration tests of the model crate: the tiny random Llama (paged vs naive forward,
//! loader errors), the real SmolLM2 and Gemma 3 models against their goldens (Gemma 3 also past
//! its sliding window), Gemma 3's SentencePiece vocabulary against llama.cpp, chat templates
//! against transformers, a tiny checkpoint of every family against Hugging Face transformers, and
//! the perplexity / KL-divergence instrument on SmolLM2, and the int8 KV cache on both real
//! models' goldens; LoRA adapters against PEFT.

mod chat_templates;
mod families;
mod gemma3;
mod gemma3_long;
mod gemma3_vocab;
mod harness;
mod int8_kv;
mod loader;
mod lora;
mod quality;
mod smollm2;
mod tiny;
