//! Softmax, RMS norm and rotary embedding as single ops with their backward written out,
//! where the policy trains on the CPU in f32. candle composes each from 5–8 elementwise ops,
//! every one a fresh tensor forward and more of them backward (a softmax over `[rows, heads,
//! queries, keys]` scores is the largest tensor of a layer); here each is one pass forward
//! and one or two backward. Elsewhere (CUDA, bf16), or with `fast` false, the composed ops
//! stand: candle has them on every device (`Net::set_fast_paths` picks them on the CPU too,
//! which is how the CUDA path's gradients are tested against these).

use crate::grads::in_row_parts;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, D, DType, Layout, Result, Shape, Tensor, bail};
use wirl_model::ops::computed_as;

/// Softmax over the last dimension.
pub(crate) fn softmax_last_dim(x: &Tensor, fast: bool) -> Result<Tensor> {
    if fast && fused(x) {
        return x.contiguous()?.apply_op1(Softmax);
    }
    // The max is a constant shift: no gradient through it.
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let e = shifted.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Log-softmax over the last dimension: on the CPU in f32, `z − log_norm(z)` with the
/// sampler's log-norm (`wirl_model::invariant::log_norm`), so that a token's log-prob is
/// the bits the sampler returned for it.
pub(crate) fn log_softmax_last_dim(x: &Tensor, fast: bool) -> Result<Tensor> {
    if fast && fused(x) && wirl_model::invariant::available() {
        return x.contiguous()?.apply_op1(LogSoftmax);
    }
    candle_nn::ops::log_softmax(x, D::Minus1)
}

struct LogSoftmax;

impl CustomOp1 for LogSoftmax {
    fn name(&self) -> &'static str {
        "wirl-log-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        row_wise(storage, layout, self.name(), |row, out| {
            let norm = wirl_model::invariant::log_norm(row);
            for (o, &z) in out.iter_mut().zip(row) {
                *o = z - norm;
            }
        })
    }

    /// `dz = g − softmax(z) · Σ g` per row.
    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.broadcast_sub(&y.exp()?.broadcast_mul(&grad.sum_keepdim(D::Minus1)?)?)?))
    }
}

/// `x / rms(x) * weight` over the last dimension, `eps` inside the root.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, fast: bool) -> Result<Tensor> {
    if fast && fused(x) && fused(weight) {
        return x.contiguous()?.apply_op2(&weight.contiguous()?, RmsNorm { eps });
    }
    let scale = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&scale)?.broadcast_mul(weight)
}

/// HF's rotary embedding of `x` (`[batch, heads, len, dim]`): `x · cos + rotate_half(x) ·
/// sin`, with `cos` and `sin` of shape `[len, dim / 2]`.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, fast: bool) -> Result<Tensor> {
    if fast && fused(x) && fused(cos) && fused(sin) {
        return x.contiguous()?.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope { inverse: false });
    }
    let (cos, sin) = (cos.unsqueeze(0)?.unsqueeze(0)?, sin.unsqueeze(0)?.unsqueeze(0)?);
    wirl_model::ops::rotate_half_rope(x, &cos, &sin).map_err(candle_core::Error::wrap)
}

/// `x · Wᵀ` for a frozen `W` (a LoRA policy's base weights): the same product, but its
/// backward computes only `x`'s gradient. candle's matmul backward computes both operands'
/// gradients whether or not anything wants them: for a frozen weight a full weight-sized
/// product per projection, a third of the backward's arithmetic, thrown away.
pub(crate) fn frozen_linear(x: &Tensor, w: &Tensor, fast: bool) -> Result<Tensor> {
    // A frozen weight stored in bf16 (a LoRA base, `lora.base_dtype`) is widened for each
    // product only: the f32 copy lives as long as the product, never beside the graph.
    let invariant = fast && wirl_model::invariant::applies(x, w);
    if !invariant && (!fast || !x.track_op() || !fused(x)) {
        return x.broadcast_matmul(&computed_as(w, x)?.t()?);
    }
    let y = if invariant {
        // The engine's product to the bit (one order of summation at every row count).
        wirl_model::invariant::matmul_t(&x.detach(), w).map_err(candle_core::Error::wrap)?
    } else {
        x.detach().broadcast_matmul(&computed_as(w, x)?.t()?)?.contiguous()?
    };
    if !x.track_op() {
        return Ok(y);
    }
    x.apply_op1(FrozenLinear { value: std::sync::Mutex::new(Some(y)), w: w.clone() })
}

/// `x · Wᵀ` for a trained `W` (f32, on the CPU): the engine's product to the bit
/// (`wirl_model::invariant::matmul_t`), with both operands' gradients. Elsewhere, `None`:
/// the caller multiplies as candle does.
pub(crate) fn trained_linear(x: &Tensor, w: &Tensor, fast: bool) -> Result<Option<Tensor>> {
    if !fast || w.dtype() != DType::F32 || !wirl_model::invariant::applies(x, w) {
        return Ok(None);
    }
    Ok(Some(x.contiguous()?.apply_op2(&w.contiguous()?, TrainedLinear)?))
}

/// `x [.., inner] · w [out, inner]ᵀ → [.., out]`; backward `dx = dy · W`, `dW = dyᵀ · x`.
struct TrainedLinear;

impl CustomOp2 for TrainedLinear {
    fn name(&self) -> &'static str {
        "wirl-trained-linear"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?);
        let (out, inner) = l2.shape().dims2()?;
        if last_dim(l1) != inner {
            bail!("{}: x {:?} against a weight {:?}", self.name(), l1.dims(), l2.dims());
        }
        let rows = x.len() / inner.max(1);
        let y = wirl_model::invariant::matmul_t_slices(x, rows, w, out, inner);
        let mut dims = l1.dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last = out;
        }
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let inner = w.dim(1)?;
        let dx = grad.broadcast_matmul(w)?;
        let rows = x.elem_count() / inner.max(1);
        let flat_grad = grad.reshape((rows, w.dim(0)?))?;
        let dw = flat_grad.t()?.matmul(&x.reshape((rows, inner))?)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Attention of rotated queries `q [batch, heads, len, dim]` over `keys`, `values` `[batch,
/// kv_heads, total, dim]` under the additive `mask` `[len, total]`: the engine's attention
/// to the bit (`wirl_model::invariant::Attention`: keys summed in position order), with its
/// backward. Elsewhere, `None`: the caller composes candle's ops.
pub(crate) fn attention(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    scale: f32,
    mask: &Tensor,
    fast: bool,
) -> Result<Option<Tensor>> {
    if !fast || !fused(q) || !fused(keys) || !wirl_model::invariant::available() {
        return Ok(None);
    }
    let mask_values: Vec<f32> = mask.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    let op = TrainedAttention {
        forward: wirl_model::invariant::Attention { scale, mask: Some(mask_values.into()) },
        mask: mask.clone(),
    };
    Ok(Some(q.contiguous()?.apply_op3(&keys.contiguous()?, &values.contiguous()?, op)?))
}

struct TrainedAttention {
    forward: wirl_model::invariant::Attention,
    mask: Tensor,
}

impl CustomOp3 for TrainedAttention {
    fn name(&self) -> &'static str {
        "wirl-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward.cpu_fwd(s1, l1, s2, l2, s3, l3)
    }

    /// With `P = softmax(q·kᵀ·s + mask)` recomputed (per query head, keys repeated for the
    /// heads that share them): `dv = Pᵀ·g`, `dP = g·vᵀ`, `dS = P ⊙ (dP − Σ dP ⊙ P)`,
    /// `dq = dS·k·s`, `dk = dSᵀ·q·s`, the repeated heads' `dk`, `dv` summed back.
    fn bwd(
        &self,
        q: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (batch, heads, _, dim) = q.dims4()?;
        let (_, kv_heads, total, _) = keys.dims4()?;
        let groups = heads / kv_heads;
        let repeat = |x: &Tensor| wirl_model::ops::repeat_kv(x, groups).map_err(candle_core::Error::wrap);
        let (k, v) = (repeat(keys)?.contiguous()?, repeat(values)?.contiguous()?);
        let scale = f64::from(self.forward.scale);
        let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&self.mask)?.contiguous()?;
        let p = scores.apply_op1_no_bwd(&Softmax)?;
        let grad = grad.contiguous()?;
        let dv = p.t()?.matmul(&grad)?;
        let dp = grad.matmul(&v.t()?)?.contiguous()?;
        let ds = p.apply_op2_no_bwd(&dp, &SoftmaxBackward)?;
        let dq = (ds.matmul(&k)? * scale)?;
        let dk = (ds.t()?.matmul(q)? * scale)?;
        let fold = |x: Tensor| -> Result<Tensor> { x.reshape((batch, kv_heads, groups, total, dim))?.sum(2) };
        Ok((Some(dq), Some(fold(dk)?), Some(fold(dv)?)))
    }
}

/// The product computed outside the graph, handed over as this op's output; its backward
/// is `dx = dy · W`.
struct FrozenLinear {
    /// Taken by the forward (so that the graph holds the output once).
    value: std::sync::Mutex<Option<Tensor>>,
    w: Tensor,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "wirl-frozen-linear"
    }

    fn cpu_fwd(&self, _storage: &CpuStorage, _layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let value = self.value.lock().map_err(|_| candle_core::Error::Msg("a poisoned lock".into()))?.take();
        let Some(value) = value else { bail!("{}: run twice", self.name()) };
        let (storage, layout) = value.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else { bail!("{}: expects the CPU", self.name()) };
        Ok((CpuStorage::F32(values(cpu, layout, self.name())?.to_vec()), value.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.broadcast_matmul(&computed_as(&self.w, grad_res)?)?))
    }
}

fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// The contiguous f32 values of one argument.
fn values<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (CpuStorage::F32(values), Some((start, end))) => Ok(&values[start..end]),
        _ => bail!("{op}: expects contiguous f32 values"),
    }
}

fn last_dim(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

/// Rows of `n` values of `out` filled by `f(row_index, row)`, rows split over threads.
fn by_rows(len: usize, n: usize, work: usize, f: impl Fn(usize, &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0f32; len];
    in_row_parts(&mut out, n, work, |first, rows| {
        for (r, row) in rows.chunks_mut(n).enumerate() {
            f(first + r, row);
        }
    });
    out
}

/// A row-wise op over the last dimension: `f(row, out)` for each row of the input, the
/// output of the input's shape (the forward of the softmaxes).
fn row_wise(
    storage: &CpuStorage,
    layout: &Layout,
    name: &str,
    f: impl Fn(&[f32], &mut [f32]) + Sync,
) -> Result<(CpuStorage, Shape)> {
    let x = values(storage, layout, name)?;
    let n = last_dim(layout);
    let out = by_rows(x.len(), n, n, |r, out| f(&x[r * n..(r + 1) * n], out));
    Ok((CpuStorage::F32(out), layout.shape().clone()))
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "wirl-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        // The engine's softmax (`wirl_model::invariant`); a row masked whole is zeros.
        row_wise(storage, layout, self.name(), |row, out| {
            out.copy_from_slice(row);
            wirl_model::invariant::softmax_row(out);
        })
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward)?))
    }
}

/// `dx = y ⊙ (g − Σ g·y)` per row.
struct SoftmaxBackward;

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "wirl-softmax-backward"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (y, g) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?);
        if y.len() != g.len() {
            bail!("{}: {} outputs but {} gradients", self.name(), y.len(), g.len());
        }
        let n = last_dim(l1);
        let out = by_rows(y.len(), n, n, |r, out| {
            let (y, g) = (&y[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
            let dot = y.iter().zip(g).map(|(&y, &g)| f64::from(y) * f64::from(g)).sum::<f64>() as f32;
            for ((o, &y), &g) in out.iter_mut().zip(y).zip(g) {
                *o = y * (g - dot);
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

struct RmsNorm {
    eps: f64,
}

use wirl_model::invariant::inverse_rms;

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "wirl-rms-norm"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?);
        let n = last_dim(l1);
        if w.len() != n {
            bail!("{}: a weight of {} values for rows of {n}", self.name(), w.len());
        }
        // The engine's norm (`wirl_model::invariant`), so that the sampler's log-probs are
        // the learner's to the bit.
        let out = by_rows(x.len(), n, n, |r, out| {
            wirl_model::invariant::rms_norm_row(&x[r * n..(r + 1) * n], w, self.eps, out);
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dx = x.apply_op3_no_bwd(w, &grad, &RmsNormBackwardX { eps: self.eps })?;
        let dw = x.apply_op2_no_bwd(&grad, &RmsNormBackwardWeight { eps: self.eps })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Per row, with `u = g ⊙ w` and `r` the inverse rms: `dx = r·u − x · r³ · (u·x) / n`.
struct RmsNormBackwardX {
    eps: f64,
}

impl CustomOp3 for RmsNormBackwardX {
    fn name(&self) -> &'static str {
        "wirl-rms-norm-backward-x"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w, g) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?, values(s3, l3, self.name())?);
        let n = last_dim(l1);
        if w.len() != n || g.len() != x.len() {
            bail!("{}: mismatched shapes", self.name());
        }
        let out = by_rows(x.len(), n, 2 * n, |r, out| {
            let (x, g) = (&x[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
            let inv = inverse_rms(x, self.eps);
            let ux = x.iter().zip(g).zip(w).map(|((&x, &g), &w)| f64::from(g * w) * f64::from(x)).sum::<f64>();
            let coef = (f64::from(inv).powi(3) * ux / n as f64) as f32;
            for (((o, &x), &g), &w) in out.iter_mut().zip(x).zip(g).zip(w) {
                *o = inv * g * w - x * coef;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `dw = Σ over rows of g ⊙ x · r`.
struct RmsNormBackwardWeight {
    eps: f64,
}

impl CustomOp2 for RmsNormBackwardWeight {
    fn name(&self) -> &'static str {
        "wirl-rms-norm-backward-weight"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, g) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?);
        let n = last_dim(l1);
        if g.len() != x.len() {
            bail!("{}: mismatched shapes", self.name());
        }
        let mut sum = vec![0f64; n];
        for (x, g) in x.chunks(n).zip(g.chunks(n)) {
            let inv = f64::from(inverse_rms(x, self.eps));
            for ((s, &x), &g) in sum.iter_mut().zip(x).zip(g) {
                *s += f64::from(g) * f64::from(x) * inv;
            }
        }
        Ok((CpuStorage::F32(sum.into_iter().map(|s| s as f32).collect()), Shape::from(n)))
    }
}

/// The rotation of each position's halves by its angles; `inverse` rotates back, which is
/// the rotation's gradient (it is orthogonal, and `cos` and `sin` are constants).
struct Rope {
    inverse: bool,
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "wirl-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, cos, sin) = (values(s1, l1, self.name())?, values(s2, l2, self.name())?, values(s3, l3, self.name())?);
        let dims = l1.dims();
        let (len, dim) = match dims {
            [.., len, dim] => (*len, *dim),
            _ => bail!("{}: expects [.., len, dim], got {dims:?}", self.name()),
        };
        let half = dim / 2;
        if dim % 2 != 0 || cos.len() != len * half || sin.len() != len * half {
            bail!("{}: tables of {} values for {len} positions of {dim}", self.name(), cos.len());
        }
        let sign = if self.inverse { -1f32 } else { 1.0 };
        let out = by_rows(x.len(), dim, dim, |r, out| {
            let position = r % len;
            let (c, s) = (&cos[position * half..][..half], &sin[position * half..][..half]);
            let row = &x[r * dim..(r + 1) * dim];
            let (x1, x2) = row.split_at(half);
            let (o1, o2) = out.split_at_mut(half);
            for i in 0..half {
                let (c, s) = (c[i], sign * s[i]);
                o1[i] = x1[i] * c - x2[i] * s;
                o2[i] = x2[i] * c + x1[i] * s;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let back = Rope { inverse: !self.inverse };
        Ok((Some(grad.contiguous()?.apply_op3_no_bwd(cos, sin, &back)?), None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The fused op and the composed one (its `fast = false` path, what other devices
    /// run), forward and backward, on the same values.
    fn compare(
        shape: &[usize],
        fused: impl Fn(&Tensor) -> Result<Tensor>,
        composed: impl Fn(&Tensor) -> Result<Tensor>,
    ) {
        let device = Device::Cpu;
        let x = Var::from_tensor(&(Tensor::randn(0f32, 1.0, shape, &device).unwrap() * 3.0).unwrap()).unwrap();
        let upstream = Tensor::randn(0f32, 1.0, shape, &device).unwrap();
        let run = |f: &dyn Fn(&Tensor) -> Result<Tensor>| {
            let y = f(x.as_tensor()).unwrap();
            let grads = (&y * &upstream).unwrap().sum_all().unwrap().backward().unwrap();
            (y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), grads.get(&x).unwrap().flatten_all().unwrap())
        };
        let ((y1, g1), (y2, g2)) = (run(&fused), run(&composed));
        let close = |a: &[f32], b: &[f32], what: &str| {
            let worst = a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{what}: differs by {worst}");
        };
        close(&y1, &y2, "output");
        close(&g1.to_vec1::<f32>().unwrap(), &g2.to_vec1::<f32>().unwrap(), "gradient");
    }

    #[test]
    fn softmax_matches_the_composed_ops_with_masked_keys() {
        let mask = |x: &Tensor| -> Result<Tensor> {
            // A causal mask as attention adds it: -inf above the diagonal.
            let (q, k) = (x.dim(D::Minus2)?, x.dim(D::Minus1)?);
            let values: Vec<f32> =
                (0..q).flat_map(|i| (0..k).map(move |j| if j > i + 2 { f32::NEG_INFINITY } else { 0.0 })).collect();
            x.broadcast_add(&Tensor::from_vec(values, (q, k), x.device())?)
        };
        compare(&[2, 3, 5, 7], |x| softmax_last_dim(&mask(x)?, true), |x| softmax_last_dim(&mask(x)?, false));
    }

    #[test]
    fn rms_norm_matches_the_composed_ops_for_input_and_weight() {
        let device = Device::Cpu;
        let weight = Var::from_tensor(&Tensor::randn(1f32, 0.5, 11, &device).unwrap()).unwrap();
        let eps = 1e-5;
        compare(
            &[3, 4, 11],
            |x| rms_norm(x, weight.as_tensor(), eps, true),
            |x| rms_norm(x, weight.as_tensor(), eps, false),
        );
        // The weight's gradient, both ways.
        let x = Tensor::randn(0f32, 2.0, (3, 4, 11), &device).unwrap();
        let upstream = Tensor::randn(0f32, 1.0, (3, 4, 11), &device).unwrap();
        let weight_grad = |y: Tensor| {
            let grads = (y * &upstream).unwrap().sum_all().unwrap().backward().unwrap();
            grads.get(&weight).unwrap().to_vec1::<f32>().unwrap()
        };
        let fused = weight_grad(rms_norm(&x, weight.as_tensor(), eps, true).unwrap());
        let composed = weight_grad(rms_norm(&x, weight.as_tensor(), eps, false).unwrap());
        let worst = fused.iter().zip(&composed).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-4, "weight gradient differs by {worst}");
    }

    #[test]
    fn rope_matches_the_composed_ops() {
        let device = Device::Cpu;
        let angles = Tensor::randn(0f32, 2.0, (5, 4), &device).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        compare(&[2, 3, 5, 8], |x| rope(x, &cos, &sin, true), |x| rope(x, &cos, &sin, false));
    }
}
