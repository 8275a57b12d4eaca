//! The seam between the learner that writes a model's weights in place and whatever reads
//! them while it does (issue 61): the learner holds the weights through a [`WeightsBarrier`]
//! before each optimizer step, knowing nothing of what is behind it — the engine's batching
//! actor in a trainer, nothing in a test — and refreshes the readers' own copies of the
//! weights (a bf16 sampler beside f32 variables) through a [`WeightMirror`] while it holds
//! them.

use crate::Result;
use candle_core::Tensor;

/// Blocks whoever reads the weights, so that they can be changed in place.
pub trait WeightsBarrier: Send + Sync {
    /// Block until nothing reads the weights; nothing does until the returned hold drops.
    fn hold_weights(&self) -> Result<WeightsHold>;
}

/// While alive, nothing reads the weights: whoever holds it may change them in place.
/// Dropping it releases the readers (the engine then counts a new weights version, which
/// every later completion carries).
pub struct WeightsHold {
    /// Dropped with the hold: what lets the readers go on (the engine's release channel).
    _release: Box<dyn Send + Sync>,
    /// The version of the weights now being changed.
    pub version: u64,
}

impl WeightsHold {
    /// A hold on weights at `version`, released when `release` is dropped.
    pub fn new(release: impl Send + Sync + 'static, version: u64) -> Self {
        WeightsHold { _release: Box::new(release), version }
    }
}

/// A model's own copies of trained weights, each paired with the weights it copies: after an
/// update of those, [`WeightMirror::refresh`] writes them into the copies in place, on their
/// device (no host round trip), converting the dtype. Call it while the weights are held
/// ([`WeightsBarrier::hold_weights`]): no row samples from half-written weights.
#[derive(Debug, Default)]
pub struct WeightMirror {
    /// Each trained tensor, its copy, and the row of the copy where it starts (a fused copy
    /// holds several).
    pairs: Vec<(Tensor, Tensor, usize)>,
}

impl WeightMirror {
    /// A mirror of `pairs`: each trained tensor, its copy, and the copy's row where it starts.
    pub fn new(pairs: Vec<(Tensor, Tensor, usize)>) -> Self {
        WeightMirror { pairs }
    }

    /// Whether there is anything to refresh (the model shares its weights' storage).
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Bytes of the copies refreshed.
    pub fn bytes(&self) -> u64 {
        self.pairs.iter().map(|(source, copy, _)| (source.elem_count() * copy.dtype().size_in_bytes()) as u64).sum()
    }

    /// Every copy overwritten with its source's values (converted).
    pub fn refresh(&self) -> Result<()> {
        for (source, copy, row) in &self.pairs {
            copy.slice_set(&source.to_dtype(copy.dtype())?, 0, *row)?;
        }
        Ok(())
    }
}
