//! `model`: Llama from Hugging Face folders — config, safetensors weights, tokenizer, chat template, forward pass.
