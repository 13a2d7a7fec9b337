//! What a caller hands the scheduler (`Request`) and the plain ids and reasons it hands back.

/// A token id: `block-alloc`'s own (the one type it hashes for prefix caching), re-exported.
pub use block_alloc::TokenId;

/// The one number a request is known by, from the engine's admission to the scheduler and
/// back to the request's output stream: issued once per admission by the caller's single
/// counter, so it never names two requests, even when a client reuses an id string at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey(pub u64);

impl From<u64> for RequestKey {
    fn from(key: u64) -> Self {
        Self(key)
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One sequence of a request: `index` is the sample number in `0..n` (0 before the fork).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId {
    pub request: RequestKey,
    pub index: u32,
}

/// A generation request as the scheduler sees it: token ids and limits, no sampling parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub key: RequestKey,
    pub prompt: Vec<TokenId>,
    /// Most tokens each sequence generates (stop tokens are the engine's business: it reports
    /// them through `SampledToken::stop`).
    pub max_new_tokens: usize,
    /// Lower runs first under `Policy::Priority`; ignored under FCFS.
    pub priority: i64,
    /// Separates prefix-cache namespaces (e.g. per tenant); `None` shares the default one.
    pub salt: Option<u64>,
    /// Parallel samples; the prompt is prefilled once and its blocks are shared by all `n`.
    pub n: usize,
    /// Computes every prompt position even when the prefix cache holds some of them (a request
    /// that wants each prompt position's logits: cached positions have none). Its full blocks
    /// are still offered to the cache for others.
    pub skip_prefix_hits: bool,
    /// The LoRA adapter it runs under (vLLM's `lora_int_id`), counted against `max_loras`.
    /// Its prefix-cache namespace is the engine's business (it salts the hash).
    pub lora: Option<u32>,
}

impl Request {
    pub fn new(key: impl Into<RequestKey>, prompt: Vec<TokenId>, max_new_tokens: usize) -> Self {
        Self {
            key: key.into(),
            prompt,
            max_new_tokens,
            priority: 0,
            salt: None,
            n: 1,
            skip_prefix_hits: false,
            lora: None,
        }
    }

    pub fn with_priority(mut self, priority: i64) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_salt(mut self, salt: u64) -> Self {
        self.salt = Some(salt);
        self
    }

    pub fn with_n(mut self, n: usize) -> Self {
        self.n = n;
        self
    }

    pub fn with_lora(mut self, lora: u32) -> Self {
        self.lora = Some(lora);
        self
    }

    /// See [`Request::skip_prefix_hits`].
    pub fn with_skip_prefix_hits(mut self, skip: bool) -> Self {
        self.skip_prefix_hits = skip;
        self
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeqFinish {
    /// The engine flagged a stop (stop token or string).
    Stopped,
    /// `max_new_tokens` generated, or `max_model_len` reached.
    Length,
    /// `Scheduler::abort`.
    Aborted,
    /// The sequence outgrew the whole device pool: it could never get its next block.
    CapacityExceeded,
}
