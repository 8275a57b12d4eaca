//! Which positions of a group's batch the head must compute.
//!
//! A group trains as a `[rows, width]` batch right-padded to its longest row, and a
//! multi-turn ledger's row holds the environment's tokens between the model's turns. Neither
//! the padding nor the environment's tokens carry loss (their token weights are 0), yet the
//! head — the vocabulary-wide product, the softmax over 49,152 logits for SmolLM2 — ran over
//! every position. The layers must still run there (later turns attend to the feedback); the
//! head need not. [`Kept`] gathers the positions that carry loss into one row for the head and
//! scatters its results back, zeros elsewhere: a log-probability of 0 at a position of weight
//! 0 is the same for the loss as any other value, and it is the same in every pass (the old,
//! the reference and the policy's), so ratios and KL terms there are exactly 1 and 0.

use candle_core::{Device, Result, Tensor};

/// One part of a group trained together: its completions (or ledgers) and which of their
/// positions the head computes.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub completions: &'a [Vec<u32>],
    /// `None`: every position of the padded batch, the padding's too (the head as a plain
    /// forward computes it). `Some(mask)`: only completion tokens, and where `mask[row]` is
    /// given only those it marks (`mask[row][i]`: token i of the row carries loss); an empty
    /// mask marks every token (single-turn groups: only the padding is skipped).
    pub trained: Option<&'a [Vec<bool>]>,
}

impl<'a> Part<'a> {
    /// The head over every position, the padding's too.
    pub fn every_position(completions: &'a [Vec<u32>]) -> Self {
        Part { completions, trained: None }
    }

    /// The head only where a token carries loss (`trained` as [`Part::trained`] says).
    pub fn trained(completions: &'a [Vec<u32>], trained: &'a [Vec<bool>]) -> Self {
        Part { completions, trained: Some(trained) }
    }
}

/// The positions of a `[rows, width]` batch that carry loss, as flat indices `row·width + i`.
pub(crate) struct Kept {
    index: Tensor,
    rows: usize,
    width: usize,
}

impl Kept {
    /// The positions of `part` (padded to `width`) whose tokens carry loss; `None` when the
    /// part asks for every position, when that is all of them (nothing to skip) or none
    /// (nothing to gather: the head runs over every position, as before).
    pub(crate) fn of(part: &Part<'_>, width: usize, device: &Device) -> Result<Option<Kept>> {
        let Some(trained) = part.trained else { return Ok(None) };
        let rows = part.completions.len();
        let mut index = Vec::new();
        for (row, completion) in part.completions.iter().enumerate() {
            let mask = trained.get(row);
            for i in 0..completion.len().min(width) {
                let carries_loss = match mask {
                    Some(mask) => mask.get(i).copied().unwrap_or(false),
                    None => trained.is_empty(),
                };
                if carries_loss {
                    index.push(u32::try_from(row * width + i).map_err(candle_core::Error::wrap)?);
                }
            }
        }
        if index.is_empty() || index.len() == rows * width {
            return Ok(None);
        }
        let len = index.len();
        Ok(Some(Kept { index: Tensor::from_vec(index, len, device)?, rows, width }))
    }

    /// `t` (`[rows, width, ...]`) at the kept positions, as one row: `[1, kept, ...]`.
    pub(crate) fn gather(&self, t: &Tensor) -> Result<Tensor> {
        let inner = t.dims()[2..].to_vec();
        let flat: Vec<usize> = std::iter::once(self.rows * self.width).chain(inner).collect();
        t.reshape(flat)?.index_select(&self.index, 0)?.unsqueeze(0)
    }

    /// The inverse of [`Kept::gather`]: `t` (`[1, kept, ...]`) back at its positions of a
    /// `[rows, width, ...]` tensor, zeros elsewhere (differentiable: its gradient is the
    /// gathered gradient).
    pub(crate) fn scatter(&self, t: &Tensor) -> Result<Tensor> {
        let inner = t.dims()[2..].to_vec();
        let flat: Vec<usize> = std::iter::once(self.rows * self.width).chain(inner.iter().copied()).collect();
        let zeros = Tensor::zeros(flat, t.dtype(), t.device())?;
        let full: Vec<usize> = [self.rows, self.width].into_iter().chain(inner).collect();
        zeros.index_add(&self.index, &t.squeeze(0)?.contiguous()?, 0)?.reshape(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_completion_tokens_that_carry_loss_and_puts_them_back() {
        let completions = vec![vec![5, 6, 7], vec![8]];
        // Row 0's second token is the environment's; row 1 is padded by two positions.
        let trained = vec![vec![true, false, true], vec![true]];
        let kept = Kept::of(&Part::trained(&completions, &trained), 3, &Device::Cpu)
            .unwrap()
            .expect("some positions are skipped");
        assert_eq!(kept.index.to_vec1::<u32>().unwrap(), [0, 2, 3]);
        let t = Tensor::arange(0f32, 12.0, &Device::Cpu).unwrap().reshape((2, 3, 2)).unwrap();
        let gathered = kept.gather(&t).unwrap();
        assert_eq!(gathered.to_vec3::<f32>().unwrap(), [[[0.0, 1.0], [4.0, 5.0], [6.0, 7.0]]]);
        let back = kept.scatter(&gathered).unwrap();
        assert_eq!(
            back.to_vec3::<f32>().unwrap(),
            [[[0.0, 1.0], [0.0, 0.0], [4.0, 5.0]], [[6.0, 7.0], [0.0, 0.0], [0.0, 0.0]]]
        );
        // An empty mask skips only the padding; every position asked for, nothing to skip, or
        // nothing kept: none.
        let kept = Kept::of(&Part::trained(&completions, &[]), 3, &Device::Cpu).unwrap().unwrap();
        assert_eq!(kept.index.to_vec1::<u32>().unwrap(), [0, 1, 2, 3]);
        assert!(Kept::of(&Part::every_position(&completions), 3, &Device::Cpu).unwrap().is_none());
        let full = vec![vec![1, 2], vec![3, 4]];
        assert!(Kept::of(&Part::trained(&full, &[]), 2, &Device::Cpu).unwrap().is_none());
        let none = vec![vec![false, false], vec![false, false]];
        assert!(Kept::of(&Part::trained(&full, &none), 2, &Device::Cpu).unwrap().is_none());
    }
}
