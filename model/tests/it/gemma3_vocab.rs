//! Gemma 3's SentencePiece-style GGUF vocabulary (262 144 tokens, byte fallback, user-defined
//! whitespace and HTML tokens), rebuilt as a `tokenizers` tokenizer, against llama.cpp: the
//! cases `tests/data/gemma3_tokenization.py` recorded (ids both ways of treating special-token
//! strings, and the ids detokenized), the public goldens' prompt ids, and random texts through
//! the plain transcription of llama.cpp's algorithm (`model::testing::spm_reference_encode`).

use std::path::PathBuf;
use std::sync::OnceLock;

use model::Tokenizer;
use model::gguf::{GgufFile, GgufVocab, VocabModel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

struct Gemma {
    vocab: GgufVocab,
    tokenizer: Tokenizer,
}

fn gemma() -> &'static Gemma {
    static G: OnceLock<Gemma> = OnceLock::new();
    G.get_or_init(|| {
        let path = model::testing::gemma3_gguf_for_tests();
        let g = GgufFile::open_metadata(&path).expect("read the Gemma 3 GGUF's metadata");
        let vocab = GgufVocab::from_gguf(&g).expect("read its vocabulary");
        let start = std::time::Instant::now();
        let tokenizer = vocab.tokenizer(&path).expect("build its tokenizer");
        eprintln!("Gemma 3 tokenizer built in {:.2?}", start.elapsed());
        Gemma { vocab, tokenizer }
    })
}

fn data(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

#[test]
fn the_vocabulary_is_read_as_llama_cpp_reads_it() {
    let v = &gemma().vocab;
    assert_eq!(v.model, VocabModel::Llama);
    assert_eq!((v.tokens.len(), v.scores.len(), v.token_types.len()), (262_144, 262_144, 262_144));
    assert_eq!(
        (v.bos_token_id, v.eos_token_id, v.unk_token_id, v.pad_token_id),
        (Some(2), Some(1), Some(3), Some(0))
    );
    assert!(v.add_bos_token && !v.add_eos_token && !v.add_space_prefix);
    let t = &gemma().tokenizer;
    assert_eq!(t.vocab_size(), 262_144);
    assert_eq!(
        (t.token_to_id("<start_of_turn>"), t.token_to_id("<0x0A>"), t.token_to_id("▁")),
        (Some(105), Some(248), Some(236743))
    );
}

#[test]
fn matches_llama_cpp_token_for_token_and_back() {
    let t = &gemma().tokenizer;
    let recorded = data("gemma3-270m-tokenization.json");
    let cases = recorded["cases"].as_array().expect("cases");
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text_in"].as_str().expect("text_in");
        let parse_special = case["parse_special"].as_bool().expect("parse_special");
        let add_special = case["add_special"].as_bool().expect("add_special");
        let want = ids(&case["ids"]);
        let got = t.encode(text, parse_special, add_special).expect("encode");
        if got != want {
            failures.push(format!(
                "encode {text:?} (parse_special {parse_special}): {got:?}, llama.cpp {want:?}"
            ));
        }
        // llama.cpp's detokenize leaves control tokens out unless asked to write them.
        for (skip_special, key) in [(true, "text"), (false, "text_special")] {
            let back = t.decode(&want, skip_special).expect("decode");
            let expected = case[key].as_str().expect(key);
            if back != expected {
                failures.push(format!("decode {want:?} ({key}): {back:?}, llama.cpp {expected:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The public goldens' prompts and the long one past the sliding window.
#[test]
fn goldens_prompt_ids_and_outputs() {
    let t = &gemma().tokenizer;
    let goldens = data("gemma3-270m-public.json");
    let generations = goldens["generations"].as_array().expect("generations");
    assert!(!generations.is_empty());
    let long = data("gemma3-270m-long.json");
    for g in generations.iter().chain([&long]) {
        let prompt = g["prompt_text"].as_str().expect("prompt_text");
        assert_eq!(t.encode(prompt, true, true).unwrap(), ids(&g["prompt_ids"]), "{prompt:?}");
        let output = ids(&g["output_ids"]);
        assert_eq!(t.decode(&output, true).unwrap(), g["output_text"].as_str().unwrap(), "{output:?}");
    }
}

/// A random text of pieces the vocabulary holds in many combinations, no two spaces in a row
/// and none of `\n`, `\t`, `<`, `[`: so no user-defined or special token occurs in it and the
/// whole text is one fragment for llama.cpp.
fn random_text(rng: &mut ChaCha8Rng) -> String {
    const PIECES: &[&str] = &[
        "a", "e", "t", "th", "ing", "the", "tion", "Hello", "world", "x", "Q", "z", "0", "7", "42", "3.14",
        ".", ",", "!", "?", "'", "\"", "-", "(", ")", "{", "}", "=", "+", "é", "ü", "ß", "ñ", "中", "文",
        "日本", "語", "한", "국", "🦀", "🚀", "👍", "\u{e000}", "𠀀", "ą", "ж", "Ω", "∑", "√", "…", "—", "_",
        "/", "#", "▁",
    ];
    let n = rng.random_range(1..40);
    let mut s = String::new();
    for _ in 0..n {
        if rng.random_bool(0.25) && !s.ends_with(' ') {
            s.push(' ');
        }
        s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    s
}

#[test]
fn random_texts_tokenize_as_llama_cpp_s_algorithm() {
    let Gemma { vocab, tokenizer } = gemma();
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for _ in 0..150 {
        let text = random_text(&mut rng);
        let want =
            model::testing::spm_reference_encode(&vocab.tokens, &vocab.scores, &text.replace(' ', "▁"));
        let got = tokenizer.encode(&text, false, false).expect("encode");
        assert_eq!(got, want, "{text:?}");
        // A literal `▁` comes back as a space, as from llama.cpp.
        assert_eq!(tokenizer.decode(&got, true).unwrap(), text.replace('▁', " "));
    }
}
