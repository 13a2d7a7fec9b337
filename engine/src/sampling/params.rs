//! `SamplingParams`: how one request picks its tokens (vLLM's knobs and defaults), and
//! their validation, once, into typed errors or a [`ValidSamplingParams`] before a request ever
//! reaches the scheduler.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::structured::Constraint;

/// Upper bound on `n` (parallel samples of one prompt); more is almost surely a client bug.
pub const MAX_N: usize = 256;
/// Upper bound on top-N logprobs per position (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;
/// Below this temperature a request is greedy (vLLM's `_SAMPLING_EPS`).
pub const GREEDY_EPS: f32 = 1e-5;
/// Most tokens one request may bias.
pub const MAX_LOGIT_BIAS: usize = 4096;
/// A logit bias lies in `-LOGIT_BIAS_RANGE..=LOGIT_BIAS_RANGE` (OpenAI's -100..100).
pub const LOGIT_BIAS_RANGE: f32 = 100.0;

/// How one request samples (vLLM `SamplingParams` semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Parallel samples of the same prompt; they share the prompt's KV blocks.
    pub n: usize,
    /// 0 means greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Nucleus sampling: the smallest set of tokens whose mass reaches `top_p`, in (0, 1].
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; -1 (or 0) disables it.
    pub top_k: i32,
    /// Keep tokens whose probability is at least `min_p` times the most likely one's.
    pub min_p: f32,
    /// Subtracted once from the logit of every token already generated, in [-2, 2].
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated, in [-2, 2].
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or output; > 0.
    pub repetition_penalty: f32,
    /// Per-request seed: the same seed gives the same tokens whatever else shares the batch.
    pub seed: Option<u64>,
    /// Stop strings; the text ends before the first one found (unless `include_stop_str_in_output`).
    pub stop: Vec<String>,
    /// Extra token ids that end a sequence (the token itself is part of the output ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep the matched stop string at the end of the text.
    pub include_stop_str_in_output: bool,
    /// Keep generating past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Most tokens to generate; `None` means up to the model's max length.
    pub max_tokens: Option<usize>,
    /// EOS and stop token ids are masked until this many tokens were generated.
    pub min_tokens: usize,
    /// Return this many top logprobs per generated position (plus the sampled token's).
    pub logprobs: Option<usize>,
    /// Return the logprob of every prompt token given the tokens before it (the first has none),
    /// with this many top alternatives per position (vLLM's `prompt_logprobs`; 0 = the prompt
    /// token's own only). Such a request computes every prompt position: it reads no prefix-cache hit.
    pub prompt_logprobs: Option<usize>,
    /// Leave special tokens out of the detokenized text.
    pub skip_special_tokens: bool,
    /// What the output must match (a JSON schema, a regex, choices, a grammar): tokens the
    /// constraint does not allow are masked out before every sampling rule.
    pub constraint: Option<Constraint>,
    /// Added to the logit of each token id before sampling (OpenAI's `logit_bias`, -100..=100):
    /// -100 in effect bans a token, +100 forces it wherever it is allowed.
    pub logit_bias: BTreeMap<u32, f32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str_in_output: false,
            ignore_eos: false,
            max_tokens: Some(16),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            constraint: None,
            logit_bias: BTreeMap::new(),
        }
    }
}

/// A sampling parameter outside its domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingParamsError {
    #[error("n must be in 1..={MAX_N}, got {0}")]
    N(usize),
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("top_k must be -1 (disabled) or at least 0, got {0}")]
    TopK(i32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("{name} must be in [-2, 2], got {value}")]
    Penalty { name: &'static str, value: f32 },
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("max_tokens must be at least 1, got 0")]
    MaxTokensZero,
    #[error("min_tokens ({min}) must not exceed max_tokens ({max})")]
    MinTokensOverMax { min: usize, max: usize },
    #[error("logprobs must be at most {MAX_LOGPROBS}, got {0}")]
    Logprobs(usize),
    #[error("prompt_logprobs must be at most {MAX_LOGPROBS}, got {0}")]
    PromptLogprobs(usize),
    #[error("stop strings must not be empty")]
    EmptyStopString,
    #[error("logit_bias of token {token} must be a number in [-100, 100], got {value}")]
    LogitBias { token: u32, value: f32 },
    #[error("logit_bias may bias at most {MAX_LOGIT_BIAS} tokens, got {0}")]
    LogitBiasCount(usize),
}

impl SamplingParams {
    /// Greedy decoding (temperature 0) of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self { temperature: 0.0, max_tokens: Some(max_tokens), ..Self::default() }
    }

    /// vLLM's defaults with the sampling fields of a model's `generation_config.json` on top
    /// (temperature, top_p, top_k, min_p, repetition_penalty, and max_new_tokens as
    /// `max_tokens`): what a request gets for every field it leaves unset. Front ends build
    /// requests as `SamplingParams { max_tokens: Some(64), ..engine.default_sampling_params() }`.
    pub fn with_generation_defaults(generation: &model::GenerationConfig) -> Self {
        let d = Self::default();
        Self {
            temperature: generation.temperature.unwrap_or(d.temperature),
            top_p: generation.top_p.unwrap_or(d.top_p),
            top_k: generation.top_k.map_or(d.top_k, |k| i32::try_from(k).unwrap_or(i32::MAX)),
            min_p: generation.min_p.unwrap_or(d.min_p),
            repetition_penalty: generation.repetition_penalty.unwrap_or(d.repetition_penalty),
            max_tokens: generation.max_new_tokens.or(d.max_tokens),
            ..d
        }
    }

    /// Parses a JSON object of sampling fields, taking every field it leaves out from
    /// `defaults` (a request's fields over the engine's defaults).
    pub fn from_json_over(defaults: &Self, fields: &serde_json::Value) -> Result<Self, serde_json::Error> {
        let mut merged = serde_json::to_value(defaults)?;
        match (merged.as_object_mut(), fields.as_object()) {
            (Some(base), Some(over)) => {
                for (k, v) in over {
                    base.insert(k.clone(), v.clone());
                }
            }
            _ => return Err(serde::de::Error::custom("sampling parameters must be a JSON object")),
        }
        serde_json::from_value(merged)
    }

    /// Whether the request takes the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_EPS
    }

    /// Whether the token is the bare argmax of the logits: greedy, no penalty, no logprobs, no
    /// banned tokens (`min_tokens`), no constraint or bias. Such rows can be sampled where the
    /// logits are (the GPU).
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy()
            && !self.has_penalties()
            && self.logprobs.is_none()
            && self.min_tokens == 0
            && self.constraint.is_none()
            && self.logit_bias.is_empty()
    }

    /// Whether any of the three penalties changes the logits.
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repetition_penalty != 1.0
    }

    /// `top_k` as a count, `None` when disabled.
    pub fn top_k_limit(&self) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k > 0)
    }

    /// Longest stop string in bytes (what streaming must hold back, minus one).
    pub fn max_stop_len(&self) -> usize {
        self.stop.iter().map(String::len).max().unwrap_or(0)
    }

    /// Checks every field's domain (vLLM's `_verify_args`): the one place a request's
    /// parameters are checked; what passes is read-only from then on.
    pub fn validate(self) -> Result<ValidSamplingParams, SamplingParamsError> {
        self.check()?;
        Ok(ValidSamplingParams(self))
    }

    fn check(&self) -> Result<(), SamplingParamsError> {
        use SamplingParamsError as E;
        if self.n == 0 || self.n > MAX_N {
            return Err(E::N(self.n));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(E::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(E::TopP(self.top_p));
        }
        if self.top_k < -1 {
            return Err(E::TopK(self.top_k));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(E::MinP(self.min_p));
        }
        for (name, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                return Err(E::Penalty { name, value });
            }
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(E::RepetitionPenalty(self.repetition_penalty));
        }
        if let Some(max) = self.max_tokens {
            if max == 0 {
                return Err(E::MaxTokensZero);
            }
            if self.min_tokens > max {
                return Err(E::MinTokensOverMax { min: self.min_tokens, max });
            }
        }
        if let Some(k) = self.logprobs
            && k > MAX_LOGPROBS
        {
            return Err(E::Logprobs(k));
        }
        if let Some(k) = self.prompt_logprobs
            && k > MAX_LOGPROBS
        {
            return Err(E::PromptLogprobs(k));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(E::EmptyStopString);
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(E::LogitBiasCount(self.logit_bias.len()));
        }
        if let Some((&token, &value)) =
            self.logit_bias.iter().find(|&(_, v)| !(-LOGIT_BIAS_RANGE..=LOGIT_BIAS_RANGE).contains(v))
        {
            return Err(E::LogitBias { token, value });
        }
        Ok(())
    }
}

/// Sampling parameters whose every field is in its domain: made only by
/// [`SamplingParams::validate`] and read-only from then on, so admission takes them as they are
/// and no layer checks them again.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidSamplingParams(SamplingParams);

impl std::ops::Deref for ValidSamplingParams {
    type Target = SamplingParams;

    fn deref(&self) -> &SamplingParams {
        &self.0
    }
}

impl ValidSamplingParams {
    /// The parameters themselves (to change them, and validate them again).
    pub fn into_inner(self) -> SamplingParams {
        self.0
    }
}

/// What a request's sampling parameters reach the engine as: ones already validated (by a
/// server, which turns a bad field into its own error first) pass as they are, plain ones are
/// validated on the way in, so every request's are checked exactly once.
pub trait IntoValidParams {
    fn into_valid(self) -> Result<ValidSamplingParams, SamplingParamsError>;
}

impl IntoValidParams for SamplingParams {
    fn into_valid(self) -> Result<ValidSamplingParams, SamplingParamsError> {
        self.validate()
    }
}

impl IntoValidParams for ValidSamplingParams {
    fn into_valid(self) -> Result<ValidSamplingParams, SamplingParamsError> {
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(p: SamplingParams) -> Result<(), SamplingParamsError> {
        p.validate().map(drop)
    }

    #[test]
    fn validated_parameters_pass_as_they_are_and_plain_ones_are_checked_on_the_way_in() {
        let valid = SamplingParams { top_k: 3, ..SamplingParams::default() }.validate().unwrap();
        assert_eq!(valid.top_k, 3);
        assert_eq!(valid.clone().into_valid(), Ok(valid.clone()));
        assert_eq!(valid.clone().into_inner().into_valid(), Ok(valid));
        let bad = SamplingParams { top_p: 0.0, ..SamplingParams::default() };
        assert_eq!(bad.into_valid(), Err(SamplingParamsError::TopP(0.0)));
    }

    #[test]
    fn defaults_are_valid_and_match_vllm() {
        let p = SamplingParams::default();
        assert_eq!(p.check(), Ok(()));
        assert_eq!((p.n, p.temperature, p.top_p, p.top_k, p.max_tokens), (1, 1.0, 1.0, -1, Some(16)));
        assert!(!p.is_greedy());
        assert!(SamplingParams::greedy(4).is_greedy());
        assert!(!p.has_penalties());
        assert_eq!(p.top_k_limit(), None);
    }

    #[test]
    fn generation_config_fills_the_defaults_and_requests_override_them() {
        let generation = model::GenerationConfig {
            temperature: Some(0.2),
            top_p: Some(0.9),
            top_k: Some(50),
            repetition_penalty: Some(1.1),
            max_new_tokens: Some(300),
            ..model::GenerationConfig::default()
        };
        let d = SamplingParams::with_generation_defaults(&generation);
        assert_eq!((d.temperature, d.top_p, d.top_k, d.min_p), (0.2, 0.9, 50, 0.0));
        assert_eq!((d.repetition_penalty, d.max_tokens, d.n), (1.1, Some(300), 1));
        assert_eq!(
            SamplingParams::with_generation_defaults(&model::GenerationConfig::default()),
            SamplingParams::default()
        );
        let p = SamplingParams::from_json_over(&d, &serde_json::json!({"temperature": 0.7, "max_tokens": 5}))
            .unwrap();
        assert_eq!((p.temperature, p.max_tokens, p.top_k, p.repetition_penalty), (0.7, Some(5), 50, 1.1));
        assert!(SamplingParams::from_json_over(&d, &serde_json::json!({"temperature": "hot"})).is_err());
        assert!(SamplingParams::from_json_over(&d, &serde_json::json!([1])).is_err());
    }

    #[test]
    fn each_bad_field_gives_its_own_error() {
        let d = SamplingParams::default;
        assert_eq!(check(SamplingParams { n: 0, ..d() }), Err(SamplingParamsError::N(0)));
        assert_eq!(check(SamplingParams { n: 1_000_000, ..d() }), Err(SamplingParamsError::N(1_000_000)));
        assert_eq!(
            check(SamplingParams { temperature: -0.1, ..d() }),
            Err(SamplingParamsError::Temperature(-0.1))
        );
        assert!(matches!(
            check(SamplingParams { temperature: f32::NAN, ..d() }),
            Err(SamplingParamsError::Temperature(_))
        ));
        assert!(matches!(
            check(SamplingParams { temperature: f32::INFINITY, ..d() }),
            Err(SamplingParamsError::Temperature(_))
        ));
        assert_eq!(check(SamplingParams { top_p: 0.0, ..d() }), Err(SamplingParamsError::TopP(0.0)));
        assert_eq!(check(SamplingParams { top_p: 1.5, ..d() }), Err(SamplingParamsError::TopP(1.5)));
        assert!(matches!(
            check(SamplingParams { top_p: f32::NAN, ..d() }),
            Err(SamplingParamsError::TopP(_))
        ));
        assert_eq!(check(SamplingParams { top_k: -2, ..d() }), Err(SamplingParamsError::TopK(-2)));
        assert_eq!(check(SamplingParams { min_p: 1.5, ..d() }), Err(SamplingParamsError::MinP(1.5)));
        assert!(matches!(
            check(SamplingParams { presence_penalty: 3.0, ..d() }),
            Err(SamplingParamsError::Penalty { name: "presence_penalty", .. })
        ));
        assert!(matches!(
            check(SamplingParams { frequency_penalty: f32::NAN, ..d() }),
            Err(SamplingParamsError::Penalty { name: "frequency_penalty", .. })
        ));
        assert_eq!(
            check(SamplingParams { repetition_penalty: 0.0, ..d() }),
            Err(SamplingParamsError::RepetitionPenalty(0.0))
        );
        assert_eq!(
            check(SamplingParams { max_tokens: Some(0), ..d() }),
            Err(SamplingParamsError::MaxTokensZero)
        );
        assert_eq!(
            check(SamplingParams { min_tokens: 20, max_tokens: Some(10), ..d() }),
            Err(SamplingParamsError::MinTokensOverMax { min: 20, max: 10 })
        );
        assert_eq!(
            check(SamplingParams { logprobs: Some(21), ..d() }),
            Err(SamplingParamsError::Logprobs(21))
        );
        assert_eq!(
            check(SamplingParams { prompt_logprobs: Some(21), ..d() }),
            Err(SamplingParamsError::PromptLogprobs(21))
        );
        assert_eq!(
            check(SamplingParams { stop: vec![String::new()], ..d() }),
            Err(SamplingParamsError::EmptyStopString)
        );
        let bias =
            |pairs: &[(u32, f32)]| SamplingParams { logit_bias: pairs.iter().copied().collect(), ..d() };
        assert_eq!(check(bias(&[(3, 100.0), (4, -100.0)])), Ok(()));
        assert_eq!(
            check(bias(&[(3, 100.5)])),
            Err(SamplingParamsError::LogitBias { token: 3, value: 100.5 })
        );
        assert!(matches!(
            check(bias(&[(9, f32::NAN)])),
            Err(SamplingParamsError::LogitBias { token: 9, .. })
        ));
        let many: Vec<(u32, f32)> = (0..=MAX_LOGIT_BIAS as u32).map(|t| (t, 1.0)).collect();
        assert_eq!(check(bias(&many)), Err(SamplingParamsError::LogitBiasCount(MAX_LOGIT_BIAS + 1)));
        assert!(
            SamplingParams::greedy(1).is_plain_greedy()
                && !SamplingParams { temperature: 0.0, ..bias(&[(1, 1.0)]) }.is_plain_greedy()
        );
    }

    #[test]
    fn boundary_values_are_accepted() {
        let d = SamplingParams::default;
        for p in [
            SamplingParams { n: MAX_N, ..d() },
            SamplingParams { temperature: 0.0, ..d() },
            SamplingParams { top_p: 1.0, ..d() },
            SamplingParams { top_p: 1e-6, ..d() },
            SamplingParams { top_k: 0, ..d() },
            SamplingParams { top_k: 1, ..d() },
            SamplingParams { min_p: 1.0, ..d() },
            SamplingParams { presence_penalty: -2.0, frequency_penalty: 2.0, ..d() },
            SamplingParams { max_tokens: None, min_tokens: 1000, ..d() },
            SamplingParams { logprobs: Some(MAX_LOGPROBS), ..d() },
            SamplingParams { prompt_logprobs: Some(0), ..d() },
            SamplingParams { prompt_logprobs: Some(MAX_LOGPROBS), ..d() },
        ] {
            assert_eq!(p.check(), Ok(()), "{p:?}");
        }
        assert_eq!(SamplingParams { top_k: 0, ..d() }.top_k_limit(), None);
        assert_eq!(SamplingParams { top_k: 5, ..d() }.top_k_limit(), Some(5));
    }

    #[test]
    fn json_uses_defaults_for_missing_fields() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"temperature": 0.5, "stop": ["\n"]}"#).unwrap_or_default();
        assert_eq!(p.temperature, 0.5);
        assert_eq!(p.stop, vec!["\n".to_owned()]);
        assert_eq!(p.max_stop_len(), 1);
        assert_eq!(p.n, 1);
    }
}
