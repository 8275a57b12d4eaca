//! The reductions that the sampler and the trainer both compute, written once, in an order
//! that does not depend on the batch (issue 61): a token's log-prob is the same bits whether
//! the engine computed it in a decoding step among 32 rows or the trainer in a pass over the
//! whole completion.
//!
//! Each sum here runs in a fixed order over its own operands only: a matmul's output element
//! is `horizontal_sum(8 lanes of FMAs over the inner dimension)` whatever the rows around it
//! (the decoding kernel, `decode_matmul.rs`, used at every row count); a norm's, a softmax's
//! and a log-softmax's sums run from the first element to the last in f64; attention sums
//! its keys one by one in position order, so that the keys a mask hides (weight exactly 0)
//! add exactly nothing wherever they stand. The engine's linears, norms, prefill and
//! decoding attention and its sampler's log-softmax call these; so do the learner's forward
//! ops (`wirl-grpo`'s `fused.rs` and `head.rs`), which add their own backward.
//!
//! f32 on the CPU only: elsewhere (CUDA, bf16 compute) both sides use candle's ops and agree
//! within rounding, and the gap is reported (`sampler_logp_diff_max`).

use crate::decode_matmul::{self, FewRowMatmul, f32_contiguous};
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor, bail};
use rayon::prelude::*;

/// Whether this CPU has the fixed-order kernels (AVX2 and FMA); without them both sides use
/// candle's ops.
pub fn available() -> bool {
    decode_matmul::available()
}

/// Whether `x · wᵀ` goes through [`matmul_t`]: both on the CPU, x f32, w f32 or bf16, and the
/// kernels [`available`].
pub fn applies(x: &Tensor, w: &Tensor) -> bool {
    x.device().is_cpu()
        && w.device().is_cpu()
        && x.dtype() == DType::F32
        && matches!(w.dtype(), DType::F32 | DType::BF16)
        && available()
}

/// `x [..., inner] · w [out, inner]ᵀ → [..., out]`, each output element summed in one order
/// whatever the number of rows (see [`applies`] for when it may be called). No gradient.
pub fn matmul_t(x: &Tensor, w: &Tensor) -> crate::Result<Tensor> {
    decode_matmul::on_rows(x, w.dim(0)?, |x2| x2.apply_op2_no_bwd(&w.contiguous()?, &FewRowMatmul))
}

/// [`matmul_t`] on host slices: `x [rows, inner] · w [out, inner]ᵀ`, row-major `[rows, out]`.
pub fn matmul_t_slices(x: &[f32], rows: usize, w: &[f32], out: usize, inner: usize) -> Vec<f32> {
    decode_matmul::product_of(x, rows, w, out, inner)
}

/// `Σ a·b` in eight lanes over whole blocks of eight, the lanes summed in order, then the
/// remainder in order: what attention's scores use on both sides.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    let mut lanes = [0f32; 8];
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `1 / sqrt(mean(x²) + eps)` of one row, summed in f64 from first to last.
pub fn inverse_rms(row: &[f32], eps: f64) -> f32 {
    let mean = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / row.len() as f64;
    (1.0 / (mean + eps).sqrt()) as f32
}

/// One row's RMS norm: `out = x · inverse_rms(x) · w`.
#[inline]
pub fn rms_norm_row(row: &[f32], weight: &[f32], eps: f64, out: &mut [f32]) {
    let scale = inverse_rms(row, eps);
    for ((o, &v), &w) in out.iter_mut().zip(row).zip(weight) {
        *o = v * scale * w;
    }
}

/// RMS norm over the last dimension of an f32 CPU tensor (no gradient): [`rms_norm_row`]
/// row by row.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> crate::Result<Tensor> {
    let x = x.contiguous()?;
    let n = x.dim(candle_core::D::Minus1)?;
    let values: Vec<f32> = x.flatten_all()?.to_vec1()?;
    let weight: Vec<f32> = weight.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    if weight.len() != n {
        return Err(crate::Error::Input(format!("rms norm: a weight of {} values for rows of {n}", weight.len())));
    }
    let mut out = vec![0f32; values.len()];
    out.par_chunks_mut(n.max(1)).zip(values.par_chunks(n.max(1))).for_each(|(out, row)| {
        rms_norm_row(row, &weight, eps, out);
    });
    Ok(Tensor::from_vec(out, x.shape(), x.device())?)
}

/// Softmax of one row in place: `exp(x − max)` normed by their sum (f64, first to last).
/// Masked entries (−∞) get exactly 0 and add exactly nothing; a row masked whole becomes
/// zeros.
#[inline]
pub fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        row.fill(0.0);
        return;
    }
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inverse = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inverse);
}

/// `log Σ exp(logits)` of one row: `max + ln Σ exp(l − max)`, the sum in f64 from the first
/// token to the last. A token's log-prob is `logits[token] − log_norm(logits)`.
pub fn log_norm(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    log_norm_from(max, logits.iter().map(|&l| (l - max).exp()))
}

/// [`log_norm`] from the row's `max` and its terms `exp(l − max)` in token order (a sampler
/// that has them already for its draw).
pub fn log_norm_from(max: f32, terms: impl Iterator<Item = f32>) -> f32 {
    let sum: f64 = terms.map(f64::from).sum();
    max + sum.ln() as f32
}

/// One query's attention over `keys` and `values` (`[n, dim]` each, position order), the
/// query already rotated: scores `dot(q, k)·scale + mask` (mask: one additive value per key,
/// −∞ hides it; none: every key seen), [`softmax_row`], then `Σ wₜ·vₜ` summed key by key.
/// `scores` is scratch of `n` values.
#[inline(always)]
pub fn attend_one(
    query: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    mask: Option<&[f32]>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let dim = query.len();
    for (t, (s, key)) in scores.iter_mut().zip(keys.chunks_exact(dim)).enumerate() {
        let hidden = mask.is_some_and(|m| m[t] == f32::NEG_INFINITY);
        *s = if hidden { f32::NEG_INFINITY } else { dot(query, key) * scale + mask.map_or(0.0, |m| m[t]) };
    }
    softmax_row(scores);
    out.fill(0.0);
    for (&weight, value) in scores.iter().zip(values.chunks_exact(dim)) {
        if weight == 0.0 {
            continue; // a hidden key (or one too far below the max to count): exactly nothing
        }
        for (o, x) in out.iter_mut().zip(value) {
            *o += weight * x;
        }
    }
}

/// Attention of rotated queries `q [batch, heads, len, dim]` over keys and values `[batch,
/// kv_heads, total, dim]` (grouped-query: query head `h` reads key/value head `h / (heads /
/// kv_heads)`), each query by [`attend_one`]. `mask`: additive, `[len, total]` for every row
/// of the batch or `[batch, len, total]`; none: every key seen. Output `[batch, heads, len,
/// dim]`. No gradient (the learner's op adds one).
pub struct Attention {
    pub scale: f32,
    pub mask: Option<Vec<f32>>,
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "invariant-attention"
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
        let (batch, heads, len, dim) = l1.shape().dims4()?;
        let (kb, kv_heads, total, kd) = l2.shape().dims4()?;
        let mask_ok = match &self.mask {
            None => true,
            Some(m) => m.len() == len * total || m.len() == batch * len * total,
        };
        if kb != batch
            || kd != dim
            || l3.dims() != l2.dims()
            || kv_heads == 0
            || !heads.is_multiple_of(kv_heads)
            || !mask_ok
        {
            bail!(
                "{name}: q {:?}, k {:?}, v {:?}, mask of {:?} values",
                l1.dims(),
                l2.dims(),
                l3.dims(),
                self.mask.as_ref().map(Vec::len)
            )
        }
        let groups = heads / kv_heads;
        let per_row_mask = self.mask.as_ref().is_some_and(|m| m.len() == batch * len * total && batch > 1);
        let mut out = vec![0f32; batch * heads * len * dim];
        out.par_chunks_mut(len * dim).enumerate().for_each(|(task, out)| {
            let (b, h) = (task / heads, task % heads);
            let kv = (b * kv_heads + h / groups) * total * dim;
            let (keys, values) = (&k[kv..][..total * dim], &v[kv..][..total * dim]);
            let mut scores = vec![0f32; total];
            for i in 0..len {
                let query = &q[((b * heads + h) * len + i) * dim..][..dim];
                let mask = self.mask.as_ref().map(|m| {
                    let at = if per_row_mask { (b * len + i) * total } else { i * total };
                    &m[at..][..total]
                });
                attend_one(query, keys, values, self.scale, mask, &mut scores, &mut out[i * dim..][..dim]);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, heads, len, dim))))
    }
}

/// [`Attention`] over tensors: `mask` `[len, total]` or `[batch, 1, len, total]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, mask: Option<&Tensor>) -> crate::Result<Tensor> {
    let mask = mask.map(|m| m.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()).transpose()?;
    Ok(q.contiguous()?.apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &Attention { scale, mask })?)
}
