//! [`StepBuffers`]: what one engine step fills and the next reuses.

/// Buffers one step fills and the next reuses.
#[derive(Debug, Default)]
pub(super) struct StepBuffers {
    pub(super) plan: scheduler::SchedulerOutput,
    /// The plan resolved against the live requests, once, right after scheduling.
    pub(super) view: super::live::StepView,
    pub(super) result: scheduler::StepResult,
    /// The sampled rows' logits, one row per sample.
    pub(super) logits: Vec<f32>,
    /// A draft being proposed.
    pub(super) draft: Vec<u32>,
    /// Another trie's draft for the same sample (suffix decoding), the better one kept in `draft`.
    pub(super) other_draft: Vec<u32>,
    pub(super) prompt_rows: super::rows::PromptRows,
    pub(super) pool_rows: super::pool_rows::PoolRows,
    /// The rows of this step that run under LoRA adapters.
    pub(super) lora: model::LoraBatch,
    /// The gauges the last step computed (what a handle publishes after it).
    pub(super) gauges: crate::metrics::Gauges,
}
