"""Records llama.cpp's tokenization of Gemma 3's SentencePiece vocabulary (run by hand, not in CI).

`python gemma3_tokenization.py MODEL.gguf > gemma3-270m-tokenization.json` with llama-cpp-python
0.3.36 (built from its sdist) and the GGUF `cargo xtask fetch-model --model gemma3-270m` keeps
(`target/models/gemma3-270m/gemma-3-270m-q4_k_m.gguf`). For each text and each way of treating
special-token strings (`parse_special`: `<start_of_turn>` becomes its id, or is plain text), the
ids `Llama(vocab_only=True).tokenize` gives (with BOS when `add_special`), and those ids turned
back into text by `llama_detokenize` without removing special tokens, once with control tokens
left out (`text`) and once written out (`text_special`). `model/tests/it/gemma3_vocab.rs`
compares ours with every case.
"""

import ctypes
import json
import sys

import llama_cpp as L

TEXTS = [
    "The capital of France is",
    "Hello world",
    " leading space",
    "trailing space ",
    "two  spaces and   three    four",
    "     five leading spaces",
    "",
    " ",
    "a",
    "line one\nline two\n\nline four\n\n\n",
    "\ttab\tseparated\t\tvalues\t",
    "mixed \t \n whitespace \r\n end\r",
    "Ünïcödé çåfé naïve résumé Straße",
    "emoji 🦀🚀 and 👩‍👩‍👧‍👦 family 🏳️‍🌈",
    "中文分词测试，日本語のテキスト、한국어 텍스트",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e10 1,000,000",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    'fn main() { println!("{}", xs.iter().map(|v| v * 2).sum::<i32>()); }',
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <pad> <unk> <mask> <unused0><unused98>",
    "<b>bold</b> <table><tr><td>x</td></tr></table> <h1>",
    "[multimodal] <start_of_image><end_of_image>",
    "rare: \ue000\uf8ff 𠀀𪚥 𓀀𐎀 \x01\x02\x7f \u200bzero\u200dwidth",
    "<0x41> looks like a byte token",
    "URL: https://example.com/path?q=a&b=c#frag",
    "Mathematical ∑∫√∞ ≠ ≤ ≥ αβγ",
    "العربية עברית",
    "हिन्दी भाषा",
    "▁already▁escaped▁ ▁",
    "repeated aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!???...,,,;;; -- ** ## ``` ~~~",
    "He said \"it's\" 'quoted' — en–dash … ellipsis",
    " " * 40 + "x",
    "\n" * 35 + "end",
    'JSON: {"key": [1, 2, {"nested": null}]}',
]


def detokenize(vocab, ids, unparse_special):
    arr = (L.llama_token * len(ids))(*ids)
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = L.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    assert 0 <= n < size, n
    return buf.raw[:n].decode("utf-8")


def main():
    llm = L.Llama(sys.argv[1], vocab_only=True, verbose=False)
    vocab = L.llama_model_get_vocab(llm.model)
    cases = []
    for text in TEXTS:
        for parse_special in (True, False):
            for add_special in (True, False) if text in ("", " ", "Hello world") else (True,):
                ids = llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
                cases.append({
                    "text_in": text,
                    "parse_special": parse_special,
                    "add_special": add_special,
                    "ids": ids,
                    "text": detokenize(vocab, ids, False),
                    "text_special": detokenize(vocab, ids, True),
                })
    json.dump({"note": f"llama.cpp via llama-cpp-python {L.__version__}, vocab_only", "cases": cases},
              sys.stdout, ensure_ascii=False, indent=1)
    print()


main()
