//! Integration tests of the model crate: the tiny random Llama (paged vs naive forward,
//! loader errors), the real SmolLM2 model against the reference goldens, and Gemma 3's
//! SentencePiece vocabulary against llama.cpp.

mod gemma3;
mod gemma3_vocab;
mod harness;
mod loader;
mod smollm2;
mod tiny;
