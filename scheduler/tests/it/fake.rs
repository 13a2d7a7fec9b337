//! A fake model for scheduler tests: a token-slot KV store that the step's swap/copy plans and
//! slot mappings act on, a persistent block table that only the plans' deltas update (as the
//! engine's worker keeps it), and a "forward" that reads each sequence's whole context back
//! through its row of that table and samples a token that is a hash of what it read. A wrong
//! slot, a missed copy-on-write, swap or table delta, or a bad prefix hit changes the tokens (or
//! trips an assertion).

use std::collections::HashMap;

use scheduler::{
    Request, RequestKey, SampledToken, Scheduler, SchedulerConfig, SchedulerOutput, SeqFinish, SeqId,
};

/// Entries of a row of the fake worker's table (more than any test's sequence needs); entries
/// a plan never wrote hold this poison id.
const ROW_LEN: usize = 1024;
const UNWRITTEN: scheduler::BlockId = u32::MAX;

/// Token drawn for sample `k` after `context`: FNV-1a of the context and `k`, in a small vocab.
pub fn next_token(context: &[u32], k: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in context.iter().chain(std::iter::once(&k)) {
        h ^= u64::from(t);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % 50_000) as u32
}

/// What each sample of `req` must generate, computed directly (no scheduler): the prompt's
/// last logits give sample `k` its first token `next_token(prompt, k)`, then each sample
/// continues with `next_token(context, 0)`; it stops at `max_new_tokens`, at `max_model_len`,
/// or after a token `t` with `t % stop_mod == 0`.
pub fn expected_outputs(req: &Request, max_model_len: usize, stop_mod: Option<u32>) -> Vec<Vec<u32>> {
    (0..req.n as u32)
        .map(|k| {
            let mut ctx = req.prompt.clone();
            let mut out = Vec::new();
            loop {
                let t = next_token(&ctx, if out.is_empty() { k } else { 0 });
                ctx.push(t);
                out.push(t);
                let stopped = stop_mod.is_some_and(|m| t.is_multiple_of(m));
                if stopped || out.len() >= req.max_new_tokens || ctx.len() >= max_model_len {
                    break out;
                }
            }
        })
        .collect()
}

/// A scheduler driven by the fake model, checking invariants every step.
pub struct FakeEngine {
    pub sched: Scheduler,
    pub cfg: SchedulerConfig,
    kv_device: Vec<Option<u32>>,
    kv_host: Vec<Option<u32>>,
    /// The worker's persistent block tables, one per KV cache group: rows of `ROW_LEN`,
    /// written only through the deltas.
    rows: Vec<Vec<Vec<scheduler::BlockId>>>,
    pub stop_mod: Option<u32>,
    /// The last step's plan.
    pub last: SchedulerOutput,
    pub step: u64,
    /// Generated tokens per sequence.
    pub outputs: HashMap<SeqId, Vec<u32>>,
    /// How often each request was reported finished (must be once).
    pub finished: HashMap<RequestKey, usize>,
    pub reasons: HashMap<SeqId, SeqFinish>,
    pub capacity_exceeded: Vec<RequestKey>,
    pub aborted: Vec<RequestKey>,
    pub added_at: HashMap<RequestKey, u64>,
    pub first_scheduled: HashMap<RequestKey, u64>,
    /// Request ids in the order they were first given tokens.
    pub admission_order: Vec<RequestKey>,
    pub preempted: usize,
    pub copies: usize,
    pub swaps_in: usize,
    pub swaps_out: usize,
    pub max_batched: usize,
    pub max_seqs: usize,
    /// Draft tokens proposed before each step for every sequence that has generated (0: none):
    /// the first few right, the rest wrong, how many right varying from step to step.
    pub draft_k: usize,
    /// Draft tokens scored and accepted.
    pub drafted: usize,
    pub accepted: usize,
}

impl FakeEngine {
    pub fn new(cfg: SchedulerConfig) -> Self {
        let sched = Scheduler::new(cfg.clone()).expect("valid config");
        Self {
            kv_device: vec![None; cfg.num_device_blocks * cfg.block_size],
            kv_host: vec![None; cfg.num_host_blocks * cfg.block_size],
            rows: vec![Vec::new(); cfg.kv_groups.len()],
            sched,
            cfg,
            stop_mod: None,
            last: SchedulerOutput::default(),
            step: 0,
            outputs: HashMap::new(),
            finished: HashMap::new(),
            reasons: HashMap::new(),
            capacity_exceeded: Vec::new(),
            aborted: Vec::new(),
            added_at: HashMap::new(),
            first_scheduled: HashMap::new(),
            admission_order: Vec::new(),
            preempted: 0,
            copies: 0,
            swaps_in: 0,
            swaps_out: 0,
            max_batched: 0,
            max_seqs: 0,
            draft_k: 0,
            drafted: 0,
            accepted: 0,
        }
    }

    pub fn add(&mut self, req: Request) -> Result<(), scheduler::SchedulerError> {
        let id = req.key;
        self.sched.add_request(req)?;
        self.added_at.insert(id, self.step);
        Ok(())
    }

    pub fn abort(&mut self, id: RequestKey) -> Result<(), scheduler::SchedulerError> {
        self.sched.abort(id)?;
        self.aborted.push(id);
        self.check_blocks();
        Ok(())
    }

    /// One schedule → fake forward → update. Returns whether anything was scheduled.
    pub fn step(&mut self) -> bool {
        self.step += 1;
        self.propose();
        let mut out = std::mem::take(&mut self.last);
        self.sched.schedule_into(&mut out).expect("schedule");
        let bs = self.cfg.block_size;
        assert!(out.num_batched_tokens() <= self.cfg.max_num_batched_tokens, "token budget exceeded");
        assert!(out.seqs.len() <= self.cfg.max_num_seqs, "sequence cap exceeded");
        self.max_batched = self.max_batched.max(out.num_batched_tokens());
        self.max_seqs = self.max_seqs.max(out.seqs.len());
        self.preempted += out.preempted.len();
        self.capacity_exceeded.extend(&out.capacity_exceeded);
        for id in &out.capacity_exceeded {
            *self.finished.entry(*id).or_default() += 1;
        }
        // Block operations first, in the documented order.
        for &(d, h) in &out.blocks_to_swap_out {
            copy_block(&self.kv_device, d, &mut self.kv_host, h, bs);
        }
        for &(h, d) in &out.blocks_to_swap_in {
            copy_block(&self.kv_host, h, &mut self.kv_device, d, bs);
        }
        for &(src, dst) in &out.blocks_to_copy {
            let from = self.kv_device.clone();
            copy_block(&from, src, &mut self.kv_device, dst, bs);
        }
        self.swaps_out += out.blocks_to_swap_out.len();
        self.swaps_in += out.blocks_to_swap_in.len();
        self.copies += out.blocks_to_copy.len();
        self.apply_table_deltas(&out);
        // Write this step's K/V, checking what the plan says against the sequence's tokens.
        let mut seen = std::collections::HashSet::new();
        for s in &out.seqs {
            assert!(seen.insert(s.seq_id), "sequence scheduled twice in one step");
            let tokens = self.sched.seq_tokens(s.seq_id).expect("scheduled sequence exists").to_vec();
            assert_eq!(&out.token_ids[s.flat.clone()], &tokens[s.tokens.clone()]);
            let positions: Vec<u32> = (s.tokens.start as u32..s.tokens.end as u32).collect();
            assert_eq!(&out.positions[s.flat.clone()], positions.as_slice());
            for g in 0..self.cfg.kv_groups.len() {
                let table = self.table(g, s).to_vec();
                let slots =
                    if g == 0 { out.slots(s) } else { &out.group_slot_mapping[g - 1][s.flat.clone()] };
                for (i, &slot) in slots.iter().enumerate() {
                    let p = s.tokens.start + i;
                    assert_eq!(slot, i64::from(table[p / bs]) * bs as i64 + (p % bs) as i64);
                    self.kv_device[slot as usize] = Some(tokens[p]);
                }
            }
            self.first_scheduled.entry(s.seq_id.request).or_insert_with(|| {
                self.admission_order.push(s.seq_id.request);
                self.step
            });
        }
        // "Attention": read every context back through the table, then sample.
        let mut samples = Vec::new();
        for s in &out.seqs {
            if s.num_samples == 0 {
                continue;
            }
            let tokens = self.sched.seq_tokens(s.seq_id).expect("exists").to_vec();
            let context = &tokens[..s.tokens.end];
            for (g, &window) in self.cfg.kv_groups.iter().enumerate() {
                self.check_visible_context(g, window, s, context);
            }
            if s.num_draft > 0 {
                self.verify_draft(s, context, &mut samples);
                continue;
            }
            for k in 0..s.num_samples as u32 {
                let token = next_token(context, k);
                let target =
                    if s.num_samples > 1 { SeqId { request: s.seq_id.request, index: k } } else { s.seq_id };
                self.outputs.entry(target).or_default().push(token);
                let stop = self.stop_mod.is_some_and(|m| token.is_multiple_of(m));
                samples.push(SampledToken { seq_id: s.seq_id, token, stop });
            }
        }
        let scheduled = !out.seqs.is_empty();
        if scheduled {
            let result = self.sched.update(&samples).expect("update");
            for f in &result.finished_seqs {
                assert!(self.reasons.insert(f.seq_id, f.reason).is_none(), "{:?} finished twice", f.seq_id);
            }
            for id in &result.finished_requests {
                *self.finished.entry(*id).or_default() += 1;
            }
        }
        self.last = out;
        self.check_blocks();
        scheduled
    }

    /// Sets a draft on every sequence that has generated: `next_token`'s own continuation for
    /// the first `step % (draft_k + 1)` tokens, then wrong ones.
    fn propose(&mut self) {
        if self.draft_k == 0 {
            return;
        }
        let good = (self.step as usize) % (self.draft_k + 1);
        let ids: Vec<SeqId> =
            self.outputs.keys().copied().filter(|id| !self.reasons.contains_key(id)).collect();
        for id in ids {
            let Some(tokens) = self.sched.seq_tokens(id) else { continue };
            let mut ctx = tokens.to_vec();
            for i in 0..self.draft_k {
                let right = next_token(&ctx, 0);
                ctx.push(if i < good { right } else { right + 1 });
            }
            // A sequence that finished or is not decoding keeps or ignores its draft.
            let _ = self.sched.set_draft(id, &ctx[tokens.len()..]);
        }
    }

    /// The target's verdict on a drafted chunk: position `i` of its last `num_draft + 1` predicts
    /// the next token; drafted tokens are kept while they match, then the target's own token
    /// (a stop ends it there).
    fn verify_draft(
        &mut self,
        s: &scheduler::ScheduledSeq,
        context: &[u32],
        samples: &mut Vec<SampledToken>,
    ) {
        let first = s.tokens.end - s.num_draft;
        self.drafted += s.num_draft;
        for p in first..=s.tokens.end {
            let token = next_token(&context[..p], 0);
            let stop = self.stop_mod.is_some_and(|m| token.is_multiple_of(m));
            self.outputs.entry(s.seq_id).or_default().push(token);
            samples.push(SampledToken { seq_id: s.seq_id, token, stop });
            if stop || p == s.tokens.end || context[p] != token {
                break;
            }
            self.accepted += 1;
        }
    }

    /// No block held outside a live table; the pools' books balance.
    /// Applies the plan's block-table deltas to the persistent rows and checks them: every
    /// scheduled sequence's row then begins with its table (whose length covers exactly its
    /// context), no two sequences share a row, the attention metadata agrees with the sequence
    /// entries, and an append-only update sends only the blocks the step opened.
    fn apply_table_deltas(&mut self, out: &SchedulerOutput) {
        let bs = self.cfg.block_size;
        let mut rows_seen = std::collections::HashSet::new();
        assert_eq!(out.query_start_loc.first(), Some(&0));
        assert_eq!(out.seq_lens.len(), out.seqs.len());
        let mut samples = out.seqs.iter().flat_map(|s| s.flat.end - s.num_logit_rows()..s.flat.end);
        assert!(samples.by_ref().eq(out.sample_indices.iter().copied()), "sample indices");
        for (i, s) in out.seqs.iter().enumerate() {
            assert!(rows_seen.insert(s.row), "row {} given to two sequences", s.row);
            assert_eq!(
                (out.query_start_loc[i + 1], out.seq_lens[i], out.seq_rows[i]),
                (s.flat.end, s.tokens.end, s.row)
            );
            let row = s.row as usize;
            let tables = self.sched.seq_tables(s.seq_id).expect("scheduled sequence exists");
            let new = out.new_blocks(s);
            let groups = self.cfg.kv_groups.len();
            assert_eq!((tables.num_groups(), new.len() % groups), (groups, 0), "a delta per group");
            let per_group = new.len() / groups;
            for (g, table) in tables.iter().enumerate() {
                let rows = &mut self.rows[g];
                if rows.len() <= row {
                    rows.resize(row + 1, vec![UNWRITTEN; ROW_LEN]);
                }
                let new = &new[g * per_group..(g + 1) * per_group];
                rows[row][s.table_from..s.table_from + new.len()].copy_from_slice(new);
                let table = table.blocks();
                assert_eq!(table.len(), s.tokens.end.div_ceil(bs), "table covers exactly the context");
                assert_eq!(&rows[row][..table.len()], table, "{:?}: worker row behind its table", s.seq_id);
            }
            if s.table_from > 0 {
                assert!(per_group <= s.tokens.len().div_ceil(bs) + 1, "an append resent old blocks");
            }
        }
    }

    /// Reads back, through group `g`'s row, every position a query of this chunk sees (its
    /// window, or the whole context) and checks that each block read is still held.
    fn check_visible_context(
        &self,
        g: usize,
        window: Option<usize>,
        s: &scheduler::ScheduledSeq,
        context: &[u32],
    ) {
        let bs = self.cfg.block_size;
        let table = self.table(g, s);
        let from = window.map_or(0, |w| (s.tokens.start + 1).saturating_sub(w));
        for (p, &want) in context.iter().enumerate().skip(from) {
            let block = table[p / bs];
            assert!(
                self.sched.device_pool().ref_count(block).is_ok_and(|rc| rc > 0),
                "{:?}: group {g} reads block {block} (position {p}) that was freed",
                s.seq_id
            );
            let slot = block as usize * bs + p % bs;
            let got = self.kv_device[slot]
                .unwrap_or_else(|| panic!("{:?}: slot {slot} of position {p} never written", s.seq_id));
            assert_eq!(got, want, "{:?} read a corrupted KV context (group {g}, position {p})", s.seq_id);
        }
    }

    /// A scheduled sequence's table of group `g` as the worker holds it (its row, cut at its
    /// context).
    pub fn table(&self, g: usize, s: &scheduler::ScheduledSeq) -> &[scheduler::BlockId] {
        &self.rows[g][s.row as usize][..s.tokens.end.div_ceil(self.cfg.block_size)]
    }

    pub fn check_blocks(&self) {
        let device = self.sched.device_pool();
        assert_eq!(device.num_free() + device.num_used(), device.num_blocks());
        assert_eq!(device.num_used(), self.sched.num_device_blocks_held(), "device blocks leaked");
        if let Some(host) = self.sched.host_pool() {
            assert_eq!(host.num_used(), self.sched.num_host_blocks_held(), "host blocks leaked");
        }
    }

    /// Steps until nothing is left; panics past `max_steps` (a livelock).
    pub fn run_to_end(&mut self, max_steps: u64) {
        let start = self.step;
        while self.sched.has_unfinished() {
            self.step();
            assert!(self.step - start <= max_steps, "no progress after {max_steps} steps");
        }
        assert_eq!(self.sched.device_pool().num_used(), 0, "blocks held after the last request");
        assert_eq!(self.sched.num_table_rows_held(), 0, "table rows held after the last request");
        if let Some(host) = self.sched.host_pool() {
            assert_eq!(host.num_used(), 0);
        }
    }

    /// Generated tokens of each sample of request `id`, in sample order.
    pub fn outputs_of(&self, id: RequestKey, n: usize) -> Vec<Vec<u32>> {
        (0..n as u32)
            .map(|index| self.outputs.get(&SeqId { request: id, index }).cloned().unwrap_or_default())
            .collect()
    }
}

fn copy_block(from: &[Option<u32>], src: u32, to: &mut [Option<u32>], dst: u32, bs: usize) {
    let (s, d) = (src as usize * bs, dst as usize * bs);
    to[d..d + bs].copy_from_slice(&from[s..s + bs]);
}
