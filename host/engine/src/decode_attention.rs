//! Attention for one new token per row on the CPU, against the KV cache in place.
//!
//! A decoding step's attention is little arithmetic (one query per head against the row's
//! cached keys) spread over many small candle ops per layer: rope (eight ops per tensor),
//! copies into head-major layout, two batched gemm calls that pack their operands, a scale,
//! a mask, a softmax and a transpose back. Here it is two in-place writes ([`StoreToken`]:
//! the new key, rotated, and the new value into the cache buffers) and one op
//! ([`DecodeAttention`]) that rotates the queries and attends, reading each cached key and
//! value once for all the query heads that share it.

use crate::Result;
use crate::decode_matmul::f32_contiguous;
use candle_core::{CpuStorage, CustomOp3, InplaceOp2, Layout, Shape, Tensor, bail};
use rayon::prelude::*;

/// cos and sin of every position's rotary angles as host floats, `[positions, half]`.
#[derive(Debug)]
pub(crate) struct RopeTables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeTables {
    /// From the model's `[positions, half]` tables (f32, on the CPU).
    pub fn from_tensors(cos: &Tensor, sin: &Tensor) -> Result<Self> {
        let half = cos.dim(1)?;
        Ok(RopeTables { cos: cos.flatten_all()?.to_vec1()?, sin: sin.flatten_all()?.to_vec1()?, half })
    }

    /// Whether heads of `dim` values are rotated whole by these tables.
    pub fn fits(&self, dim: usize) -> bool {
        2 * self.half == dim
    }

    fn positions(&self) -> usize {
        self.cos.len() / self.half
    }

    /// HF's rotate-half rope of one head `x` at `position`, into `out`:
    /// `out = x · cos + rotate_half(x) · sin`.
    #[inline(always)]
    fn rotate(&self, x: &[f32], position: usize, out: &mut [f32]) {
        let h = self.half;
        let cos = &self.cos[position * h..][..h];
        let sin = &self.sin[position * h..][..h];
        let (x1, x2) = x.split_at(h);
        let (out1, out2) = out.split_at_mut(h);
        for i in 0..h {
            out1[i] = x1[i] * cos[i] - x2[i] * sin[i];
            out2[i] = x2[i] * cos[i] + x1[i] * sin[i];
        }
    }
}

/// Write the new token's keys or values, `[batch, 1, heads · dim]`, at position `at` of a
/// cache buffer `[slots, heads, capacity, dim]`, row `b` into slot `slots[b]` (a batch's
/// rows keep their slots while others leave: nothing is copied); keys rotated for each
/// row's position.
pub(crate) struct StoreToken<'a> {
    pub at: usize,
    /// Each row's slot of the buffer (distinct).
    pub slots: &'a [usize],
    /// The rope tables and each row's position, for keys; `None` for values.
    pub rope: Option<(&'a RopeTables, &'a [usize])>,
}

impl InplaceOp2 for StoreToken<'_> {
    fn name(&self) -> &'static str {
        "store-token"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        let new = f32_contiguous(s2, l2, self.name())?;
        let (slots, heads, capacity, dim) = l1.shape().dims4()?;
        let (CpuStorage::F32(buffer), Some((start, end))) = (s1, l1.contiguous_offsets()) else {
            bail!("store-token writes into a contiguous f32 buffer")
        };
        let buffer = &mut buffer[start..end];
        let batch = self.slots.len();
        if new.len() != batch * heads * dim || self.at >= capacity || !distinct_below(self.slots, slots) {
            bail!(
                "store-token: {} values for a buffer {:?} at position {}, slots {:?}",
                new.len(),
                l1.dims(),
                self.at,
                self.slots
            )
        }
        if let Some((tables, positions)) = self.rope
            && (positions.len() != batch || positions.iter().any(|&p| p >= tables.positions()))
        {
            bail!("store-token: positions {positions:?} for {batch} rows and {} rope positions", tables.positions())
        }
        for (row_head, source) in new.chunks_exact(dim).enumerate() {
            let slot_head = self.slots[row_head / heads] * heads + row_head % heads;
            let target = &mut buffer[(slot_head * capacity + self.at) * dim..][..dim];
            match self.rope {
                Some((tables, positions)) => tables.rotate(source, positions[row_head / heads], target),
                None => target.copy_from_slice(source),
            }
        }
        Ok(())
    }
}

/// Attention of one new query per row, `q [batch, 1, heads · dim]` (not yet rotated),
/// against the first `total` positions of the cache buffers `k`, `v [slots, kv_heads,
/// capacity, dim]`, the new token's included. Row `b` reads slot `slots[b]` and attends to
/// positions `first[b]..total` (those before are its padding). Returns `[batch, 1, heads ·
/// dim]`.
pub(crate) struct DecodeAttention<'a> {
    pub heads: usize,
    pub total: usize,
    pub slots: &'a [usize],
    pub first: &'a [usize],
    /// Each row's rope position for its query.
    pub positions: &'a [usize],
    pub rope: &'a RopeTables,
    /// The scores' scale (the model's, as f32).
    pub scale: f32,
}

impl CustomOp3 for DecodeAttention<'_> {
    fn name(&self) -> &'static str {
        "decode-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = self.name();
        let (q, k, v) = (f32_contiguous(s1, l1, name)?, f32_contiguous(s2, l2, name)?, f32_contiguous(s3, l3, name)?);
        let (slots, kv_heads, capacity, dim) = l2.shape().dims4()?;
        let batch = self.slots.len();
        let heads = self.heads;
        if l3.dims() != l2.dims()
            || self.slots.iter().any(|&s| s >= slots)
            || q.len() != batch * heads * dim
            || !heads.is_multiple_of(kv_heads)
            || self.total > capacity
            || self.first.len() != batch
            || self.positions.len() != batch
            || self.first.iter().any(|&f| f >= self.total)
            || self.positions.iter().any(|&p| p >= self.rope.positions())
            || !self.rope.fits(dim)
        {
            bail!(
                "decode-attention: q {:?}, k {:?}, v {:?}, {heads} heads, {} positions, first {:?}",
                l1.dims(),
                l2.dims(),
                l3.dims(),
                self.total,
                self.first
            )
        }
        let dims = Dims { batch, heads, kv_heads, capacity, dim };
        let mut out = vec![0f32; batch * heads * dim];
        // One task per (row, key/value head): the query heads of its group are contiguous
        // in the output.
        out.par_chunks_mut(heads / kv_heads * dim).enumerate().for_each(|(task, out)| {
            #[cfg(target_arch = "x86_64")]
            if crate::decode_matmul::available() {
                // SAFETY: AVX2 and FMA are present.
                unsafe { attend_avx2(self, &dims, task, q, k, v, out) };
                return;
            }
            attend(self, &dims, task, q, k, v, out)
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, 1, heads * dim))))
    }
}

/// Whether every slot is below `slots` and none repeats.
fn distinct_below(chosen: &[usize], slots: usize) -> bool {
    let mut seen = vec![false; slots];
    chosen.iter().all(|&s| s < slots && !std::mem::replace(&mut seen[s], true))
}

struct Dims {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    capacity: usize,
    dim: usize,
}

/// [`attend`] compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(op: &DecodeAttention, s: &Dims, task: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    attend(op, s, task, q, k, v, out)
}

/// The query heads of key/value head `task % kv_heads` of row `task / kv_heads`.
#[inline(always)]
fn attend(op: &DecodeAttention, s: &Dims, task: usize, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32]) {
    let (row, kv_head) = (task / s.kv_heads, task % s.kv_heads);
    let (groups, dim, total) = (s.heads / s.kv_heads, s.dim, op.total);
    debug_assert!(row < s.batch);
    let first = op.first[row];
    let cache = (op.slots[row] * s.kv_heads + kv_head) * s.capacity * dim;
    let (keys, values) = (&k[cache..][..total * dim], &v[cache..][..total * dim]);
    let mut query = vec![0f32; groups * dim];
    for (g, query) in query.chunks_exact_mut(dim).enumerate() {
        let head = kv_head * groups + g;
        op.rope.rotate(&q[(row * s.heads + head) * dim..][..dim], op.positions[row], query);
    }
    let span = total - first;
    let block = crate::invariant::BLOCK;
    let mut scores = vec![0f32; block * span];
    // The group's query heads in blocks that read each key once, each head's keys in position
    // order: the learner's attention to the bit (`invariant.rs`); the keys before `first` are
    // the row's padding.
    let (keys, values) = (&keys[first * dim..], &values[first * dim..]);
    for (queries, out) in query.chunks(block * dim).zip(out.chunks_mut(block * dim)) {
        let scores = &mut scores[..queries.len() / dim * span];
        crate::invariant::attend_block(dim, queries, keys, values, op.scale, None, scores, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Attention written out plainly: rope, scores over `first..total`, softmax, sum.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (batch, heads, kv_heads, capacity, dim): (usize, usize, usize, usize, usize),
        total: usize,
        first: &[usize],
        positions: &[usize],
        rope: &RopeTables,
    ) -> Vec<f32> {
        let mut out = vec![0f32; batch * heads * dim];
        for b in 0..batch {
            for h in 0..heads {
                let kh = h / (heads / kv_heads);
                let mut query = vec![0f32; dim];
                rope.rotate(&q[(b * heads + h) * dim..][..dim], positions[b], &mut query);
                let at = |t: usize| ((b * kv_heads + kh) * capacity + t) * dim;
                let scores: Vec<f32> = (first[b]..total)
                    .map(|t| (0..dim).map(|i| query[i] * k[at(t) + i]).sum::<f32>() / (dim as f32).sqrt())
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = weights.iter().sum();
                for (w, t) in weights.iter().zip(first[b]..total) {
                    for i in 0..dim {
                        out[(b * heads + h) * dim + i] += w / sum * v[at(t) + i];
                    }
                }
            }
        }
        out
    }

    /// Over ~80 lines on purpose: the cases that differ (grouped heads, padded rows, odd head
    /// sizes) against one plain reference written out beside them.
    #[test]
    fn equals_plain_attention_with_groups_padding_and_odd_head_sizes() {
        let mut next = crate::test_values(7);
        // Head size 12: a vector of 8 and a remainder of 4; three query heads per key/value
        // head; rows with different padding.
        let (batch, heads, kv_heads, capacity, dim, total) = (3, 6, 2, 11, 12, 9);
        let (first, positions) = ([0, 4, 8], [8, 4, 0]);
        let angles: Vec<f32> = (0..16 * dim / 2).map(|_| next() * 6.0).collect();
        let table = |f: fn(f32) -> f32| {
            Tensor::from_vec(angles.iter().map(|&a| f(a)).collect::<Vec<_>>(), (16, dim / 2), &Device::Cpu).unwrap()
        };
        let rope = RopeTables::from_tensors(&table(f32::cos), &table(f32::sin)).unwrap();
        let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| next()).collect() };
        let (q, k, v) = (
            values(batch * heads * dim),
            values(batch * kv_heads * capacity * dim),
            values(batch * kv_heads * capacity * dim),
        );
        let want = naive(&q, &k, &v, (batch, heads, kv_heads, capacity, dim), total, &first, &positions, &rope);
        let tensor = |x: &[f32], shape: &[usize]| Tensor::from_vec(x.to_vec(), shape, &Device::Cpu).unwrap();
        let cache_shape = [batch, kv_heads, capacity, dim];
        let in_order = [0, 1, 2];
        let scale = 1.0 / (dim as f32).sqrt();
        let op = DecodeAttention {
            heads,
            total,
            slots: &in_order,
            first: &first,
            positions: &positions,
            rope: &rope,
            scale,
        };
        let got = tensor(&q, &[batch, 1, heads * dim])
            .apply_op3_no_bwd(&tensor(&k, &cache_shape), &tensor(&v, &cache_shape), &op)
            .unwrap();
        assert_eq!(got.dims(), &[batch, 1, heads * dim]);
        for (i, (g, w)) in got.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().zip(&want).enumerate() {
            assert!((g - w).abs() < 1e-5, "element {i}: {g} vs {w}");
        }

        // Storing a token rotates keys at the row's position and copies values.
        let buffer = Tensor::zeros(&cache_shape, candle_core::DType::F32, &Device::Cpu).unwrap();
        let new = values(batch * kv_heads * dim);
        buffer
            .inplace_op2(
                &tensor(&new, &[batch, 1, kv_heads * dim]),
                &StoreToken { at: 5, slots: &in_order, rope: Some((&rope, &positions)) },
            )
            .unwrap();
        let stored = buffer.narrow(2, 5, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut rotated = vec![0f32; dim];
        rope.rotate(&new[dim..2 * dim], positions[0], &mut rotated);
        assert_eq!(&stored[dim..2 * dim], &rotated[..], "row 0, head 1");
        rope.rotate(&new[2 * dim..3 * dim], positions[1], &mut rotated);
        assert_eq!(&stored[2 * dim..3 * dim], &rotated[..], "row 1, head 0");

        // Inconsistent arguments are errors, not panics.
        let past_the_end = DecodeAttention { total: capacity + 1, ..op };
        let error = tensor(&q, &[batch, 1, heads * dim])
            .apply_op3_no_bwd(&tensor(&k, &cache_shape), &tensor(&v, &cache_shape), &past_the_end)
            .unwrap_err();
        assert!(error.to_string().contains("decode-attention"), "{error}");
        let full = StoreToken { at: capacity, slots: &in_order, rope: None };
        assert!(buffer.inplace_op2(&tensor(&new, &[batch, 1, kv_heads * dim]), &full).is_err());
        let twice = StoreToken { at: 0, slots: &[0, 2, 2], rope: None };
        assert!(buffer.inplace_op2(&tensor(&new, &[batch, 1, kv_heads * dim]), &twice).is_err());

        // Rows in other slots: row b of a two-row batch reads and writes slot `slots[b]` of
        // the three-slot buffers, as the same rows at those places of a full batch do.
        let slots = [2, 0];
        let pick = |x: &[f32], per_row: usize, rows: &[usize]| -> Vec<f32> {
            rows.iter().flat_map(|&r| x[r * per_row..][..per_row].to_vec()).collect()
        };
        let op = DecodeAttention {
            slots: &slots,
            first: &[first[2], first[0]],
            positions: &[positions[2], positions[0]],
            ..op
        };
        let got = tensor(&pick(&q, heads * dim, &slots), &[2, 1, heads * dim])
            .apply_op3_no_bwd(&tensor(&k, &cache_shape), &tensor(&v, &cache_shape), &op)
            .unwrap();
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (i, (g, w)) in got.iter().zip(pick(&want, heads * dim, &slots)).enumerate() {
            assert!((g - w).abs() < 1e-5, "slotted element {i}: {g} vs {w}");
        }
        let buffer = Tensor::zeros(&cache_shape, candle_core::DType::F32, &Device::Cpu).unwrap();
        let two = values(2 * kv_heads * dim);
        buffer
            .inplace_op2(&tensor(&two, &[2, 1, kv_heads * dim]), &StoreToken { at: 3, slots: &slots, rope: None })
            .unwrap();
        let stored = buffer.narrow(2, 3, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(&stored[2 * kv_heads * dim..], &two[..kv_heads * dim], "row 0 in slot 2");
        assert_eq!(&stored[..kv_heads * dim], &two[kv_heads * dim..], "row 1 in slot 0");
        assert!(stored[kv_heads * dim..2 * kv_heads * dim].iter().all(|&x| x == 0.0), "slot 1 untouched");
    }
}
