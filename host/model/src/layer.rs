//! The family variants' layer math that the engine's decoder (`llama.rs`) and the learner's
//! forward (`wirl-grpo`'s `policy.rs`) both apply, written once: which keys a query sees
//! (causal, padding, Gemma 3's sliding window), Gemma's scaled embeddings, `1 + w` norms and
//! soft-capped logits, and the MLP's gate activation. A variant added here reaches both
//! sides; the layers' composition is `decoder.rs`'s, the reductions `invariant.rs`'s.

use crate::config::{Activation, Config};
use candle_core::{DType, Device, Result, Tensor};

/// Whether query position `query` (counting from the row's first cache position) sees key
/// position `key`: not after it, within `window` of it (`None`: no window), and not padding
/// (`key < pad`) — except that a padding position sees itself, so that no softmax row is all
/// −∞ (a NaN there would leak into real rows through 0 × NaN).
pub fn sees(query: usize, key: usize, pad: usize, window: Option<usize>) -> bool {
    let window = window.unwrap_or(usize::MAX);
    if key == query {
        return true;
    }
    key < query && query - key < window && key >= pad
}

/// The additive mask of one row, `[len, past + len]` row-major: 0 where query `past + q`
/// [`sees`] key `k`, −∞ elsewhere.
pub fn mask_values(len: usize, past: usize, pad: usize, window: Option<usize>) -> Vec<f32> {
    let total = past + len;
    (0..len)
        .flat_map(|q| (0..total).map(move |k| if sees(past + q, k, pad, window) { 0.0 } else { f32::NEG_INFINITY }))
        .collect()
}

/// [`mask_values`] of one unpadded row as a tensor `[len, past + len]` in `dtype`.
pub fn causal_mask(len: usize, past: usize, window: Option<usize>, device: &Device, dtype: DType) -> Result<Tensor> {
    Tensor::from_vec(mask_values(len, past, 0, window), (len, past + len), device)?.to_dtype(dtype)
}

/// What one step's layers share — rope tables and a mask, say — for the global layers and,
/// where the family slides, Gemma 3's sliding layers (their own rope base and window): built
/// once per step by each side, chosen per layer here.
#[derive(Clone, Debug)]
pub struct Frames<T> {
    pub global: T,
    pub local: Option<T>,
}

impl<T> Frames<T> {
    /// The frames of a step: `part(cos, sin, window)` over the global rope tables `rope`
    /// (no window), and over the sliding layers' `local_rope` with the family's window where
    /// some layer slides.
    pub fn new<E>(
        config: &Config,
        rope: (&Tensor, &Tensor),
        local_rope: Option<&(Tensor, Tensor)>,
        mut part: impl FnMut(&Tensor, &Tensor, Option<usize>) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        let local = match (local_rope, config.window()) {
            (Some((cos, sin)), Some(window)) => Some(part(cos, sin, Some(window))?),
            _ => None,
        };
        Ok(Frames { global: part(rope.0, rope.1, None)?, local })
    }

    /// The frame of a layer that slides (`Config::layer_is_sliding`) or not.
    pub fn of_layer(&self, sliding: bool) -> &T {
        match &self.local {
            Some(local) if sliding => local,
            _ => &self.global,
        }
    }
}

/// The embeddings as the family scales them (Gemma: by `√hidden_size`).
pub fn scale_embeddings(x: Tensor, config: &Config) -> Result<Tensor> {
    match config.embed_scale() {
        Some(scale) => x * scale,
        None => Ok(x),
    }
}

/// A norm's weight as the family applies it: Gemma's `1 + w`. Computed on every call: the
/// weight's storage may be a trainer's, updated in place (and the learner's gradient reaches
/// `w` through the sum).
/// `offset`: the family's ([`Config::norm_offset`]).
pub fn norm_weight(weight: &Tensor, offset: f64) -> Result<Tensor> {
    if offset == 0.0 { Ok(weight.clone()) } else { weight + offset }
}

/// The logits as the family caps them (Gemma: `cap · tanh(z / cap)`).
pub fn softcap(logits: Tensor, config: &Config) -> Result<Tensor> {
    match config.logit_softcap() {
        Some(cap) => (logits / cap)?.tanh()? * cap,
        None => Ok(logits),
    }
}

/// The MLP's gate through the family's activation.
pub fn gate_activation(gate: &Tensor, activation: Activation) -> Result<Tensor> {
    match activation {
        Activation::Silu => gate.silu(),
        Activation::GeluTanh => gate.gelu(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_sees_its_past_within_the_window_and_not_the_padding() {
        // Causal: the key after the query is hidden; the query itself is seen.
        assert!(sees(4, 4, 0, None) && sees(4, 0, 0, None) && !sees(4, 5, 0, None));
        // A window of 3: keys 2, 3, 4 for query 4.
        assert!(sees(4, 2, 0, Some(3)) && !sees(4, 1, 0, Some(3)));
        // Two padding positions: hidden from real queries, each seeing itself.
        assert!(!sees(4, 1, 2, None) && sees(4, 2, 2, None) && sees(1, 1, 2, None) && !sees(1, 0, 2, None));
        let m = mask_values(2, 1, 0, None);
        assert_eq!(m, [0.0, 0.0, f32::NEG_INFINITY, 0.0, 0.0, 0.0]);
    }
}
