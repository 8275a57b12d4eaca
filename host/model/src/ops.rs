//! The pieces of a forward that the engine and the learner both build from plain tensor ops
//! (so gradients flow through them): HF's rotary embedding and its tables, grouped-query
//! keys repeated per head, the LoRA pair applied beside a base weight, and a weight widened
//! to its activations' dtype.

use crate::Result;
use crate::config::Config;
use candle_core::{D, DType, Device, Tensor};

/// One adapted projection's matrices, as the engine's linear layer applies them.
#[derive(Clone, Debug)]
pub struct LoraPair {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

impl LoraPair {
    /// The in-memory name of projection `module`'s A matrix (`[rank, in]`), beside the
    /// weight it adapts (the engine's `lora` reads and writes PEFT's names).
    pub fn a_name(module: &str) -> String {
        format!("{module}.lora_A.weight")
    }

    /// The in-memory name of projection `module`'s B matrix (`[out, rank]`).
    pub fn b_name(module: &str) -> String {
        format!("{module}.lora_B.weight")
    }

    /// `scale · (x·Aᵀ)·Bᵀ`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if crate::invariant::applies(x, &self.a) && crate::invariant::applies(x, &self.b) {
            // The learner's adapter to the bit (`invariant.rs`).
            let low = crate::invariant::matmul_t(x, &self.a)?;
            return Ok((crate::invariant::matmul_t(&low, &self.b)? * self.scale)?);
        }
        let low = x.broadcast_matmul(&self.a.t()?)?;
        Ok((low.broadcast_matmul(&self.b.t()?)? * self.scale)?)
    }
}

/// `w` in the dtype of the activations `x` it multiplies: a weight stored in bf16 beside f32
/// activations (a LoRA base kept in half the bytes, `--dtype bf16` on the CPU) is widened
/// for this product only — candle multiplies one dtype, and the sums stay f32.
pub fn computed_as(w: &Tensor, x: &Tensor) -> candle_core::Result<Tensor> {
    if w.dtype() == x.dtype() { Ok(w.clone()) } else { w.to_dtype(x.dtype()) }
}

/// HF's rotary embedding: `x * cos + rotate_half(x) * sin`, with `cos`/`sin` of shape
/// `[batch, 1, len, dim/2]` so that every row has its own positions. Built of plain ops,
/// so gradients flow through it.
pub fn rotate_half_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated_1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let rotated_2 = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Ok(Tensor::cat(&[rotated_1, rotated_2], D::Minus1)?)
}

/// Repeat each key/value head `groups` times (grouped-query attention).
pub fn repeat_kv(x: &Tensor, groups: usize) -> Result<Tensor> {
    if groups == 1 {
        return Ok(x.clone());
    }
    let (batch, kv_heads, len, dim) = x.dims4()?;
    Ok(x.unsqueeze(2)?.expand((batch, kv_heads, groups, len, dim))?.reshape((batch, kv_heads * groups, len, dim))?)
}

/// `cos` and `sin` of every position's rotary angles: `[context, head_dim / 2]` ([`Config::context`]).
pub fn rope_tables(config: &Config, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    tables_of(config, config.rope_inv_freq(), device, dtype)
}

/// The sliding layers' rope tables (Gemma 3's local base), if any layer slides.
pub fn local_rope_tables(config: &Config, device: &Device, dtype: DType) -> Result<Option<(Tensor, Tensor)>> {
    config.local_rope_inv_freq().map(|inv_freq| tables_of(config, inv_freq, device, dtype)).transpose()
}

fn tables_of(config: &Config, inv_freq: Vec<f32>, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    let half = inv_freq.len();
    let positions = config.context();
    let mut angles = Vec::with_capacity(positions * half);
    for p in 0..positions {
        angles.extend(inv_freq.iter().map(|f| p as f32 * f));
    }
    let angles = Tensor::from_vec(angles, (positions, half), device)?;
    Ok((angles.cos()?.to_dtype(dtype)?, angles.sin()?.to_dtype(dtype)?))
}
