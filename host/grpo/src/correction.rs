//! Rollout correction: importance weights for tokens a sampler drew with log-probs other
//! than the learner's — a bf16 or quantized sampler copy, a generation lag, a GPU — as TRL
//! defines them (`vllm_importance_sampling_mode`, TRL 1.16 `GRPOTrainer`; verl's rollout
//! correction names the same two ideas token-level TIS and MIS). With
//! `d = (log π_old − log π_sampler)` over a row's trained tokens:
//! - `token_truncate`: each token's weight `clamp(exp(d_t), min, max)`;
//! - `token_mask`: `exp(d_t)`, or 0 where it falls outside `[min, max]`;
//! - `sequence_truncate`: one weight per row, `clamp(exp(Σ_t d_t), min, max)`;
//! - `sequence_mask`: `exp(Σ_t d_t)`, or 0 for the whole row outside `[min, max]`.
//!
//! The weight multiplies each token's policy term (here: its advantage, which a weight ≥ 0
//! commutes with through the clipped minimum); the KL term is not weighted. On the CPU in f32
//! the sampler is the learner to the bit (`wirl_model::invariant`), so every weight is 1.

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// Which correction (`grpo.rollout_correction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionMode {
    /// No weight (groups sampled a step behind keep `grpo.tis_cap`'s truncation).
    #[default]
    Off,
    TokenTruncate,
    TokenMask,
    SequenceTruncate,
    SequenceMask,
}

impl CorrectionMode {
    fn per_sequence(self) -> bool {
        matches!(self, CorrectionMode::SequenceTruncate | CorrectionMode::SequenceMask)
    }

    fn masks(self) -> bool {
        matches!(self, CorrectionMode::TokenMask | CorrectionMode::SequenceMask)
    }
}

/// A correction and its bounds (TRL's `vllm_importance_sampling_clip_min` / `_max`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RolloutCorrection {
    pub mode: CorrectionMode,
    /// Lower bound; none: no lower bound.
    pub min: Option<f64>,
    /// Upper bound; none: no upper bound.
    pub max: Option<f64>,
}

impl Default for RolloutCorrection {
    fn default() -> Self {
        RolloutCorrection { mode: CorrectionMode::Off, min: None, max: Some(3.0) }
    }
}

impl RolloutCorrection {
    pub fn is_on(&self) -> bool {
        self.mode != CorrectionMode::Off
    }

    /// The weights of a micro-batch's tokens, `[rows, width]` (token modes) or `[rows, 1]`
    /// (sequence modes), from the learner's old log-probs `old` and the sampler's `sampler`
    /// (`[rows, width]`) over the `active` tokens (1 where a token is trained, else 0); and
    /// how many active tokens had their weight changed by the bounds (truncated or masked).
    pub fn weights(&self, old: &Tensor, sampler: &Tensor, active: &Tensor) -> Result<(Tensor, f32)> {
        let diff = ((old - sampler)? * active)?;
        let diff = if self.mode.per_sequence() { diff.sum_keepdim(1)? } else { diff };
        let ratio = diff.exp()?;
        let (low, high) = (self.min.unwrap_or(f64::NEG_INFINITY), self.max.unwrap_or(f64::INFINITY));
        let outside = (ratio.lt(low)?.to_dtype(ratio.dtype())? + ratio.gt(high)?.to_dtype(ratio.dtype())?)?;
        let weights = if self.mode.masks() {
            (&ratio * (1.0 - &outside)?)?
        } else {
            ratio.clamp(low.max(f64::from(f32::MIN)), high.min(f64::from(f32::MAX)))?
        };
        let cut = outside.broadcast_mul(active)?.sum_all()?.to_scalar::<f32>()?;
        Ok((weights, cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// TRL's numbers: `tests/fixtures/rollout-correction.json`, written by
    /// `rollout-correction.py` from TRL 1.16's `GRPOTrainer` formula in torch.
    #[test]
    fn weights_are_trls_in_every_mode() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/rollout-correction.json");
        let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let matrix = |key: &str| -> Tensor {
            let rows: Vec<Vec<f32>> = serde_json::from_value(fixture[key].clone()).unwrap();
            Tensor::new(rows, &Device::Cpu).unwrap()
        };
        let (old, sampler, active) = (matrix("old"), matrix("sampler"), matrix("mask"));
        let cases = fixture["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 8, "four modes, with and without a lower bound");
        for case in cases {
            let mode: CorrectionMode = serde_json::from_value(case["mode"].clone()).unwrap();
            let correction = RolloutCorrection { mode, min: case["min"].as_f64(), max: case["max"].as_f64() };
            let (weights, cut) = correction.weights(&old, &sampler, &active).unwrap();
            let want: Vec<Vec<f32>> = serde_json::from_value(case["weights"].clone()).unwrap();
            let got: Vec<Vec<f32>> = weights.to_vec2().unwrap();
            assert_eq!(got.len(), want.len(), "{case}");
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{mode:?}: {got:?} vs TRL's {want:?}");
            }
            assert_eq!(got[0].len(), if mode.per_sequence() { 1 } else { 5 }, "{mode:?}");
            assert_eq!(cut, case["cut"].as_f64().unwrap() as f32, "{mode:?}");
        }
    }

    #[test]
    fn equal_log_probs_weigh_one_whatever_the_mode() {
        let logp = Tensor::new(&[[-0.5f32, -1.0, -2.0], [-0.1, -3.0, -0.7]], &Device::Cpu).unwrap();
        let active = Tensor::new(&[[1f32, 1.0, 0.0], [1.0, 1.0, 1.0]], &Device::Cpu).unwrap();
        for mode in [
            CorrectionMode::TokenTruncate,
            CorrectionMode::TokenMask,
            CorrectionMode::SequenceTruncate,
            CorrectionMode::SequenceMask,
        ] {
            let correction = RolloutCorrection { mode, min: Some(0.5), max: Some(2.0) };
            let (weights, cut) = correction.weights(&logp, &logp, &active).unwrap();
            assert!(weights.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|&w| w == 1.0), "{mode:?}");
            assert_eq!(cut, 0.0);
        }
    }
}
