//! Integration tests of the model crate: the tiny random Llama (paged vs naive forward,
//! loader errors), the real SmolLM2 model against the reference goldens, Gemma 3's
//! SentencePiece vocabulary against llama.cpp, and a tiny checkpoint of every family against
//! Hugging Face transformers.

mod families;
mod gemma3;
mod gemma3_vocab;
mod harness;
mod loader;
mod smollm2;
mod tiny;
