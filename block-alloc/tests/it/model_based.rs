//! Model-based property test: random runs of thousands of steps over hundreds of sequences
//! (start with prefix lookup, append, fork, free, raw allocate = evict, swap out, swap in,
//! bad input, cache reset) on a real device + host pool and on a tiny obviously-correct model
//! (plain `Vec`/`VecDeque`/`HashMap` keyed by the whole token prefix, linear searches).
//!
//! After every step: the real pools equal the model (ref counts, free-queue order, cached
//! blocks, every table), and independently of the model: `free + used == total`, each ref
//! count equals the number of holders, no block is both free and held, every table's token
//! count matches its sequence. Every prefix hit's blocks hold exactly the query's tokens.
//! At the end everything is freed and every block is free.

use std::collections::{HashMap, VecDeque};

use block_alloc::{AllocError, BlockId, BlockPool, BlockTable, CopyOnWrite, PoolConfig, TokenId};
use proptest::prelude::*;

use crate::support::snapshot;

const BS: usize = 4;
const DEVICE_BLOCKS: usize = 96;
const HOST_BLOCKS: usize = 40;
const SLOTS: usize = 200;
/// Small vocabulary, so equal blocks under different parents are common.
const VOCAB: TokenId = 3;
const DOC_LEN: usize = 48;
const NUM_DOCS: usize = 4;

// ---------------------------------------------------------------------------------------
// The model.

/// Cache key of the model: the salt and the *whole* token prefix through the block.
type Key = (u64, Vec<TokenId>);

#[derive(Debug)]
struct ModelPool {
    refs: Vec<u32>,
    free: VecDeque<BlockId>,
    caching: bool,
    cache: HashMap<Key, BlockId>,
    key_of: Vec<Option<Key>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct ModelSeq {
    blocks: Vec<BlockId>,
    num_tokens: usize,
    registered: usize,
}

impl ModelPool {
    fn new(n: usize, caching: bool) -> Self {
        Self {
            refs: vec![0; n],
            free: (0..n as BlockId).collect(),
            caching,
            cache: HashMap::new(),
            key_of: vec![None; n],
        }
    }

    fn take(&mut self) -> BlockId {
        let b = self.free.pop_front().expect("model checked free count");
        if let Some(k) = self.key_of[b as usize].take() {
            self.cache.remove(&k);
        }
        self.refs[b as usize] = 1;
        b
    }

    fn release(&mut self, b: BlockId) {
        self.refs[b as usize] -= 1;
        if self.refs[b as usize] == 0 {
            self.free.push_back(b);
        }
    }

    fn retain(&mut self, b: BlockId) {
        if self.refs[b as usize] == 0 {
            let pos = self.free.iter().position(|&x| x == b).expect("free block is queued");
            self.free.remove(pos);
        }
        self.refs[b as usize] += 1;
    }

    fn lookup(&mut self, query: &[TokenId], salt: u64) -> ModelSeq {
        let mut s = ModelSeq::default();
        if self.caching {
            for i in 0..query.len() / BS {
                let Some(&b) = self.cache.get(&(salt, query[..(i + 1) * BS].to_vec())) else { break };
                self.retain(b);
                s.blocks.push(b);
            }
        }
        s.num_tokens = s.blocks.len() * BS;
        s.registered = s.blocks.len();
        s
    }

    fn append(&mut self, s: &mut ModelSeq, n: usize) -> Option<Option<CopyOnWrite>> {
        let new_total = s.num_tokens + n;
        let new_blocks = new_total.div_ceil(BS) - s.blocks.len();
        let cow = !s.num_tokens.is_multiple_of(BS) && self.refs[*s.blocks.last()? as usize] > 1;
        if new_blocks + usize::from(cow) > self.free.len() {
            return None;
        }
        let mut result = None;
        if cow {
            let last = s.blocks.len() - 1;
            let src = s.blocks[last];
            let dst = self.take();
            self.release(src);
            s.blocks[last] = dst;
            result = Some(CopyOnWrite { src, dst });
        }
        for _ in 0..new_blocks {
            let b = self.take();
            s.blocks.push(b);
        }
        s.num_tokens = new_total;
        Some(result)
    }

    fn cache_full(&mut self, s: &mut ModelSeq, tokens: &[TokenId], salt: u64) {
        if !self.caching {
            return;
        }
        let full = s.num_tokens.min(tokens.len()) / BS;
        for i in s.registered..full {
            let key = (salt, tokens[..(i + 1) * BS].to_vec());
            let b = s.blocks[i];
            if self.key_of[b as usize].is_none() && !self.cache.contains_key(&key) {
                self.cache.insert(key.clone(), b);
                self.key_of[b as usize] = Some(key);
            }
        }
        s.registered = s.registered.max(full);
    }

    fn fork(&mut self, s: &ModelSeq) -> ModelSeq {
        for &b in &s.blocks {
            self.refs[b as usize] += 1;
        }
        s.clone()
    }

    fn free_seq(&mut self, s: &mut ModelSeq) {
        for &b in s.blocks.iter().rev() {
            self.release(b);
        }
        *s = ModelSeq::default();
    }

    fn reset(&mut self) -> bool {
        if self.free.len() != self.refs.len() {
            return false;
        }
        self.cache.clear();
        self.key_of.fill(None);
        true
    }
}

/// The model of a group swap from `src` to `dst`.
fn model_swap(
    src: &mut ModelPool,
    dst: &mut ModelPool,
    group: &mut [&mut ModelSeq],
) -> Option<Vec<(BlockId, BlockId)>> {
    let mut order: Vec<BlockId> = Vec::new();
    let mut count: HashMap<BlockId, u32> = HashMap::new();
    for s in group.iter() {
        for &b in &s.blocks {
            if !count.contains_key(&b) {
                order.push(b);
            }
            *count.entry(b).or_default() += 1;
        }
    }
    if order.len() > dst.free.len() {
        return None;
    }
    let mut map = HashMap::new();
    let mut plan = Vec::new();
    for &b in &order {
        let d = dst.take();
        dst.refs[d as usize] = count[&b];
        map.insert(b, d);
        plan.push((b, d));
    }
    for s in group.iter_mut() {
        for &b in s.blocks.iter().rev() {
            src.release(b);
        }
        for b in &mut s.blocks {
            *b = map[b];
        }
        s.registered = 0;
    }
    Some(plan)
}

// ---------------------------------------------------------------------------------------
// The run: real pools and the model side by side.

#[derive(Debug, Clone)]
enum Op {
    Start { slot: usize, doc: usize, len: usize, salt: u64, keep_last: bool },
    Append { slot: usize, n: usize, token: TokenId },
    Fork { slot: usize, dst: usize },
    Free { slot: usize },
    SwapOut { slot: usize },
    SwapIn { slot: usize },
    Evict { n: usize },
    FreeRaw { idx: usize },
    Bad { kind: u8, slot: usize },
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    prop_oneof![
        6 => (slot.clone(), 0..NUM_DOCS, 1..=DOC_LEN, 0..2u64, any::<bool>())
            .prop_map(|(slot, doc, len, salt, keep_last)| Op::Start { slot, doc, len, salt, keep_last }),
        8 => (slot.clone(), 1..=10usize, 0..VOCAB).prop_map(|(slot, n, token)| Op::Append { slot, n, token }),
        2 => (slot.clone(), 0..SLOTS).prop_map(|(slot, dst)| Op::Fork { slot, dst }),
        6 => slot.clone().prop_map(|slot| Op::Free { slot }),
        1 => slot.clone().prop_map(|slot| Op::SwapOut { slot }),
        1 => slot.clone().prop_map(|slot| Op::SwapIn { slot }),
        1 => (1..=8usize).prop_map(|n| Op::Evict { n }),
        1 => any::<usize>().prop_map(|idx| Op::FreeRaw { idx }),
        1 => (0..5u8, slot).prop_map(|(kind, slot)| Op::Bad { kind, slot }),
        1 => Just(Op::Reset),
    ]
}

#[derive(Debug)]
struct Seq {
    table: BlockTable,
    model: ModelSeq,
    tokens: Vec<TokenId>,
    salt: u64,
    on_host: bool,
}

struct Run {
    dev: BlockPool,
    host: BlockPool,
    mdev: ModelPool,
    mhost: ModelPool,
    seqs: Vec<Option<Seq>>,
    raw: Vec<BlockId>,
    docs: Vec<Vec<TokenId>>,
    hits: usize,
}

/// Deterministic documents that share prefixes with each other (doc d starts with the first
/// 8·d tokens of doc 0).
fn docs() -> Vec<Vec<TokenId>> {
    let mut state = 0x9e37_79b9_u32;
    let mut next = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 16) % VOCAB
    };
    let first: Vec<TokenId> = (0..DOC_LEN).map(|_| next()).collect();
    (0..NUM_DOCS)
        .map(|d| first[..8 * d].iter().copied().chain((8 * d..DOC_LEN).map(|_| next())).collect())
        .collect()
}

impl Run {
    fn new() -> Self {
        let dev =
            BlockPool::new(PoolConfig { watermark: 0.0, ..PoolConfig::new(DEVICE_BLOCKS, BS) }).unwrap();
        let host = BlockPool::new(PoolConfig::host(HOST_BLOCKS, BS)).unwrap();
        Self {
            dev,
            host,
            mdev: ModelPool::new(DEVICE_BLOCKS, true),
            mhost: ModelPool::new(HOST_BLOCKS, false),
            seqs: (0..SLOTS).map(|_| None).collect(),
            raw: Vec::new(),
            docs: docs(),
            hits: 0,
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Start { slot, doc, len, salt, keep_last } => self.start(slot, doc, len, salt, keep_last),
            Op::Append { slot, n, token } => self.append(slot, n, token),
            Op::Fork { slot, dst } => self.fork(slot, dst),
            Op::Free { slot } => self.free(slot),
            Op::SwapOut { slot } => self.swap(slot, false),
            Op::SwapIn { slot } => self.swap(slot, true),
            Op::Evict { n } => {
                for _ in 0..n {
                    let real = self.dev.allocate();
                    if self.mdev.free.is_empty() {
                        assert_eq!(real, Err(AllocError::OutOfBlocks { needed: 1, free: 0 }));
                        break;
                    }
                    assert_eq!(real, Ok(self.mdev.take()));
                    self.raw.push(real.unwrap());
                }
            }
            Op::FreeRaw { idx } => {
                if !self.raw.is_empty() {
                    let b = self.raw.swap_remove(idx % self.raw.len());
                    self.dev.free(b).unwrap();
                    self.mdev.release(b);
                }
            }
            Op::Bad { kind, slot } => self.bad(kind, slot),
            Op::Reset => assert_eq!(self.dev.reset_prefix_cache(), self.mdev.reset()),
        }
    }

    fn start(&mut self, slot: usize, doc: usize, len: usize, salt: u64, keep_last: bool) {
        if self.seqs[slot].is_some() {
            return;
        }
        let tokens = self.docs[doc][..len].to_vec();
        let query = if keep_last { &tokens[..len - 1] } else { &tokens[..] };
        let before = snapshot(&self.dev);
        let probe = self.dev.probe_prefix(query, salt);
        assert_eq!(snapshot(&self.dev), before, "a probe changes nothing");
        let mut table = self.dev.new_table();
        let hit = self.dev.lookup_prefix(query, salt, &mut table).unwrap();
        let mut model = self.mdev.lookup(query, salt);
        assert_eq!(probe.cached_tokens, hit);
        let free_hits = model.blocks.iter().filter(|&&b| before.is_free(b)).count();
        assert_eq!(probe.free_hit_blocks, free_hits);
        assert_eq!(table.blocks(), model.blocks, "prefix hit blocks");
        assert_eq!(hit, model.num_tokens);
        for (i, &b) in table.blocks().iter().enumerate() {
            assert_eq!(
                self.dev.cached_tokens(b),
                Some(&query[i * BS..(i + 1) * BS]),
                "hit holds the query's tokens"
            );
        }
        self.hits += table.blocks().len();
        let real = table.allocate_slots(&mut self.dev, len - hit);
        let expected = self.mdev.append(&mut model, len - hit);
        if hit == len {
            assert_eq!((&real, expected), (&Ok(None), Some(None)));
        } else {
            assert_eq!(real.as_ref().ok().copied(), expected);
        }
        if real.is_err() {
            // Out of blocks: give back the prefix, as a scheduler would.
            table.free(&mut self.dev).unwrap();
            self.mdev.free_seq(&mut model);
            return;
        }
        self.dev.cache_full_blocks(&mut table, &tokens, salt).unwrap();
        self.mdev.cache_full(&mut model, &tokens, salt);
        self.seqs[slot] = Some(Seq { table, model, tokens, salt, on_host: false });
    }

    fn append(&mut self, slot: usize, n: usize, token: TokenId) {
        let Some(seq) = self.seqs[slot].as_mut().filter(|s| !s.on_host) else { return };
        let real = seq.table.allocate_slots(&mut self.dev, n);
        let expected = self.mdev.append(&mut seq.model, n);
        assert_eq!(real.as_ref().ok().copied(), expected);
        match real {
            Ok(_) => {
                seq.tokens.extend((0..n as TokenId).map(|i| (token + i) % VOCAB));
                self.dev.cache_full_blocks(&mut seq.table, &seq.tokens, seq.salt).unwrap();
                self.mdev.cache_full(&mut seq.model, &seq.tokens, seq.salt);
            }
            Err(e) => assert!(matches!(e, AllocError::OutOfBlocks { .. }), "{e}"),
        }
    }

    fn fork(&mut self, slot: usize, dst: usize) {
        if self.seqs[dst].is_some() {
            return;
        }
        let Some(seq) = self.seqs[slot].as_ref().filter(|s| !s.on_host) else { return };
        let table = seq.table.fork(&mut self.dev).unwrap();
        let model = self.mdev.fork(&seq.model);
        let forked = Seq { table, model, tokens: seq.tokens.clone(), salt: seq.salt, on_host: false };
        self.seqs[dst] = Some(forked);
    }

    fn free(&mut self, slot: usize) {
        let Some(mut seq) = self.seqs[slot].take() else { return };
        if seq.on_host {
            seq.table.free(&mut self.host).unwrap();
            self.mhost.free_seq(&mut seq.model);
        } else {
            seq.table.free(&mut self.dev).unwrap();
            self.mdev.free_seq(&mut seq.model);
        }
    }

    /// Swaps the sequences among `slot..slot + 3` that are on the source side, as one group.
    fn swap(&mut self, slot: usize, swap_in: bool) {
        let on_source = |s: &Option<Seq>| s.as_ref().is_some_and(|s| s.on_host == swap_in);
        let picked: Vec<usize> =
            (slot..slot + 3).map(|i| i % SLOTS).filter(|&i| on_source(&self.seqs[i])).collect();
        if picked.is_empty() {
            return;
        }
        let mut group: Vec<&mut Seq> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| picked.contains(i))
            .filter_map(|(_, s)| s.as_mut())
            .collect();
        let (real, expected) = {
            let mut tables: Vec<&mut BlockTable> = Vec::new();
            let mut models: Vec<&mut ModelSeq> = Vec::new();
            for s in group.iter_mut() {
                tables.push(&mut s.table);
                models.push(&mut s.model);
            }
            if swap_in {
                let status =
                    block_alloc::can_swap_in(&self.dev, &tables.iter().map(|t| &**t).collect::<Vec<_>>());
                let real = block_alloc::swap_in(&mut self.host, &mut self.dev, &mut tables);
                assert_eq!(real.is_ok(), status == block_alloc::AllocStatus::Now);
                (real, model_swap(&mut self.mhost, &mut self.mdev, &mut models))
            } else {
                let real = block_alloc::swap_out(&mut self.dev, &mut self.host, &mut tables);
                (real, model_swap(&mut self.mdev, &mut self.mhost, &mut models))
            }
        };
        assert_eq!(real.as_ref().ok(), expected.as_ref());
        if real.is_ok() {
            for s in group {
                s.on_host = !swap_in;
                if swap_in {
                    self.dev.cache_full_blocks(&mut s.table, &s.tokens, s.salt).unwrap();
                    self.mdev.cache_full(&mut s.model, &s.tokens, s.salt);
                }
            }
        }
    }

    /// Misuse: must fail with the right error and change nothing.
    fn bad(&mut self, kind: u8, slot: usize) {
        let before = (snapshot(&self.dev), snapshot(&self.host));
        let seq = self.seqs[slot].as_mut();
        match (kind, seq) {
            (0, _) => {
                if let Some(b) = self.dev.free_blocks().next() {
                    assert_eq!(self.dev.free(b), Err(AllocError::DoubleFree(b)));
                }
            }
            (1, _) => {
                let b = (DEVICE_BLOCKS + slot) as BlockId;
                assert_eq!(self.dev.free(b), Err(AllocError::UnknownBlock(b)));
            }
            (2, Some(s)) if !s.on_host => {
                let n = (self.dev.num_free() + 2) * BS;
                assert!(matches!(
                    s.table.allocate_slots(&mut self.dev, n),
                    Err(AllocError::OutOfBlocks { .. })
                ));
            }
            (3, Some(s)) if s.on_host => {
                assert_eq!(s.table.allocate_slots(&mut self.dev, 1), Err(AllocError::WrongPool));
                assert_eq!(s.table.fork(&mut self.dev).err(), Some(AllocError::WrongPool));
            }
            (4, Some(s)) if !s.table.is_empty() => {
                let n = s.table.blocks().len();
                assert_eq!(
                    self.dev.lookup_prefix(&[0; 8], 0, &mut s.table),
                    Err(AllocError::TableNotEmpty(n))
                );
            }
            _ => {}
        }
        assert_eq!((snapshot(&self.dev), snapshot(&self.host)), before);
    }

    /// Model equality and the model-independent invariants.
    fn check(&self) {
        for (pool, model, on_host) in [(&self.dev, &self.mdev, false), (&self.host, &self.mhost, true)] {
            let n = pool.num_blocks();
            assert_eq!(pool.num_free() + pool.num_used(), n);
            let mut holders = vec![0u32; n];
            for s in self.seqs.iter().flatten().filter(|s| s.on_host == on_host) {
                for &b in s.table.blocks() {
                    holders[b as usize] += 1;
                }
            }
            if !on_host {
                for &b in &self.raw {
                    holders[b as usize] += 1;
                }
            }
            let free: Vec<BlockId> = pool.free_blocks().collect();
            assert_eq!(free.len(), pool.num_free());
            for b in 0..n as BlockId {
                assert_eq!(pool.ref_count(b), Ok(holders[b as usize]), "ref count of block {b} == holders");
                assert_eq!(pool.is_free(b), holders[b as usize] == 0);
                assert_eq!(pool.is_cached(b), model.key_of[b as usize].is_some(), "cached {b}");
            }
            assert!(free.iter().all(|&b| holders[b as usize] == 0), "no block both free and held");
            assert_eq!(free, model.free.iter().copied().collect::<Vec<_>>(), "free-queue order");
            assert_eq!(pool.num_cached_blocks(), model.cache.len());
        }
        for s in self.seqs.iter().flatten() {
            assert_eq!(s.table.blocks(), s.model.blocks);
            assert_eq!(s.table.num_tokens(), s.model.num_tokens);
            assert_eq!(s.table.num_tokens(), s.tokens.len());
        }
    }

    fn finish(mut self) {
        for slot in 0..SLOTS {
            self.free(slot);
        }
        for b in std::mem::take(&mut self.raw) {
            self.dev.free(b).unwrap();
            self.mdev.release(b);
        }
        self.check();
        assert_eq!(self.dev.num_free(), DEVICE_BLOCKS);
        assert_eq!(self.host.num_free(), HOST_BLOCKS);
        assert_eq!(self.dev.num_used() + self.host.num_used(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(ops in proptest::collection::vec(op(), 2000..3000)) {
        let mut run = Run::new();
        for op in &ops {
            run.step(op);
            run.check();
        }
        prop_assert!(run.hits > 0 || ops.len() < 100, "runs must exercise prefix hits");
        run.finish();
    }
}
