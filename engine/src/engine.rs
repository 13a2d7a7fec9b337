//! `Engine`: owns the model, the KV cache, the scheduler, the tokenizer and the samplers,
//! and runs one step at a time (schedule → block copies/swaps → forward → sample → update →
//! outputs). Single-threaded by design; `EngineHandle` puts it on its own thread.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use model::load_progress::{self, OnLoad};
use model::{Model, ModelFolder, Runner, RunnerConfig, StepInput};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use scheduler::{RequestKey, Scheduler, SchedulerConfig};

use crate::config::{EngineConfig, PreemptionMode};
use crate::error::{EngineError, RequestError};
use crate::lora::LoraRegistry;
use crate::metrics::{Gauges, LiveMetrics, MetricsCollector, MetricsSnapshot, StepPhases};
use crate::output::{FinishReason, RequestOutput, StreamError};
use crate::request::{Prompt, RequestOptions, RequestRecord, SeqState};
use crate::sampling::{IntoValidParams, SampleRow, SamplingParams, TokenChoice, sample_batch};

mod admission;
mod apply;
mod buffers;
mod events;
mod generate;
mod greedy;
mod guides;
mod live;
mod pool_rows;
mod rows;
mod verify;

pub(crate) use admission::{Intake, IntakeLimits, Prepared};
use buffers::StepBuffers;
use live::{Live, SampleMut};

/// The serving engine (one model, one KV cache, continuous batching).
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    /// The model, the KV cache and the block table on their device (CPU or CUDA).
    runner: Runner,
    scheduler: Scheduler,
    /// Admission's shared half (model text side, limits, live ids), also held by handles.
    intake: Arc<Intake>,
    /// The admitted, unfinished requests, one record each (state, samplers, output sink), keyed
    /// as the scheduler keys them; client id strings are looked up only in `intake`, at the API edge.
    live: Live,
    seed_rng: ChaCha8Rng,
    metrics: MetricsCollector,
    bufs: StepBuffers,
    /// Outputs produced outside `step` (aborts), returned by the next `step`.
    pending: Vec<RequestOutput>,
    /// What a draft's verification costs (speculative decoding's cost rule).
    draft_cost: verify::VerifyCost,
    /// The draft model, with its own KV cache (speculative decoding's `draft_model`).
    drafter: Option<crate::spec::draft::Drafter>,
    /// Recent requests' outputs (suffix decoding).
    suffix_cache: Option<crate::spec::suffix::SuffixCache>,
    kv_events: Option<events::KvEvents>,
}

impl Engine {
    /// Loads an HF model folder or a GGUF file (config, weights, tokenizer, chat template) and
    /// sizes the cache.
    pub fn new(model_dir: &Path, config: EngineConfig) -> Result<Self, EngineError> {
        Self::new_reporting(model_dir, config, &mut load_progress::unwatched)
    }

    /// [`Self::new`], reporting the model's load to `on` (the checkpoint's bytes, then its tensors).
    pub fn new_reporting(dir: &Path, config: EngineConfig, on: OnLoad<'_>) -> Result<Self, EngineError> {
        let (folder, mut model) = ModelFolder::open_with_weights_reporting(dir, on)?;
        if let Some(q) = config.quantization {
            model.quantize_weights(q.ggml_type())?;
        }
        Self::from_parts(folder, model, config)
    }

    /// Builds the engine from an opened folder and its loaded weights.
    pub fn from_parts(
        mut folder: ModelFolder,
        mut model: Model,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        if let Some(path) = &config.chat_template {
            folder.override_chat_template(path)?;
        }
        model.activations = config.decode_activations;
        let max_model_len = config.served_context(&model.config)?;
        // Rotations that depend on the served context (LongRoPE) are chosen for it.
        model.set_context(max_model_len);
        if let Some(lora) = &config.lora {
            lora.check().map_err(EngineError::Config)?;
        }
        if config.max_waiting == 0 {
            return Err(EngineError::Config("max_waiting must be at least 1".into()));
        }
        let (draft, kv_cache) =
            verify::open_draft(&config, (&model.config, &folder.tokenizer), max_model_len)?;
        // The cache's size can depend on the device (CUDA profiles a forward first).
        let mut runner = Runner::new(
            model,
            &RunnerConfig {
                device: config.device,
                kv_cache,
                kv_dtype: config.kv_dtype,
                block_size: config.block_size,
                max_model_len,
                swap_bytes: match config.preemption_mode {
                    PreemptionMode::Swap => config.swap_space_bytes,
                    PreemptionMode::Recompute => 0,
                },
                max_num_batched_tokens: config.max_num_batched_tokens,
                max_num_seqs: config.max_num_seqs,
                gpu_memory_utilization: config.gpu_memory_utilization,
            },
        )?;
        let (drafter, draft_cost) = verify::drafter_and_cost(&config, draft, &mut runner, max_model_len)?;
        let suffix_cache = verify::suffix_cache(&config);
        let cache_cfg = *runner.cache_config();
        let mut scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            max_model_len,
            policy: config.policy,
            preemption: config.preemption_mode,
            block_size: config.block_size,
            num_device_blocks: cache_cfg.num_blocks,
            num_host_blocks: cache_cfg.num_swap_blocks,
            watermark: config.watermark,
            enable_prefix_caching: config.enable_prefix_caching,
            kv_groups: runner.kv_group_windows().to_vec(),
            max_loras: config.lora.map(|l| l.max_loras),
        })?;
        let (caching, block_size) = (config.enable_prefix_caching, config.block_size);
        let kv_events =
            events::KvEvents::start(config.kv_events.as_ref(), caching, block_size, &mut scheduler)?;
        // A folder's name, or a GGUF file's without the extension.
        let model_name = config.served_model_name.clone().unwrap_or_else(|| {
            let path = if folder.dir.is_file() { folder.dir.with_extension("") } else { folder.dir.clone() };
            path.file_name().map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
        });
        tracing::info!(
            target: "engine",
            "KV cache: {} blocks of {} tokens ({:.1} MiB), {} swap blocks; max_model_len {max_model_len}",
            cache_cfg.num_blocks,
            cache_cfg.block_size,
            cache_cfg.device_bytes() as f64 / (1 << 20) as f64,
            cache_cfg.num_swap_blocks,
        );
        let lora = LoraRegistry::new(
            config.lora,
            config.device.is_cpu(),
            runner.model_config().clone(),
            model_name.clone(),
        );
        let limits = IntakeLimits {
            model_name,
            max_model_len,
            vocab_size: runner.model_config().vocab_size,
            hidden_size: runner.model_config().hidden_size,
            pools: config.device.is_cpu(),
            fit: scheduler.request_fit(),
            max_waiting: config.max_waiting,
            policy: config.policy,
            lora,
        };
        Ok(Self {
            metrics: MetricsCollector::new(config.log_interval),
            seed_rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            runner,
            intake: Arc::new(Intake::new(folder, limits)),
            scheduler,
            live: Live::default(),
            bufs: StepBuffers::default(),
            pending: Vec::new(),
            draft_cost,
            drafter,
            suffix_cache,
            kv_events,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn max_model_len(&self) -> usize {
        self.intake.max_model_len
    }

    pub fn tokenizer(&self) -> &model::Tokenizer {
        &self.intake.tokenizer
    }

    pub fn model_config(&self) -> &model::ModelConfig {
        self.runner.model_config()
    }

    /// The name clients use for the model (`served_model_name`, else the folder's name).
    pub fn model_name(&self) -> &str {
        &self.intake.model_name
    }

    /// Unset sampling fields' values: [`SamplingParams::with_generation_defaults`].
    pub fn default_sampling_params(&self) -> &SamplingParams {
        &self.intake.default_params
    }

    /// The end-of-sequence ids from the generation config.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.intake.eos_ids
    }

    /// Bytes of weights a decode step reads (every matrix once, in its stored format).
    pub fn weight_bytes_per_step(&self) -> usize {
        self.runner.weight_bytes_per_step()
    }

    /// Device KV blocks in the pool.
    pub fn num_kv_blocks(&self) -> usize {
        self.scheduler.device_pool().num_blocks()
    }

    /// Device KV blocks currently in use.
    pub fn num_kv_blocks_used(&self) -> usize {
        self.scheduler.device_pool().num_used()
    }

    /// No device or host block held (all finished or aborted, nothing leaked), in both pools.
    pub fn kv_is_idle(&self) -> bool {
        let idle = |p: &scheduler::BlockPool| p.num_used() == 0 && p.num_free() == p.num_blocks();
        idle(self.scheduler.device_pool()) && self.scheduler.host_pool().is_none_or(idle)
    }

    /// Renders chat messages with the model's template (generation prompt added).
    pub fn render_chat(&self, id: &str, messages: &[model::ChatMessage]) -> Result<String, RequestError> {
        self.intake.render_chat(id, messages)
    }

    /// Prompt to token ids: text with the tokenizer's special tokens (BOS) added, chat rendered
    /// by the template (which writes its own special tokens), ids as given.
    pub fn tokenize(&self, id: &str, prompt: Prompt) -> Result<Vec<u32>, RequestError> {
        self.intake.tokenize(id, prompt)
    }

    /// Admits a request, or rejects it with a typed error (nothing is stored then). The key
    /// tells this admission's outputs apart from those of an earlier request with the same id.
    pub fn add_request(
        &mut self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: impl IntoValidParams,
    ) -> Result<RequestKey, RequestError> {
        self.add_request_with_options(id, prompt, params, RequestOptions::default())
    }

    /// [`Engine::add_request`] with a priority and a prefix-cache salt.
    pub fn add_request_with_options(
        &mut self,
        id: impl Into<String>,
        prompt: impl Into<Prompt>,
        params: impl IntoValidParams,
        options: RequestOptions,
    ) -> Result<RequestKey, RequestError> {
        match self.intake.prepare(id.into(), prompt.into(), params, options) {
            Ok(prepared) => self.insert(prepared, None),
            Err(e) => {
                self.metrics.record_rejected();
                Err(e)
            }
        }
    }

    /// The scheduler (read-only: snapshots and figures).
    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The client id of the live request `key`.
    pub(crate) fn request_id_of(&self, key: RequestKey) -> Option<&str> {
        self.live.get(&key).map(|r| r.id.as_str())
    }

    /// The LoRA adapters requests may name (load, unload, list).
    pub fn loras(&self) -> &crate::LoraRegistry {
        &self.intake.lora
    }

    /// Admission's shared half, for handles.
    pub(crate) fn intake(&self) -> &Arc<Intake> {
        &self.intake
    }

    /// Counts a request that was refused before it reached the engine (by a handle).
    pub(crate) fn record_rejected(&mut self) {
        self.metrics.record_rejected();
    }

    /// Aborts an unfinished request: its blocks are freed now and its final output (finish
    /// reason `Abort`) comes with the next `step`. An unknown id is a reported no-op.
    pub fn abort(&mut self, id: &str) -> Result<(), RequestError> {
        let key = self.intake.key_of(id).ok_or_else(|| RequestError::UnknownRequest(id.to_owned()))?;
        self.abort_key(key).map_err(|_| RequestError::UnknownRequest(id.to_owned()))
    }

    /// [`Engine::abort`] by key: aborts exactly the admission `key` names, never a later
    /// request that reuses its id. A finished (or already aborted) key is a reported no-op.
    /// A request with a stream gets its final output there at once; one without, with the
    /// next `step`.
    pub fn abort_key(&mut self, key: RequestKey) -> Result<(), RequestError> {
        let Some(mut record) = self.live.remove(&key) else {
            return Err(RequestError::UnknownRequest(key.to_string()));
        };
        self.retire(&record);
        if let Err(e) = self.scheduler.abort(key) {
            tracing::warn!(target: "engine", "abort of {:?}: scheduler says {e}", record.id);
        }
        record.finish_all(&FinishReason::Abort);
        if let Some(output) = record.take_output(Instant::now(), &self.intake.tokenizer) {
            record.deliver(output, &mut self.pending);
        }
        self.metrics.record_aborted();
        Ok(())
    }

    /// Aborts every unfinished request.
    pub(crate) fn abort_all(&mut self) {
        let keys: Vec<RequestKey> = self.live.keys().collect();
        for key in keys {
            let _ = self.abort_key(key);
        }
    }

    /// After a failed step: every stream gets `error` as its last item, and every request is
    /// aborted (their abort outputs are dropped: the streams already ended).
    pub(crate) fn fail_all(&mut self, error: &StreamError) {
        for record in self.live.values_mut() {
            if let Some(sink) = record.sink.take() {
                sink.send(Err(error.clone()));
            }
        }
        self.abort_all();
        self.pending.clear();
    }

    /// Gives a request's id and (if it never ran) its waiting place back.
    fn retire(&self, record: &RequestRecord) {
        self.intake.forget(&record.id, record.key);
        if !record.scheduled {
            self.intake.leave_waiting();
        }
    }

    /// Ids of the requests not yet finished or aborted.
    pub fn unfinished_ids(&self) -> Vec<String> {
        self.intake.unfinished_ids()
    }

    /// Requests not yet finished or aborted.
    pub fn num_unfinished(&self) -> usize {
        self.live.len()
    }

    /// Whether `step` has work (including abort outputs not yet returned).
    pub fn has_unfinished(&self) -> bool {
        !self.live.is_empty() || !self.pending.is_empty()
    }

    fn gauges(&self) -> Gauges {
        let pool = self.scheduler.device_pool();
        let prefix = pool.prefix_stats();
        let slots = pool.num_used() * pool.block_size();
        Gauges {
            kv_usage: pool.usage(),
            kv_token_util: if slots == 0 {
                0.0
            } else {
                self.scheduler.kv_tokens_held() as f64 / slots as f64
            },
            num_running: self.scheduler.num_running(),
            num_waiting: self.scheduler.num_waiting(),
            num_swapped: self.scheduler.num_swapped(),
            num_preemptions: self.scheduler.stats().preemptions(),
            prefix_queries: prefix.queried_tokens,
            prefix_hits: prefix.hit_tokens,
        }
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot(self.gauges())
    }

    /// Gauges and token counters only (what is published after every step).
    pub fn live_metrics(&self) -> LiveMetrics {
        self.metrics.live(self.gauges())
    }

    /// [`Engine::live_metrics`] as of the end of the last step, from the gauges that step
    /// already computed (no second walk over the running sequences).
    pub(crate) fn live_metrics_of_last_step(&self) -> LiveMetrics {
        self.metrics.live(self.bufs.gauges)
    }

    /// The live metrics with the gauges read now: what to publish when commands changed the
    /// books without a step (aborts that finished every request leave no step to run).
    pub(crate) fn live_metrics_now(&mut self) -> LiveMetrics {
        self.bufs.gauges = self.gauges();
        self.metrics.live(self.bufs.gauges)
    }

    /// Clears throughput counters and latency samples (e.g. after a warm-up).
    pub fn reset_metrics(&mut self) {
        self.metrics.reset();
    }

    /// Runs one engine step and returns every request's news.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let mut outputs = std::mem::take(&mut self.pending);
        let started = Instant::now();
        self.scheduler.schedule_into(&mut self.bufs.plan)?;
        let now = Instant::now();
        let mut phases = StepPhases { schedule_s: (now - started).as_secs_f64(), ..StepPhases::default() };
        // Sequences that outgrew the whole pool: finished by the scheduler, "length" to the client.
        for i in 0..self.bufs.plan.capacity_exceeded.len() {
            let key = self.bufs.plan.capacity_exceeded[i];
            if let Some(record) = self.live.get_mut(&key) {
                record.finish_all(&FinishReason::Length);
            }
            self.finalize(key, now, &mut outputs);
        }
        self.bufs.view.build(&self.bufs.plan, &self.live)?;
        self.mark_first_scheduled(now);
        if self.bufs.plan.is_empty() {
            self.bufs.gauges = self.gauges();
            self.metrics.step_done(0, 0, &self.bufs.gauges);
            self.publish_kv_events();
            return Ok(outputs);
        }
        let generated = self.run_step(&mut phases)?;
        let now = Instant::now();
        let mut touched: Vec<RequestKey> = self.bufs.view.rows.iter().map(|r| r.seq_id.request).collect();
        touched.extend(self.bufs.result.finished_requests.iter().copied());
        touched.sort_unstable();
        touched.dedup();
        let mut unheard = Vec::new();
        for key in touched {
            if !self.finalize(key, now, &mut outputs) {
                unheard.push(key);
            }
        }
        // Nobody listens any more: stop spending compute on them (after the step's books closed).
        for key in unheard {
            let _ = self.abort_key(key);
        }
        self.bufs.gauges = self.gauges();
        let prefilled = self.bufs.plan.num_prefill_tokens();
        if prefilled == 0 {
            phases.update_s += now.elapsed().as_secs_f64();
            phases.context_tokens = self.bufs.plan.seq_lens.iter().map(|&n| n as u64).sum();
            self.metrics.decode_step(phases);
        }
        self.metrics.step_done(prefilled, generated, &self.bufs.gauges);
        self.publish_kv_events();
        Ok(outputs)
    }

    /// The planned step, phase by phase: block moves and block-table deltas, forward,
    /// sampling, stop detection and detokenization, scheduler update. Returns the number of
    /// tokens generated; adds each phase's time to `phases`.
    fn run_step(&mut self, phases: &mut StepPhases) -> Result<usize, EngineError> {
        let mut clock = Instant::now();
        let mut lap = || {
            let now = Instant::now();
            (now - std::mem::replace(&mut clock, now)).as_secs_f64()
        };
        let plan = &self.bufs.plan;
        self.runner.move_blocks(&plan.blocks_to_swap_out, &plan.blocks_to_swap_in, &plan.blocks_to_copy)?;
        for s in &plan.seqs {
            self.runner.write_table_row(s.row, s.table_from, plan.new_blocks(s))?;
        }
        let vocab = self.runner.model_config().vocab_size;
        let view = &self.bufs.view;
        self.bufs.prompt_rows.plan(plan, view, &self.live);
        self.bufs.pool_rows.plan(plan, view, &self.live);
        if self.intake.lora.config().is_some() {
            view.lora_rows(plan, &self.live, &mut self.bufs.lora);
        }
        let step = StepInput {
            token_ids: &plan.token_ids,
            positions: &plan.positions,
            slot_mapping: &plan.slot_mapping,
            group_slot_mapping: &plan.group_slot_mapping,
            query_start_loc: &plan.query_start_loc,
            seq_lens: &plan.seq_lens,
            seq_rows: &plan.seq_rows,
            sample_indices: self.bufs.prompt_rows.indices(plan),
            pool_indices: self.bufs.pool_rows.indices(),
            lora: (!self.bufs.lora.is_empty()).then_some(&self.bufs.lora),
        };
        phases.prepare_s += lap();
        let (first, more) = if !self.bufs.prompt_rows.any()
            && !self.bufs.pool_rows.any()
            && greedy::plain_greedy_step(plan, view, &self.live)
        {
            let tokens = self.runner.forward_greedy(&step, crate::sampling::filter::argmax)?;
            phases.forward_s += lap();
            let drawn = verify::greedy_drafted(&view.rows, &plan.token_ids, tokens)?;
            greedy::record(drawn, &mut self.live.samples_mut(&view.rows)?)?
        } else {
            let mut samples = self.live.samples_mut(&view.rows)?;
            let guides = guides::sampled_guides(&mut samples);
            let times = self.metrics.mask_times();
            let runner = &mut self.runner;
            let logits = crate::structured::while_running(guides, times, || runner.forward(&step))?;
            phases.forward_s += lap();
            let (logits, prompt_logits) = logits
                .split_at_checked(plan.sample_indices.len() * vocab)
                .ok_or(EngineError::Internal("fewer logits than sampled rows"))?;
            self.bufs.prompt_rows.record(prompt_logits, vocab, &mut self.live)?;
            rows::gather_logit_rows(view.rows.iter(), 0, logits, vocab, &mut self.bufs.logits)?;
            let mut samples = self.live.samples_mut(&view.rows)?;
            let first = sample(&mut self.bufs.logits, vocab, &mut samples)?;
            let more = if plan.seqs.iter().any(|s| s.num_draft > 0) {
                let scratch = &mut self.bufs.logits;
                verify::sample_drafted(
                    &view.rows,
                    &plan.token_ids,
                    &first,
                    &mut samples,
                    logits,
                    vocab,
                    scratch,
                )?
            } else {
                Vec::new()
            };
            (first, more)
        };
        // The step's hold on its adapters ends with its forward (an idle adapter can be unloaded).
        self.bufs.lora.clear();
        if self.bufs.pool_rows.any() {
            let hidden = self.runner.model_config().hidden_size;
            let rows = self.bufs.pool_rows.indices().len();
            self.bufs.pool_rows.record(self.runner.pooled(rows), hidden, &mut self.live)?;
        }
        phases.sample_s += lap();
        // Each further draw of a drafted row follows one accepted draft token.
        for (r, more) in view.rows.iter().zip(&more).filter(|(r, _)| !r.draft.is_empty()) {
            let accepted = more.len().min(r.draft.len());
            self.metrics.record_draft(r.draft.len(), accepted);
            if let Some(seq) = self.live.at_mut(r.slot).and_then(|rec| rec.seqs.get_mut(r.index)) {
                seq.gate.record(r.draft.len(), accepted);
            }
        }
        let updates = self.apply_samples(first, more)?;
        self.update_scheduler(&updates)?;
        self.propose_drafts(phases.forward_s)?;
        phases.update_s += lap();
        Ok(updates.len())
    }

    /// Emits the request's news; drops its record once every sample has finished. False when
    /// the request is unfinished and its stream's receiver is gone.
    fn finalize(&mut self, key: RequestKey, now: Instant, outputs: &mut Vec<RequestOutput>) -> bool {
        let Some(record) = self.live.get_mut(&key) else { return true };
        let output = record.take_output(now, &self.intake.tokenizer);
        if !record.all_finished() {
            return output.is_none_or(|output| record.deliver(output, outputs));
        }
        let Some(mut record) = self.live.remove(&key) else { return true };
        self.cache_outputs(&mut record);
        // Retired before its last output is sent: a client that reads it may reuse the id at once.
        self.retire(&record);
        let ttft = record.first_token.map(|t| t.duration_since(record.arrival));
        let longest = record.seqs.iter().map(SeqState::num_generated).max().unwrap_or(0);
        self.metrics.record_finished(ttft, now.duration_since(record.arrival), longest);
        if let Some(output) = output {
            record.deliver(output, outputs);
        }
        true
    }
}

/// Samples one token per row (each request's own parameters, each sample's RNG and grammar),
/// over the samples borrowed in place.
fn sample(
    logits: &mut [f32],
    vocab: usize,
    samples: &mut [SampleMut<'_>],
) -> Result<Vec<TokenChoice>, EngineError> {
    let mut rows: Vec<SampleRow<'_>> = samples
        .iter_mut()
        .map(|s| SampleRow { params: s.params, state: &mut s.seq.sampler, guide: s.seq.guide.as_mut() })
        .collect();
    Ok(sample_batch(logits, vocab, &mut rows)?)
}
