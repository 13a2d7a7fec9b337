//! [`Guide`]: one sample's grammar state. Before its row is sampled, [`Guide::mask`] sets every
//! logit its grammar forbids to -inf (the end-of-sequence ids stay only where the grammar may
//! end); after, [`Guide::advance`] feeds it the sampled token.

use llguidance::Matcher;
use llguidance::toktrie::SimpleVob;

/// What feeding a token did to a guide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Advance {
    /// The grammar goes on.
    Continue,
    /// The grammar is complete and can take nothing more (or took the end-of-sequence token).
    Ended,
    /// The token broke the grammar (the mask should have made this impossible): the sample
    /// cannot go on.
    Broken(String),
}

/// One sample's grammar state: its matcher, and the end-of-sequence ids (what a matcher that
/// failed still allows).
pub struct Guide {
    matcher: Matcher,
    eos: SimpleVob,
    /// The mask for the next token, computed ahead (while the forward pass ran).
    prepared: Option<SimpleVob>,
}

impl std::fmt::Debug for Guide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guide").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Guide {
    pub(super) fn new(matcher: Matcher, eos: SimpleVob) -> Self {
        Self { matcher, eos, prepared: None }
    }

    /// An independent copy in the same state (another of a request's samples).
    pub(crate) fn fork(&self) -> Self {
        Self { matcher: self.matcher.deep_clone(), eos: self.eos.clone(), prepared: None }
    }

    /// Computes the mask for the next token now, so that [`Guide::mask`] only applies it.
    pub(crate) fn prepare(&mut self) {
        self.prepared = Some(self.allowed());
    }

    /// The tokens allowed next: the grammar's, or the end-of-sequence ids when it is complete
    /// or its matcher failed (the step exceeded its limits).
    fn allowed(&mut self) -> SimpleVob {
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => mask,
            Err(e) => {
                tracing::warn!(target: "engine", "guided sample ends: {e}");
                self.eos.clone()
            }
        }
    }

    /// Sets the logits of every token not allowed next to -inf. A grammar that is complete
    /// allows only the end-of-sequence ids; a matcher in error (the step exceeded its limits)
    /// allows them too, so that the sample ends instead of leaving the grammar.
    pub(crate) fn mask(&mut self, row: &mut [f32]) {
        let allowed = match self.prepared.take() {
            Some(mask) => mask,
            None => self.allowed(),
        };
        let words = allowed.as_slice();
        for (w, chunk) in row.chunks_mut(32).enumerate() {
            // Most words of a constrained step allow nothing or everything: those take no
            // per-token test.
            match words.get(w).copied().unwrap_or(0) {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                bits => {
                    for (b, v) in chunk.iter_mut().enumerate() {
                        if bits & (1 << b) == 0 {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
    }

    /// How many of `tokens` the grammar takes in turn from here, consuming none (the part of a
    /// draft worth scoring).
    pub(crate) fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        if self.matcher.is_stopped() {
            return 0;
        }
        self.matcher.validate_tokens(tokens).unwrap_or(0)
    }

    /// Feeds the sampled token.
    pub(crate) fn advance(&mut self, token: u32) -> Advance {
        self.prepared = None;
        if self.matcher.is_stopped() {
            return Advance::Ended;
        }
        match self.matcher.consume_token(token) {
            Ok(()) if self.matcher.is_stopped() => Advance::Ended,
            Ok(()) => Advance::Continue,
            Err(e) => Advance::Broken(e.to_string()),
        }
    }
}

/// Feeds `token` to a sample's guide (if it has one); the finish it calls for when its grammar
/// can go no further.
pub(crate) fn advance(guide: Option<&mut Guide>, token: u32) -> Option<crate::output::FinishReason> {
    match guide?.advance(token) {
        Advance::Continue => None,
        Advance::Ended => Some(crate::output::FinishReason::GrammarEnd),
        Advance::Broken(e) => {
            tracing::warn!(target: "engine", "guided sample ends: token {token} broke its grammar: {e}");
            Some(crate::output::FinishReason::GrammarEnd)
        }
    }
}
