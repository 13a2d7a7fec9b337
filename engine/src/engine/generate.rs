//! `Engine::generate` and `Engine::embed`, the offline batches: every prompt submitted with the same parameters,
//! steps taken until all finish, each output folded into its prompt's result. Kept apart from
//! the step itself: it is a caller of `step`, as `EngineHandle`'s thread is.

use std::collections::HashMap;

use super::Engine;
use crate::error::{EngineError, RequestError};
use crate::output::FinalOutput;
use crate::pooling::PoolingParams;
use crate::request::{Prompt, RequestOptions};
use crate::sampling::SamplingParams;

impl Engine {
    /// Offline batch: submits every prompt with the same parameters (ids `"0"`, `"1"`, …) and
    /// steps until all finish. One result per prompt, in order; a rejected prompt gives its error.
    pub fn generate(
        &mut self,
        prompts: Vec<Prompt>,
        params: &SamplingParams,
    ) -> Result<Vec<Result<FinalOutput, RequestError>>, EngineError> {
        self.run_all(prompts, params, &RequestOptions::default())
    }

    /// Embeds every prompt (one pooling request each) and steps until all are done; each entry
    /// is its prompt's embedding or why it was refused.
    pub fn embed(
        &mut self,
        prompts: Vec<Prompt>,
        pooling: PoolingParams,
    ) -> Result<Vec<Result<Vec<f32>, RequestError>>, EngineError> {
        let options = RequestOptions::default().with_pooling(pooling);
        let finals = self.run_all(prompts, &SamplingParams::greedy(1), &options)?;
        let embedding = |f: FinalOutput| {
            let reason = "finished without its embedding".to_owned();
            f.embedding.ok_or(RequestError::Pooling { id: f.request_id, reason })
        };
        Ok(finals.into_iter().map(|r| r.and_then(embedding)).collect())
    }

    /// Adds every prompt (waiting for room when the queue is full) and steps until all finish.
    fn run_all(
        &mut self,
        prompts: Vec<Prompt>,
        params: &SamplingParams,
        options: &RequestOptions,
    ) -> Result<Vec<Result<FinalOutput, RequestError>>, EngineError> {
        let mut results: Vec<Result<FinalOutput, RequestError>> = Vec::with_capacity(prompts.len());
        let mut slots: HashMap<String, usize> = HashMap::new();
        for (i, prompt) in prompts.into_iter().enumerate() {
            let id = format!("generate-{}-{i}", self.intake.peek_next_key());
            loop {
                match self.add_request_with_options(
                    id.clone(),
                    prompt.clone(),
                    params.clone(),
                    options.clone(),
                ) {
                    Ok(_) => {
                        slots.insert(id.clone(), i);
                        results.push(Ok(FinalOutput::new(id, 0)));
                    }
                    // A full waiting queue (`max_waiting`) drains as the engine steps.
                    Err(RequestError::QueueFull { .. }) if !slots.is_empty() => {
                        self.collect_step(&mut slots, &mut results)?;
                        continue;
                    }
                    Err(e) => results.push(Err(e)),
                }
                break;
            }
        }
        while !slots.is_empty() {
            self.collect_step(&mut slots, &mut results)?;
        }
        Ok(results)
    }

    /// One step of `generate`: folds each output into its prompt's result.
    fn collect_step(
        &mut self,
        slots: &mut HashMap<String, usize>,
        results: &mut [Result<FinalOutput, RequestError>],
    ) -> Result<(), EngineError> {
        for out in self.step()? {
            if let Some(&i) = slots.get(&out.request_id)
                && let Some(Ok(fin)) = results.get_mut(i)
            {
                fin.prompt_tokens = out.prompt_tokens;
                fin.absorb(&out);
                if out.finished {
                    slots.remove(&out.request_id);
                }
            }
        }
        Ok(())
    }
}
