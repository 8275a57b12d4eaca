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
//! Both sides call these in f32 on the CPU; elsewhere (CUDA, bf16 compute) they use candle's
//! ops and agree within rounding, and the gap is reported (`sampler_logp_diff_max`). The same
//! reductions exist for CUDA (the `cuda` feature: `invariant.cu`, launched by
//! `invariant_cuda.rs` as the product's, the norm's and attention's `cuda_fwd`), checked for
//! batch invariance by `invariant_check` (`wirl model check-device`); neither side calls them
//! on a GPU until a lent GPU has shown they pass (docs/ROADMAP.md, issue 61, item 4).

use crate::decode_matmul::{self, FewRowMatmul, f32_contiguous};
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Shape, Tensor, bail};
use rayon::prelude::*;
use std::sync::Arc;

/// Whether this CPU has the fixed-order kernels (AVX2 and FMA) and they were not declined
/// ([`KERNELS_VARIABLE`]); without them both sides use candle's ops.
pub fn available() -> bool {
    decode_matmul::available()
}

pub use crate::decode_matmul::KERNELS_VARIABLE;

/// [`KERNELS_VARIABLE`]'s value checked: `Err` names it and what it may be (a command calls
/// this before it computes, so that a misspelt value is not silently the default).
pub fn check_kernels_variable() -> crate::Result<()> {
    match std::env::var(KERNELS_VARIABLE) {
        Err(std::env::VarError::NotPresent) => Ok(()),
        Ok(v) if v == "portable" || v == "native" || v.is_empty() => Ok(()),
        Ok(v) => Err(crate::Error::Input(format!(
            "the environment variable {KERNELS_VARIABLE} is `{v}`: set `native` (the default) or `portable` \
             (candle's ops, as on a CPU without AVX2), or unset it"
        ))),
        Err(std::env::VarError::NotUnicode(v)) => Err(crate::Error::Input(format!(
            "the environment variable {KERNELS_VARIABLE} is {v:?}, not text: set `native` or `portable`, or unset it"
        ))),
    }
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

/// RMS norm over the last dimension of an f32 tensor (no gradient): on the CPU
/// [`rms_norm_row`] row by row, reading `x` where it is stored (no host copy of the
/// activations); on CUDA (the `cuda` feature) `invariant.cu`'s norm, one block per row.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> crate::Result<Tensor> {
    let x = x.contiguous()?;
    let n = x.dim(candle_core::D::Minus1)?;
    if weight.elem_count() != n {
        return Err(crate::Error::Input(format!(
            "rms norm: a weight of {} values for rows of {n}",
            weight.elem_count()
        )));
    }
    let weight = weight.to_dtype(DType::F32)?.flatten_all()?.to_device(x.device())?;
    Ok(x.apply_op2_no_bwd(&weight, &Norm { eps })?)
}

/// [`rms_norm`]'s op: `x [..., n]` f32 and its weight `[n]` f32.
struct Norm {
    eps: f64,
}

impl candle_core::CustomOp2 for Norm {
    fn name(&self) -> &'static str {
        "invariant-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (values, weight) = (f32_contiguous(xs, xl, self.name())?, f32_contiguous(ws, wl, self.name())?);
        let n = weight.len().max(1);
        let mut out = vec![0f32; values.len()];
        out.par_chunks_mut(n).zip(values.par_chunks(n)).for_each(|(out, row)| {
            rms_norm_row(row, weight, self.eps, out);
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::invariant_cuda::rms_norm(xs, xl, ws, wl, self.eps)
    }
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
        if *v == f32::NEG_INFINITY {
            // What `exp` gives and the sum adds (exactly 0), without calling `exp`: a causal
            // prefill hides half its keys.
            *v = 0.0;
            continue;
        }
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

/// The most queries [`attend_block`] takes at once.
pub const BLOCK: usize = 4;

/// Attention of up to [`BLOCK`] queries (`[q, dim]`, already rotated) over the same `keys`
/// and `values` (`[n, dim]` each, position order): each query's scores `dot(q, k)·scale +
/// mask` (mask `[q, n]`: one additive value per key, −∞ hides it; none: every key seen),
/// [`softmax_row`], then `Σ wₜ·vₜ` summed key by key. Each key and value is read once for the
/// block, and each query's result is the same bits as alone (its sums run over its own
/// operands in the same order), so a decoding step and a training pass agree however their
/// queries are grouped. `scores`: scratch `[q, n]`; `out`: `[q, dim]`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn attend_block(
    dim: usize,
    queries: &[f32],
    keys: &[f32],
    values: &[f32],
    scale: f32,
    mask: Option<&[f32]>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let q = queries.len() / dim;
    let n = keys.len() / dim;
    assert!(q <= BLOCK && scores.len() == q * n && out.len() == q * dim && mask.is_none_or(|m| m.len() == q * n));
    // The keys after the last one the mask lets through add exactly nothing (weight 0): a
    // causal prefill's query stops at its own position.
    let mut seen = [0usize; BLOCK];
    for (i, seen) in seen[..q].iter_mut().enumerate() {
        *seen = mask
            .map_or(n, |m| m[i * n..][..n].iter().rposition(|&m| m != f32::NEG_INFINITY).map_or(0, |last| last + 1));
    }
    let most = seen[..q].iter().copied().max().unwrap_or(0);
    for (t, key) in keys.chunks_exact(dim).take(most).enumerate() {
        for (i, query) in queries.chunks_exact(dim).enumerate() {
            if t < seen[i] {
                let m = mask.map_or(0.0, |m| m[i * n + t]);
                scores[i * n + t] = if m == f32::NEG_INFINITY { m } else { dot(query, key) * scale + m };
            }
        }
    }
    for (i, (scores, out)) in scores.chunks_exact_mut(n).zip(out.chunks_exact_mut(dim)).enumerate() {
        softmax_row(&mut scores[..seen[i]]);
        out.fill(0.0);
    }
    for (t, value) in values.chunks_exact(dim).take(most).enumerate() {
        for (i, out) in out.chunks_exact_mut(dim).enumerate() {
            let weight = if t < seen[i] { scores[i * n + t] } else { 0.0 };
            if weight == 0.0 {
                continue; // a hidden key (or one too far below the max to count): exactly nothing
            }
            for (o, x) in out.iter_mut().zip(value) {
                *o += weight * x;
            }
        }
    }
}

/// Attention of rotated queries `q [batch, heads, len, dim]` over keys and values `[batch,
/// kv_heads, total, dim]` (grouped-query: query head `h` reads key/value head `h / (heads /
/// kv_heads)`), each query by [`attend_block`]. `mask`: additive, `[len, total]` for every row
/// of the batch or `[batch, len, total]`; none: every key seen. Output `[batch, heads, len,
/// dim]`. No gradient (the learner's op adds one).
pub struct Attention {
    pub scale: f32,
    pub mask: Option<Arc<[f32]>>,
}

/// A step's additive attention mask, built once and read by every layer of the step: as the
/// f32 values [`Attention`] reads where it applies (the CPU in f32), as a tensor for candle's
/// ops elsewhere. Why once: a prefill of 4,000 tokens has a 64 MB mask, and copying it out of
/// a tensor again for each layer cost ~1 % of that prefill.
#[derive(Clone)]
pub enum Mask {
    Values { values: Arc<[f32]>, shape: Shape },
    Tensor(Tensor),
}

impl Mask {
    /// `values` in `shape`, for attention computed on `device` in `dtype`.
    pub fn new(values: Vec<f32>, shape: impl Into<Shape>, device: &Device, dtype: DType) -> crate::Result<Self> {
        let shape = shape.into();
        if device.is_cpu() && dtype == DType::F32 && available() {
            if shape.elem_count() != values.len() {
                return Err(crate::Error::Input(format!("a mask of {} values for the shape {shape:?}", values.len())));
            }
            return Ok(Self::Values { values: values.into(), shape });
        }
        Ok(Self::Tensor(Tensor::from_vec(values, shape, device)?.to_dtype(dtype)?))
    }

    /// The mask as a tensor on `device` in `dtype` (made from the values where it holds them).
    pub fn tensor(&self, device: &Device, dtype: DType) -> crate::Result<Tensor> {
        Ok(match self {
            Self::Tensor(tensor) => tensor.to_device(device)?.to_dtype(dtype)?,
            Self::Values { values, shape } => Tensor::from_slice(values, shape.clone(), device)?.to_dtype(dtype)?,
        })
    }

    /// The mask's f32 values, row-major (shared where it holds them, read out of the tensor
    /// otherwise).
    pub fn values(&self) -> crate::Result<Arc<[f32]>> {
        Ok(match self {
            Self::Values { values, .. } => Arc::clone(values),
            Self::Tensor(tensor) => tensor.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?.into(),
        })
    }
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
        let (batch, heads, len, total, dim, kv_heads, per_row_mask) =
            attention_shape(name, (l1, l2, l3), self.mask.as_ref().map(|m| m.len()))?;
        let groups = heads / kv_heads;
        let mut out = vec![0f32; batch * heads * len * dim];
        let shape = Dims { heads, len, total, dim, groups, kv_heads, per_row_mask };
        out.par_chunks_mut(len * dim).enumerate().for_each(|(task, out)| {
            #[cfg(target_arch = "x86_64")]
            if available() {
                // SAFETY: AVX2 and FMA are present. The same operations in the same order as
                // without them (Rust contracts no multiply-add), only wider.
                unsafe { attend_task_avx2(self, &shape, task, (q, k, v), out) };
                return;
            }
            attend_task(self, &shape, task, (q, k, v), out)
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, heads, len, dim))))
    }
}

/// What [`attend_task`] needs of the op's operands' shapes.
#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    len: usize,
    total: usize,
    dim: usize,
    groups: usize,
    kv_heads: usize,
    per_row_mask: bool,
}

/// [`attend_task`] compiled for AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_task_avx2(op: &Attention, s: &Dims, task: usize, qkv: (&[f32], &[f32], &[f32]), out: &mut [f32]) {
    attend_task(op, s, task, qkv, out)
}

/// The queries of head `task % heads` of row `task / heads`, in blocks of [`BLOCK`].
#[inline(always)]
fn attend_task(op: &Attention, s: &Dims, task: usize, (q, k, v): (&[f32], &[f32], &[f32]), out: &mut [f32]) {
    let Dims { heads, len, total, dim, groups, kv_heads, per_row_mask } = *s;
    let (b, h) = (task / heads, task % heads);
    let kv = (b * kv_heads + h / groups) * total * dim;
    let (keys, values) = (&k[kv..][..total * dim], &v[kv..][..total * dim]);
    let mut scores = vec![0f32; BLOCK * total];
    for first in (0..len).step_by(BLOCK) {
        let count = BLOCK.min(len - first);
        let queries = &q[((b * heads + h) * len + first) * dim..][..count * dim];
        let mask = op.mask.as_ref().map(|m| {
            let at = if per_row_mask { (b * len + first) * total } else { first * total };
            &m[at..][..count * total]
        });
        let out = &mut out[first * dim..][..count * dim];
        attend_block(dim, queries, keys, values, op.scale, mask, &mut scores[..count * total], out);
    }
}

/// [`Attention`] over tensors: `mask` `[len, total]` or `[batch, 1, len, total]`. On CUDA
/// (the `cuda` feature) `invariant.cu`'s attention, one block per query, its sums in the
/// same orders.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, mask: Option<&Mask>) -> crate::Result<Tensor> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        let mask = mask.map(|m| m.tensor(q.device(), DType::F32)).transpose()?;
        return Ok(q.apply_op3_no_bwd(
            &k,
            &v,
            &DeviceAttention { scale, mask: mask.map(|m| m.flatten_all()).transpose()? },
        )?);
    }
    let mask = mask.map(Mask::values).transpose()?;
    Ok(q.apply_op3_no_bwd(&k, &v, &Attention { scale, mask })?)
}

/// The shapes of an attention's operands checked (as [`Attention`] takes them): `(batch,
/// heads, len, total, dim, kv_heads, per_row_mask)`, or an error naming them.
fn attention_shape(
    name: &str,
    (l1, l2, l3): (&Layout, &Layout, &Layout),
    mask_len: Option<usize>,
) -> candle_core::Result<(usize, usize, usize, usize, usize, usize, bool)> {
    let (batch, heads, len, dim) = l1.shape().dims4()?;
    let (kb, kv_heads, total, kd) = l2.shape().dims4()?;
    let mask_ok = mask_len.is_none_or(|m| m == len * total || m == batch * len * total);
    if kb != batch
        || kd != dim
        || l3.dims() != l2.dims()
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || !mask_ok
    {
        bail!("{name}: q {:?}, k {:?}, v {:?}, mask of {mask_len:?} values", l1.dims(), l2.dims(), l3.dims())
    }
    let per_row_mask = mask_len.is_some_and(|m| m == batch * len * total && batch > 1);
    Ok((batch, heads, len, total, dim, kv_heads, per_row_mask))
}

/// [`Attention`] on CUDA, its mask on the device (flat, f32).
#[cfg(feature = "cuda")]
struct DeviceAttention {
    scale: f32,
    mask: Option<Tensor>,
}

#[cfg(feature = "cuda")]
impl CustomOp3 for DeviceAttention {
    fn name(&self) -> &'static str {
        "invariant-attention-cuda"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        bail!("{} runs on CUDA tensors (the CPU's is `Attention`)", self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (batch, heads, len, total, dim, kv_heads, per_row_mask) =
            attention_shape(self.name(), (l1, l2, l3), self.mask.as_ref().map(Tensor::elem_count))?;
        let shape = crate::invariant_cuda::AttentionShape { batch, heads, len, total, dim, kv_heads, per_row_mask };
        let mask = self.mask.as_ref().map(|m| m.storage_and_layout());
        let mask = match &mask {
            Some((storage, layout)) => match &**storage {
                candle_core::Storage::Cuda(storage) => Some((storage, *layout)),
                _ => bail!("{}: the mask is not on the GPU", self.name()),
            },
            None => None,
        };
        crate::invariant_cuda::attention((s1, l1), (s2, l2), (s3, l3), mask, &shape, self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn values(seed: u32, n: usize) -> Vec<f32> {
        let mut next = crate::test_values(seed);
        (0..n).map(|_| next()).collect()
    }

    /// A row's product is the same bits alone and among 300 rows (several of the kernel's row
    /// tiles, at 576 and 1536 wide) wherever it stands.
    #[test]
    fn a_rows_product_is_the_same_bits_in_any_batch() {
        if !available() {
            return;
        }
        for (rows, out, inner) in [(300, 40, 576), (300, 13, 1536), (7, 9, 100)] {
            let x = values(1, rows * inner);
            let w = values(2, out * inner);
            let all = matmul_t_slices(&x, rows, &w, out, inner);
            for r in [0, 1, rows / 2, rows - 1] {
                let alone = matmul_t_slices(&x[r * inner..][..inner], 1, &w, out, inner);
                assert_eq!(alone, all[r * out..][..out], "row {r} of {rows}, {out} x {inner}");
                let plain: Vec<f32> =
                    (0..out).map(|o| (0..inner).map(|k| x[r * inner + k] * w[o * inner + k]).sum()).collect();
                for (got, want) in alone.iter().zip(&plain) {
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{got} against {want}");
                }
            }
        }
    }

    /// The norm over a tensor is each row's [`rms_norm_row`], bit for bit, also of a view
    /// that is not contiguous (a transpose) and of a tensor narrowed from a larger one; a
    /// weight of the wrong length is refused.
    #[test]
    fn the_norm_over_a_tensor_is_its_rows_norms() {
        let (rows, n, eps) = (6, 16, 1e-5);
        let device = Device::Cpu;
        let x = values(7, rows * n);
        let weight = values(8, n);
        let w = Tensor::from_vec(weight.clone(), n, &device).unwrap();
        let want: Vec<f32> = x
            .chunks(n)
            .flat_map(|row| {
                let mut out = vec![0f32; n];
                rms_norm_row(row, &weight, eps, &mut out);
                out
            })
            .collect();
        let plain = Tensor::from_vec(x.clone(), (rows, n), &device).unwrap();
        let got = |t: &Tensor| rms_norm(t, &w, eps).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(got(&plain), want);
        let transposed = plain.t().unwrap().contiguous().unwrap().t().unwrap();
        assert!(!transposed.is_contiguous());
        assert_eq!(got(&transposed), want);
        let wider = Tensor::cat(&[&plain, &plain], 0).unwrap().narrow(0, rows, rows).unwrap();
        assert_eq!(got(&wider), want);
        let short = Tensor::from_vec(weight[..n - 1].to_vec(), n - 1, &device).unwrap();
        assert!(rms_norm(&plain, &short, eps).unwrap_err().to_string().contains("a weight of 15 values"));
    }

    /// Attention's queries give the same bits one by one and in blocks, causal or not, and
    /// what plain attention computes within rounding; a query whose keys are all hidden gets
    /// zeros.
    #[test]
    fn attention_blocks_are_the_same_bits_as_queries_alone() {
        let (len, dim, scale) = (11, 24, 0.2f32);
        let (q, k, v) = (values(3, len * dim), values(4, len * dim), values(5, len * dim));
        let mut causal = vec![0f32; len * len];
        for i in 0..len {
            for t in i + 1..len {
                causal[i * len + t] = f32::NEG_INFINITY;
            }
        }
        causal[2 * len..3 * len].fill(f32::NEG_INFINITY); // a padding row: nothing seen
        for mask in [None, Some(&causal[..])] {
            let mut blocked = vec![0f32; len * dim];
            for first in (0..len).step_by(BLOCK) {
                let count = BLOCK.min(len - first);
                let mut scores = vec![0f32; count * len];
                let rows = mask.map(|m| &m[first * len..][..count * len]);
                let (queries, out) = (&q[first * dim..][..count * dim], &mut blocked[first * dim..][..count * dim]);
                attend_block(dim, queries, &k, &v, scale, rows, &mut scores, out);
            }
            for i in 0..len {
                let mut alone = vec![0f32; dim];
                let mut scores = vec![0f32; len];
                let row = mask.map(|m| &m[i * len..][..len]);
                attend_block(dim, &q[i * dim..][..dim], &k, &v, scale, row, &mut scores, &mut alone);
                assert_eq!(alone, blocked[i * dim..][..dim], "query {i}, mask {}", mask.is_some());
                let seen: Vec<usize> = (0..len).filter(|&t| row.is_none_or(|m| m[t] == 0.0)).collect();
                let logits: Vec<f64> = seen
                    .iter()
                    .map(|&t| {
                        (0..dim).map(|d| f64::from(q[i * dim + d]) * f64::from(k[t * dim + d])).sum::<f64>()
                            * f64::from(scale)
                    })
                    .collect();
                let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let norm: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for d in 0..dim {
                    let want: f64 = seen
                        .iter()
                        .zip(&logits)
                        .map(|(&t, l)| (l - max).exp() / norm * f64::from(v[t * dim + d]))
                        .sum();
                    assert!(
                        (f64::from(alone[d]) - want).abs() < 1e-5,
                        "query {i} dim {d}: {} against {want}",
                        alone[d]
                    );
                }
            }
        }
        // The op over tensors, its mask held as values or as a tensor: the same bits as the
        // blocks.
        let device = Device::Cpu;
        let t = |x: &[f32]| Tensor::from_vec(x.to_vec(), (1, 1, len, dim), &device).unwrap();
        let as_tensor = Mask::Tensor(Tensor::from_vec(causal.clone(), (len, len), &device).unwrap());
        let as_values = Mask::new(causal.clone(), (len, len), &device, DType::F32).unwrap();
        assert_eq!(matches!(as_values, Mask::Values { .. }), available());
        assert_eq!(
            as_values.tensor(&device, DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            causal
        );
        let attend = |mask: &Mask| -> Vec<f32> {
            let out = attention(&t(&q), &t(&k), &t(&v), scale, Some(mask)).unwrap();
            out.flatten_all().unwrap().to_vec1().unwrap()
        };
        let out = attend(&as_tensor);
        assert_eq!(out, attend(&as_values));
        let mut scores = vec![0f32; len];
        for i in [0, 5, len - 1] {
            let mut alone = vec![0f32; dim];
            attend_block(
                dim,
                &q[i * dim..][..dim],
                &k,
                &v,
                scale,
                Some(&causal[i * len..][..len]),
                &mut scores,
                &mut alone,
            );
            assert_eq!(alone, out[i * dim..][..dim]);
        }
    }
}
