//! Keys and values of token prefixes kept for later requests: an episode's next turn (its
//! ledger so far is a prefix of the next input), an agent's next call, a server's requests
//! that share a system prompt. Only the new tokens are then computed.
//!
//! Blocks of [`BLOCK`] positions, each addressed by a hash chain: a block's key hashes its
//! parent's key and its own tokens, so one key names the whole prefix up to the block's
//! end, and a lookup walks a prompt block by block from its start. Prefixes that part
//! (eight episodes of one prompt, each with its own completion) share their common blocks
//! and keep only what differs. Chosen over a radix tree because the chain needs no tree
//! surgery when a block is evicted (a block without its parent is never reached again and
//! ages out), and block granularity is what the copies into a row's cache work in anyway; a
//! block stores its parent key and tokens too, so a hash collision is a miss, never a wrong
//! answer. Eviction is least recently used, leaves first (a lookup stamps a chain from its
//! end to its start, so a parent is always at least as recent as its children).
//!
//! What a lookup returns is copied into the request's own cache: a block evicted while a
//! request runs changes nothing for it. The owner clears the cache when the weights change.

use crate::{Error, Result};
use candle_core::Tensor;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Positions per block.
pub const BLOCK: usize = 16;

/// The parent key of a prompt's first block.
const ROOT: u64 = 0x5157_4952_4c2d_7063; // "wirl-pc" in spirit; any constant

/// Counters of the cache since it began (shared with whoever reports them).
#[derive(Debug, Default)]
pub struct PrefixStats {
    /// Prompt positions whose keys and values came from the cache.
    pub cached_positions: AtomicU64,
    /// Prompt positions computed (a cached block recomputed to line rows up counts here).
    pub computed_positions: AtomicU64,
    /// Blocks stored, and dropped (evicted to make room, or cleared).
    pub stored_blocks: AtomicU64,
    pub evicted_blocks: AtomicU64,
}

impl PrefixStats {
    /// (cached, computed) prompt positions so far.
    pub fn positions(&self) -> (u64, u64) {
        (self.cached_positions.load(Ordering::Relaxed), self.computed_positions.load(Ordering::Relaxed))
    }

    /// Blocks held now (every cache counting into these stats together).
    pub fn held_blocks(&self) -> u64 {
        self.stored_blocks.load(Ordering::Relaxed).saturating_sub(self.evicted_blocks.load(Ordering::Relaxed))
    }

    pub(crate) fn count(&self, cached: usize, computed: usize) {
        self.cached_positions.fetch_add(cached as u64, Ordering::Relaxed);
        self.computed_positions.fetch_add(computed as u64, Ordering::Relaxed);
    }
}

struct Block {
    parent: u64,
    tokens: Vec<u32>,
    /// Every layer's keys and values of the block's positions, `[kv_heads, BLOCK, dim]`.
    layers: Vec<(Tensor, Tensor)>,
    stamp: u64,
}

/// One sequence's keys and values over some positions, per layer `[kv_heads, len, dim]`.
pub type Span = Vec<(Tensor, Tensor)>;

pub struct PrefixCache {
    blocks: HashMap<u64, Block>,
    /// (stamp, key), oldest first.
    by_age: BTreeSet<(u64, u64)>,
    clock: u64,
    capacity: usize,
    stats: Arc<PrefixStats>,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrefixCache({} of {} blocks)", self.blocks.len(), self.capacity)
    }
}

fn key(parent: u64, tokens: &[u32]) -> u64 {
    // Fixed keys: the same key on every rank of one binary.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

impl PrefixCache {
    /// A cache of at most `budget_bytes` of keys and values, at `bytes_per_position` (every
    /// layer, keys and values, the whole model's heads: ranks of a split model must make the
    /// same decisions, so they count the same blocks).
    pub fn new(budget_bytes: u64, bytes_per_position: usize, stats: Arc<PrefixStats>) -> PrefixCache {
        let block_bytes = (BLOCK * bytes_per_position.max(1)) as u64;
        PrefixCache {
            blocks: HashMap::new(),
            by_age: BTreeSet::new(),
            clock: 0,
            capacity: usize::try_from(budget_bytes / block_bytes).unwrap_or(usize::MAX),
            stats,
        }
    }

    pub fn stats(&self) -> &Arc<PrefixStats> {
        &self.stats
    }

    /// Blocks held now, and at most.
    pub fn blocks(&self) -> (usize, usize) {
        (self.blocks.len(), self.capacity)
    }

    /// Forget everything (the weights changed: no block may serve them).
    pub fn clear(&mut self) {
        self.stats.evicted_blocks.fetch_add(self.blocks.len() as u64, Ordering::Relaxed);
        self.blocks.clear();
        self.by_age.clear();
    }

    /// The keys of the blocks that cover `tokens` from its start, at most `limit` positions
    /// of it, stamped as just used. Their count × [`BLOCK`] positions are cached.
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut parent = ROOT;
        for chunk in tokens[..limit.min(tokens.len())].chunks_exact(BLOCK) {
            let k = key(parent, chunk);
            match self.blocks.get(&k) {
                Some(block) if block.parent == parent && block.tokens == chunk => keys.push(k),
                _ => break,
            }
            parent = k;
        }
        self.touch(&keys);
        keys
    }

    /// Stamp a chain as just used, its end first, so that its start is the most recent.
    fn touch(&mut self, keys: &[u64]) {
        for k in keys.iter().rev() {
            if let Some(block) = self.blocks.get_mut(k) {
                self.by_age.remove(&(block.stamp, *k));
                self.clock += 1;
                block.stamp = self.clock;
                self.by_age.insert((self.clock, *k));
            }
        }
    }

    /// The blocks `keys` (a chain from [`lookup`](Self::lookup)) as one span, per layer
    /// `[kv_heads, keys.len() × BLOCK, dim]`.
    pub fn assemble(&self, keys: &[u64]) -> Result<Span> {
        let blocks: Vec<&Block> = keys
            .iter()
            .map(|k| self.blocks.get(k).ok_or_else(|| Error::Input("a prefix block vanished before its use".into())))
            .collect::<Result<_>>()?;
        let layers = blocks.first().map_or(0, |b| b.layers.len());
        (0..layers)
            .map(|layer| {
                let ks: Vec<&Tensor> = blocks.iter().map(|b| &b.layers[layer].0).collect();
                let vs: Vec<&Tensor> = blocks.iter().map(|b| &b.layers[layer].1).collect();
                Ok((Tensor::cat(&ks, 1)?, Tensor::cat(&vs, 1)?))
            })
            .collect()
    }

    /// Keep the whole blocks of `tokens` that are not kept yet; `span(start, len)` gives the
    /// sequence's keys and values of positions `start..start + len` (it is called once, for
    /// the new blocks together). Stops, rather than evict a block of this same chain, when
    /// the cache holds nothing older.
    pub fn insert(&mut self, tokens: &[u32], span: impl FnOnce(usize, usize) -> Result<Span>) -> Result<()> {
        if self.capacity == 0 {
            return Ok(());
        }
        let known = self.lookup(tokens, tokens.len());
        let whole = tokens.len() / BLOCK;
        if known.len() == whole {
            return Ok(());
        }
        let first_new = known.len();
        let protected_from = self.clock.saturating_sub(known.len() as u64) + 1;
        let fresh = span(first_new * BLOCK, (whole - first_new) * BLOCK)?;
        let mut parent = known.last().copied().unwrap_or(ROOT);
        let mut chain = known;
        for (i, chunk) in tokens[first_new * BLOCK..whole * BLOCK].chunks_exact(BLOCK).enumerate() {
            if self.blocks.len() >= self.capacity {
                match self.by_age.first().copied() {
                    Some((stamp, oldest)) if stamp < protected_from => {
                        self.by_age.remove(&(stamp, oldest));
                        self.blocks.remove(&oldest);
                        self.stats.evicted_blocks.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
            let layers = fresh
                .iter()
                // A copy of the block alone (`copy` would clone the whole source buffer).
                .map(|(k, v)| {
                    Ok((
                        k.narrow(1, i * BLOCK, BLOCK)?.force_contiguous()?,
                        v.narrow(1, i * BLOCK, BLOCK)?.force_contiguous()?,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let k = key(parent, chunk);
            // A collision with another prefix's block: leave that one, stop here.
            if self.blocks.contains_key(&k) {
                break;
            }
            self.clock += 1;
            self.blocks.insert(k, Block { parent, tokens: chunk.to_vec(), layers, stamp: self.clock });
            self.by_age.insert((self.clock, k));
            self.stats.stored_blocks.fetch_add(1, Ordering::Relaxed);
            chain.push(k);
            parent = k;
        }
        self.touch(&chain);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A fake sequence's keys and values: position p holds the value p in every element.
    fn span(start: usize, len: usize) -> Result<Span> {
        let values: Vec<f32> = (start..start + len).flat_map(|p| [p as f32; 2]).collect();
        let t = Tensor::from_vec(values, (1, len, 2), &Device::Cpu)?;
        Ok(vec![(t.clone(), (t + 0.5)?)])
    }

    fn positions(span: &Span) -> Vec<f32> {
        span[0].0.narrow(2, 0, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn a_prefix_comes_back_as_it_went_in_and_parted_prefixes_share_blocks() {
        let mut cache = PrefixCache::new(1 << 20, 8, Arc::default());
        let a: Vec<u32> = (0..40).collect();
        cache.insert(&a, span).unwrap();
        assert_eq!(cache.blocks().0, 2, "two whole blocks of 40 tokens");
        let keys = cache.lookup(&a, a.len() - 1);
        assert_eq!(keys.len(), 2);
        assert_eq!(positions(&cache.assemble(&keys).unwrap()), (0..32).map(|p| p as f32).collect::<Vec<_>>());
        // Another sequence that parts after the first block shares it.
        let mut b = a.clone();
        b[20] = 999;
        cache.insert(&b, span).unwrap();
        assert_eq!(cache.blocks().0, 3);
        assert_eq!(cache.lookup(&b, 100).len(), 2);
        // A prompt that differs in its first block finds nothing; `limit` caps the match.
        let mut c = a.clone();
        c[0] = 7;
        assert!(cache.lookup(&c, 100).is_empty());
        assert_eq!(cache.lookup(&a, 31).len(), 1);
        assert_eq!(cache.lookup(&a[..15], 100).len(), 0, "no whole block");
    }

    #[test]
    fn the_budget_holds_and_the_least_recent_leaves_go_first() {
        // Room for 3 blocks of 16 positions at 8 bytes each.
        let mut cache = PrefixCache::new(3 * 16 * 8, 8, Arc::default());
        let a: Vec<u32> = (0..32).collect();
        let b: Vec<u32> = (100..132).collect();
        cache.insert(&a, span).unwrap();
        cache.insert(&b, span).unwrap();
        assert_eq!(cache.blocks().0, 3);
        // b's second block went in first among the evictions' candidates? a's leaf is the
        // oldest: it went, a's first block stays (a parent outlives its child).
        assert_eq!(cache.lookup(&a, 100).len(), 1);
        assert_eq!(cache.lookup(&b, 100).len(), 2);
        assert_eq!(cache.stats().evicted_blocks.load(Ordering::Relaxed), 1);
        // A flood of distinct prompts never holds more than the budget.
        for i in 0..200u32 {
            let p: Vec<u32> = (0..48).map(|t| i * 1000 + t).collect();
            cache.insert(&p, span).unwrap();
            assert!(cache.blocks().0 <= 3);
        }
        // A chain longer than the cache keeps its start.
        let long: Vec<u32> = (5000..5000 + 16 * 10).collect();
        cache.clear();
        cache.insert(&long, span).unwrap();
        assert_eq!(cache.lookup(&long, usize::MAX).len(), 3);
    }

    #[test]
    fn an_empty_budget_keeps_nothing_and_a_cleared_cache_finds_nothing() {
        let mut none = PrefixCache::new(0, 8, Arc::default());
        let a: Vec<u32> = (0..64).collect();
        none.insert(&a, span).unwrap();
        assert_eq!(none.blocks().0, 0);
        let mut cache = PrefixCache::new(1 << 20, 8, Arc::default());
        cache.insert(&a, span).unwrap();
        cache.clear();
        assert!(cache.lookup(&a, 64).is_empty());
    }
}
