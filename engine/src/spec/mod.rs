//! Speculative decoding's configuration, as vLLM's `--speculative-config` JSON
//! (`{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
//! "prompt_lookup_max": 5}`, `{"method": "suffix", …}`, `{"method": "draft_model", "model":
//! PATH, …}`), and its proposers ([`ngram`], [`suffix`], [`draft`]).
//!
//! Verification keeps the target's distribution: the target samples each drafted position in turn
//! with the request's own sampler and RNG, and a draft token is kept only where the target drew
//! that very token, so a request's tokens are those of decoding without a draft (seeded ones
//! included) but for the rounding of scoring several positions in one pass, which can tip a
//! near-tie as a batch can; a deterministic draft accepted with the target's probability of its
//! token is speculative sampling's rule for a one-hot proposal.

pub mod draft;
pub mod ngram;
pub mod suffix;

use std::path::PathBuf;

use serde::Deserialize;

use crate::EngineError;
use model::Quantization;

/// Most draft tokens a step may score per sequence (vLLM accepts any; past this a CPU step costs
/// more than the tokens it can save).
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Most nodes the suffix cache of recent outputs holds (16 bytes each) before it forgets its
/// oldest output even under `suffix_decoding_max_cached_requests`.
pub const MAX_SUFFIX_CACHE_NODES: usize = 1 << 22;

/// How drafts are proposed.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecMethod {
    /// Prompt lookup: the tokens that followed the longest recent n-gram of the sequence that
    /// occurred earlier in it (vLLM's `ngram`, llama.cpp's lookup decoding).
    Ngram { min_n: usize, max_n: usize },
    /// Suffix decoding (vLLM's `suffix`): the most frequent continuation of the sequence's
    /// longest matched suffix in its own tokens or in recent requests' outputs ([`suffix`]).
    Suffix(SuffixParams),
    /// A smaller model sharing the target's tokenizer drafts greedily (vLLM's `draft_model`),
    /// with a KV cache of its own ([`draft`]).
    DraftModel(DraftModelParams),
}

/// The draft model of [`SpecMethod::DraftModel`]: a model folder or GGUF, and the format its
/// weights are quantized to on load (vLLM's `quantization`: a self-draft from one file).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftModelParams {
    pub model: PathBuf,
    pub quantization: Option<Quantization>,
}

/// vLLM's `suffix_decoding_*` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixParams {
    /// Longest string the tries hold (match and draft together).
    pub max_tree_depth: usize,
    /// Finished requests' outputs the shared trie keeps (0: only the request's own tokens).
    pub max_cached_requests: usize,
    pub max_spec_factor: f64,
    pub min_token_prob: f64,
}

/// Speculative decoding's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    pub method: SpecMethod,
    /// Draft tokens proposed per sequence and step (vLLM's `num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    /// No drafts in a step once more sequences than this decode (vLLM's
    /// `disable_by_batch_size`); `None`: only the cost rule ([`DraftGate`]) decides.
    pub disable_by_batch_size: Option<usize>,
    /// Plain steps one verification costs, for the cost rule; `None` (what the JSON gives):
    /// measured on the engine's model and device when it starts.
    pub verify_cost: Option<f64>,
}

/// When a sample's drafts pay: its `k` draft tokens add [`DraftCost::extra`] to a step, and,
/// accepted at rate `a` per token, they yield `a + … + a^k` more tokens in expectation, each worth
/// a step of its sequence's time, while the extra time is paid by every sequence of the step
/// ([`DraftCost::token`]: the last step's time over its sequences); a sample drafts while the
/// tokens are worth more than they cost. Its acceptance is a running
/// average of its own drafts'. A sample that never drafted, or stopped, tries (probes) where a
/// fully accepted draft would be worth [`DraftGate::PROBE_MARGIN`] times its cost, then every
/// [`DraftGate::PROBE_EVERY`] steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftGate {
    /// The running acceptance (1 until the first draft is scored).
    pub acceptance: f64,
    /// Whether a draft of the sample has been scored.
    pub measured: bool,
    /// Steps since the sample last drafted.
    pub idle: u32,
}

impl Default for DraftGate {
    fn default() -> Self {
        Self { acceptance: 1.0, measured: false, idle: 0 }
    }
}

impl DraftGate {
    /// Weight of the newest draft in the running acceptance.
    const NEWEST: f64 = 0.3;
    pub const PROBE_EVERY: u32 = 8;
    /// How much more than its cost a fully accepted draft must be worth for a probe: where it is
    /// barely worth it (a big batch), a probe of a sample accepting half its drafts costs several
    /// times what it buys, and every sample of the batch may probe.
    pub const PROBE_MARGIN: f64 = 1.5;

    /// Expected tokens a step from a `k`-token draft accepted at rate `a` per token.
    pub fn expected_tokens(a: f64, k: usize) -> f64 {
        (0..=k as i32).map(|i| a.powi(i)).sum()
    }

    /// Whether to draft `k` tokens for the next step at `cost`.
    pub fn wants(&mut self, k: usize, cost: DraftCost) -> bool {
        let worth =
            |a: f64, margin: f64| (Self::expected_tokens(a, k) - 1.0) * cost.token > margin * cost.extra;
        let probe = !self.measured || self.idle + 1 >= Self::PROBE_EVERY;
        if (self.measured && worth(self.acceptance, 1.0)) || (probe && worth(1.0, Self::PROBE_MARGIN)) {
            self.idle = 0;
            true
        } else {
            self.idle += 1;
            false
        }
    }

    /// One scored draft of `drafted` tokens with `accepted` accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted > 0 {
            let rate = accepted as f64 / drafted as f64;
            self.acceptance += Self::NEWEST * (rate - self.acceptance);
            self.measured = true;
        }
    }
}

/// vLLM's JSON object, field for field; unknown fields are refused, never ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Json {
    method: String,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    model: Option<String>,
    quantization: Option<String>,
    disable_by_batch_size: Option<usize>,
    suffix_decoding_max_tree_depth: Option<usize>,
    suffix_decoding_max_cached_requests: Option<usize>,
    suffix_decoding_max_spec_factor: Option<f64>,
    suffix_decoding_min_token_prob: Option<f64>,
}

impl SpeculativeConfig {
    /// Parses and checks vLLM's `--speculative-config` JSON.
    pub fn from_json(text: &str) -> Result<Self, EngineError> {
        let bad = |why: String| EngineError::Config(format!("speculative config: {why}"));
        let j: Json = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        for (field, set) in [("model", j.model.is_some()), ("quantization", j.quantization.is_some())] {
            if set && j.method != "draft_model" {
                return Err(bad(format!("\"{field}\" is for method \"draft_model\", not \"{}\"", j.method)));
            }
        }
        let suffix_fields = [
            ("suffix_decoding_max_tree_depth", j.suffix_decoding_max_tree_depth.is_some()),
            ("suffix_decoding_max_cached_requests", j.suffix_decoding_max_cached_requests.is_some()),
            ("suffix_decoding_max_spec_factor", j.suffix_decoding_max_spec_factor.is_some()),
            ("suffix_decoding_min_token_prob", j.suffix_decoding_min_token_prob.is_some()),
        ];
        if let Some((field, _)) = suffix_fields.iter().find(|(_, set)| *set).filter(|_| j.method != "suffix")
        {
            return Err(bad(format!("{field} is for method \"suffix\", not \"{}\"", j.method)));
        }
        let depth = j.suffix_decoding_max_tree_depth.unwrap_or(24);
        // vLLM's default for suffix decoding is the tree's depth; ours stops at the cap.
        let default_k = (j.method == "suffix").then_some(depth.min(MAX_SPECULATIVE_TOKENS));
        let Some(k) = j.num_speculative_tokens.or(default_k) else {
            return Err(bad("num_speculative_tokens is required".into()));
        };
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&k) {
            return Err(bad(format!("num_speculative_tokens {k} is outside 1..={MAX_SPECULATIVE_TOKENS}")));
        }
        let method = match j.method.as_str() {
            "ngram" => {
                let min_n = j.prompt_lookup_min.unwrap_or(1);
                let max_n = j.prompt_lookup_max.unwrap_or(min_n.max(3));
                if min_n == 0 || max_n < min_n {
                    return Err(bad(format!(
                        "prompt_lookup_min {min_n} and prompt_lookup_max {max_n} must satisfy 1 <= min <= max"
                    )));
                }
                SpecMethod::Ngram { min_n, max_n }
            }
            "suffix" => {
                let params = SuffixParams {
                    max_tree_depth: depth,
                    max_cached_requests: j.suffix_decoding_max_cached_requests.unwrap_or(10_000),
                    max_spec_factor: j.suffix_decoding_max_spec_factor.unwrap_or(1.0),
                    min_token_prob: j.suffix_decoding_min_token_prob.unwrap_or(0.1),
                };
                if !(2..=1024).contains(&depth) {
                    return Err(bad(format!("suffix_decoding_max_tree_depth {depth} is outside 2..=1024")));
                }
                if !(params.max_spec_factor.is_finite() && params.max_spec_factor > 0.0) {
                    return Err(bad("suffix_decoding_max_spec_factor must be a positive number".into()));
                }
                if !(0.0..=1.0).contains(&params.min_token_prob) {
                    return Err(bad("suffix_decoding_min_token_prob must be within 0..=1".into()));
                }
                SpecMethod::Suffix(params)
            }
            "draft_model" => {
                let model =
                    j.model.ok_or_else(|| bad("method \"draft_model\" needs \"model\": a path".into()))?;
                let quantization = match j.quantization.as_deref() {
                    None => None,
                    Some(name) => {
                        let known = Quantization::NAMES.iter().find(|(n, _)| *n == name);
                        let names: Vec<_> = Quantization::NAMES.iter().map(|(n, _)| *n).collect();
                        let bad_name =
                            || bad(format!("quantization \"{name}\" is not one of {}", names.join(", ")));
                        Some(known.ok_or_else(bad_name)?.1)
                    }
                };
                SpecMethod::DraftModel(DraftModelParams { model: PathBuf::from(model), quantization })
            }
            m @ ("eagle" | "eagle3" | "medusa" | "mtp") => {
                return Err(bad(format!(
                    "method \"{m}\" is not supported by this engine; use \"ngram\", \"suffix\" or \"draft_model\""
                )));
            }
            other => {
                return Err(bad(format!(
                    "unknown method \"{other}\" (methods: \"ngram\", \"suffix\", \"draft_model\")"
                )));
            }
        };
        if j.disable_by_batch_size == Some(0) {
            return Err(bad("disable_by_batch_size must be at least 1".into()));
        }
        Ok(Self {
            method,
            num_speculative_tokens: k,
            disable_by_batch_size: j.disable_by_batch_size,
            verify_cost: None,
        })
    }

    /// The n-gram lengths prompt lookup matches (`min_n`, `max_n`), under [`SpecMethod::Ngram`].
    pub fn ngram(&self) -> Option<(usize, usize)> {
        let SpecMethod::Ngram { min_n, max_n } = self.method else { return None };
        Some((min_n, max_n))
    }

    /// How a suffix draft grows, under [`SpecMethod::Suffix`].
    pub fn suffix_rule(&self) -> Option<(SuffixParams, suffix::DraftRule)> {
        let SpecMethod::Suffix(p) = self.method else { return None };
        let rule = suffix::DraftRule {
            max_tokens: self.num_speculative_tokens,
            max_spec_factor: p.max_spec_factor,
            min_token_prob: p.min_token_prob,
        };
        Some((p, rule))
    }
}

/// What drafting costs and buys in one step, in seconds (or in plain batch-1 steps where the
/// verification's cost is pinned instead of measured).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftCost {
    /// What a sample's `k` draft tokens add to a step.
    pub extra: f64,
    /// A step's time over the sequences that wait for it.
    pub token: f64,
}

impl DraftCost {
    /// At batch 1 with a verification costing `verify_cost` plain steps.
    pub fn batch1(verify_cost: f64) -> Self {
        Self { extra: verify_cost - 1.0, token: 1.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_json_parses_and_bad_configs_say_why() {
        let c = SpeculativeConfig::from_json(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}"#,
        );
        assert_eq!(
            c.ok(),
            Some(SpeculativeConfig {
                method: SpecMethod::Ngram { min_n: 2, max_n: 5 },
                num_speculative_tokens: 4,
                disable_by_batch_size: None,
                verify_cost: None,
            })
        );
        for (json, says) in [
            (r#"{"method": "ngram", "num_speculative_tokens": 0}"#, "outside 1..=16"),
            (r#"{"method": "ngram", "num_speculative_tokens": 17}"#, "outside 1..=16"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}"#,
                "min <= max",
            ),
            (r#"{"method": "lookahead", "num_speculative_tokens": 2}"#, "unknown method"),
            (r#"{"method": "draft_model", "num_speculative_tokens": 2}"#, "needs \"model\""),
            (r#"{"method": "eagle", "num_speculative_tokens": 2}"#, "not supported"),
            (
                r#"{"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "quantization": "q3"}"#,
                "not one of q8_0, q4_0",
            ),
            (
                r#"{"method": "ngram", "quantization": "q8_0", "num_speculative_tokens": 2}"#,
                "is for method \"draft_model\"",
            ),
            (
                r#"{"method": "ngram", "model": "x", "num_speculative_tokens": 2}"#,
                "is for method \"draft_model\"",
            ),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens is required"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8}"#,
                "is for method \"suffix\"",
            ),
            (r#"{"method": "suffix", "suffix_decoding_max_tree_depth": 1}"#, "outside 2..=1024"),
            (r#"{"method": "suffix", "suffix_decoding_min_token_prob": 1.5}"#, "within 0..=1"),
            (r#"{"method": "suffix", "suffix_decoding_max_spec_factor": 0}"#, "positive"),
            (r#"{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}"#, "unknown field"),
            (r#"{"method": "ngram""#, "EOF"),
            (r#"{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}"#, "at least 1"),
        ] {
            let e = SpeculativeConfig::from_json(json).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn a_draft_model_takes_a_path_and_an_optional_quantization() {
        let c = SpeculativeConfig::from_json(
            r#"{"method": "draft_model", "model": "/m/draft.gguf", "num_speculative_tokens": 3, "quantization": "q4_0"}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let want = DraftModelParams {
            model: PathBuf::from("/m/draft.gguf"),
            quantization: Some(Quantization::Q4_0),
        };
        assert_eq!((c.method, c.num_speculative_tokens), (SpecMethod::DraftModel(want), 3));
    }

    #[test]
    fn suffix_settings_take_vllms_names_and_defaults() {
        let c = SpeculativeConfig::from_json(r#"{"method": "suffix"}"#).unwrap_or_else(|e| panic!("{e}"));
        let want = SuffixParams {
            max_tree_depth: 24,
            max_cached_requests: 10_000,
            max_spec_factor: 1.0,
            min_token_prob: 0.1,
        };
        assert_eq!((c.method, c.num_speculative_tokens), (SpecMethod::Suffix(want), 16));
        let c = SpeculativeConfig::from_json(
            r#"{"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 12,
                "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2.0,
                "suffix_decoding_min_token_prob": 0.3}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (p, rule) = c.suffix_rule().expect("suffix");
        assert_eq!((p.max_tree_depth, p.max_cached_requests), (12, 0));
        assert_eq!(rule, suffix::DraftRule { max_tokens: 4, max_spec_factor: 2.0, min_token_prob: 0.3 });
    }

    /// A sample drafts while its acceptance makes a draft worth its verification, and probes now
    /// and then once it stopped; its acceptance follows its drafts.
    #[test]
    fn the_gate_drafts_while_drafts_pay() {
        assert_eq!(DraftGate::expected_tokens(0.0, 4), 1.0);
        assert_eq!(DraftGate::expected_tokens(1.0, 4), 5.0);
        let b1 = DraftCost::batch1(2.8);
        let mut gate = DraftGate::default();
        assert!(gate.wants(4, b1), "a new sample drafts");
        for _ in 0..10 {
            gate.record(4, 0);
        }
        assert!(gate.acceptance < 0.05);
        let wanted: Vec<bool> = (0..DraftGate::PROBE_EVERY).map(|_| gate.wants(4, b1)).collect();
        assert_eq!(wanted.iter().filter(|&&w| w).count(), 1, "one probe per period: {wanted:?}");
        assert!(gate.wants(4, DraftCost::batch1(0.9)), "drafting is free where it costs nothing");
        for _ in 0..10 {
            gate.record(4, 4);
        }
        assert!(gate.wants(4, b1));
        // In a big batch a token is cheap next to a draft's extra positions: no draft, no probe.
        let b64 = DraftCost { extra: 1.8, token: 0.3 };
        assert!((0..2 * DraftGate::PROBE_EVERY).all(|_| !gate.wants(4, b64)));
        // Where a fully accepted draft is barely worth its cost, neither a new sample nor one
        // that stopped drafting tries (a half-accepted probe would cost several times its worth);
        // a sample whose drafts are accepted keeps drafting.
        let borderline = DraftCost { extra: 1.0, token: 0.3 };
        let mut new = DraftGate::default();
        assert!((0..2 * DraftGate::PROBE_EVERY).all(|_| !new.wants(4, borderline)), "{new:?}");
        let mut stopped = gate;
        (0..10).for_each(|_| stopped.record(4, 2));
        assert!((0..2 * DraftGate::PROBE_EVERY).all(|_| !stopped.wants(4, borderline)), "{stopped:?}");
        assert!(gate.wants(4, borderline), "fully accepted drafts pay");
    }
}
