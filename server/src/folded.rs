//! One request's outputs folded as they arrive into its text, its finish and its usage: what
//! the endpoints that answer a single sample (`/v1/responses`, `/v1/messages`) build from.

use engine::{FinishReason, OutputStream, RequestOutput};
use futures_util::StreamExt;

use crate::error::ApiError;
use crate::metrics::{Api, Metrics};
use crate::respond::Usage;

#[derive(Debug, Default)]
pub struct Folded {
    pub text: String,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
}

impl Folded {
    /// Every output of `output` folded, for a whole (unstreamed) answer; a request that failed
    /// in the engine is its error.
    pub async fn whole(metrics: &Metrics, api: Api, mut output: OutputStream) -> Result<Self, ApiError> {
        let mut folded = Self::default();
        while let Some(item) = output.next().await {
            folded.absorb(metrics, api, &item.map_err(crate::generate::stream_error)?);
        }
        Ok(folded)
    }

    /// Folds one output of a request `api` served in (and into the metrics); returns its new
    /// text.
    pub fn absorb(&mut self, metrics: &Metrics, api: Api, out: &RequestOutput) -> String {
        let mut new = String::new();
        for d in &out.outputs {
            new.push_str(&d.text);
            if let Some(f) = &d.finish_reason {
                self.finish = Some(f.clone());
            }
        }
        self.text.push_str(&new);
        metrics.observe(out, api);
        if out.finished {
            self.usage.add_final(out, true);
        }
        new
    }

    /// The finish as OpenAI spells it (`stop`, `length`, `abort`).
    pub fn finish_str(&self) -> Option<&'static str> {
        self.finish.as_ref().map(FinishReason::as_str)
    }
}
