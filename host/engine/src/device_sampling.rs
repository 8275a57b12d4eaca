//! Sampling where the logits are (issue 45): each row's token drawn by the inverse of its
//! cumulative weights, and its temperature-1 log-probability, computed with tensor ops on
//! the logits' device; only a token and a log-probability per row come back, not the rows'
//! logits (64 rows × 49,152 floats a decoding step on a GPU).
//!
//! The draw is the host sampler's ([`crate::sampling::sample_with`]) given the same
//! uniform: the first token whose cumulative weight reaches `uniform × total`. The running
//! sum is taken in two levels — sums of blocks of [`BLOCK`] tokens, then the tokens of the
//! chosen block — each level a product with a triangular matrix of ones, so that no op
//! is longer than a block and every op runs on any device. Sums taken in another order
//! round differently: a token differs from the host's only when the draw falls within
//! rounding of a boundary between two tokens — within 1e-5 of the total (a test; on flat
//! rows over the default model's vocabulary 7 of 96 draws did, on peaked rows none). Both
//! are the same distribution to f32's precision.
//!
//! Rows the host must see (top-k, top-p or min-p cuts, `top_logprobs`) are not for this
//! sampler: the caller samples those on the host.

use crate::{Error, Result};
use candle_core::{D, DType, Tensor};

/// Tokens a block of the two-level running sum holds.
pub const BLOCK: usize = 256;

/// One row's draw: its temperature (0: greedy) and its uniform in [0, 1).
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    pub temperature: f32,
    pub uniform: f32,
}

/// The tokens drawn from `logits` (`[rows, vocab]`, any float dtype, any device), one
/// [`Draw`] per row, and their temperature-1 log-probabilities.
pub fn sample_rows(logits: &Tensor, draws: &[Draw]) -> Result<(Vec<u32>, Vec<f32>)> {
    let (rows, vocab) = logits.dims2()?;
    if rows != draws.len() {
        return Err(Error::Input(format!("{} draws for {rows} rows of logits", draws.len())));
    }
    if rows == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let device = logits.device();
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?;
    let shifted = logits.broadcast_sub(&max)?;
    // Greedy rows take their argmax; the others their draw (computed for every row, kept
    // where the temperature is not 0).
    let greedy = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?;
    let inverse_t: Vec<f32> =
        draws.iter().map(|d| if d.temperature > 0.0 { 1.0 / d.temperature } else { 1.0 }).collect();
    let inverse_t = Tensor::from_vec(inverse_t, (rows, 1), device)?;
    // What the host computes: exp((l − max) · 1/t), f32.
    let weights = shifted.broadcast_mul(&inverse_t)?.exp()?;
    let drawn = inverse_cdf(&weights, draws, vocab)?;
    let is_greedy: Vec<u8> = draws.iter().map(|d| u8::from(d.temperature == 0.0)).collect();
    let is_greedy = Tensor::from_vec(is_greedy, rows, device)?;
    let tokens = is_greedy.where_cond(&greedy, &drawn)?;
    // Temperature-1 log-probability of the token: l − (max + ln Σ exp(l − max)).
    let log_norm = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?.broadcast_add(&max)?;
    let chosen = logits.gather(&tokens.unsqueeze(1)?.contiguous()?, D::Minus1)?;
    let logprobs = (chosen - log_norm)?.squeeze(1)?;
    Ok((tokens.to_vec1()?, logprobs.to_vec1()?))
}

/// For each row of `weights` (`[rows, vocab]`, not normalised), the first token whose
/// running sum reaches `uniform × total`.
fn inverse_cdf(weights: &Tensor, draws: &[Draw], vocab: usize) -> Result<Tensor> {
    let rows = draws.len();
    let device = weights.device();
    let blocks = vocab.div_ceil(BLOCK);
    let padded = weights.pad_with_zeros(D::Minus1, 0, blocks * BLOCK - vocab)?.reshape((rows, blocks, BLOCK))?;
    let block_sums = padded.sum(D::Minus1)?;
    let block_running = block_sums.matmul(&ones_on_and_above_diagonal(blocks, device)?)?;
    let total = block_running.narrow(1, blocks - 1, 1)?;
    let uniforms: Vec<f32> = draws.iter().map(|d| d.uniform).collect();
    let target = Tensor::from_vec(uniforms, (rows, 1), device)?.broadcast_mul(&total)?;
    // The first block whose running sum reaches the target: how many fall short of it.
    let block = count_below(&block_running, &target)?.minimum((blocks - 1) as f32)?;
    let block_index = block.to_dtype(DType::U32)?.unsqueeze(1)?.contiguous()?;
    let before = (block_running - &block_sums)?.gather(&block_index, 1)?;
    let rest = (target - before)?;
    let index = block_index.reshape((rows, 1, 1))?.broadcast_as((rows, 1, BLOCK))?.contiguous()?;
    let in_block = padded.gather(&index, 1)?.squeeze(1)?;
    let running = in_block.matmul(&ones_on_and_above_diagonal(BLOCK, device)?)?;
    let offset = count_below(&running, &rest)?.minimum((BLOCK - 1) as f32)?;
    let token = (block.affine(BLOCK as f64, 0.0)? + offset)?.minimum((vocab - 1) as f32)?;
    Ok(token.to_dtype(DType::U32)?)
}

/// `[n, n]` with ones where row ≤ column: `x · it` is the running sum of `x`'s rows.
fn ones_on_and_above_diagonal(n: usize, device: &candle_core::Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..n * n).map(|k| if k / n <= k % n { 1.0 } else { 0.0 }).collect();
    Ok(Tensor::from_vec(values, (n, n), device)?)
}

/// Per row, how many of `running`'s entries are below the row's `target` (f32, `[rows]`).
fn count_below(running: &Tensor, target: &Tensor) -> Result<Tensor> {
    Ok(running.broadcast_lt(target)?.to_dtype(DType::F32)?.sum(D::Minus1)?)
}

#[cfg(test)]
mod tests {
    use super::{Draw, sample_rows};
    use crate::sampling::{Sampling, sample_with};
    use candle_core::{Device, Tensor};

    /// Given the same uniforms, the device sampler draws the host sampler's tokens and
    /// log-probabilities, over a vocabulary of the default model's size (not a multiple of
    /// the block), peaked and flat rows, temperatures 1, 0.7 and 0 (greedy) — up to the
    /// rounding of the running sum: a draw that differs lies within 1e-5 of the total from
    /// a boundary between two tokens (the host sums 49 k weights one after another in f32,
    /// the device in blocks; the f64 sum decides which is nearer).
    #[test]
    fn draws_the_host_samplers_tokens_given_the_same_uniforms() {
        let vocab = 49_152 + 77;
        let mut next = crate::test_values(7);
        let (mut compared, mut near_boundary) = (0, 0);
        for round in 0..12 {
            let rows = 8;
            let sharpness = [0.5f32, 4.0, 20.0][round % 3];
            let logits: Vec<f32> = (0..rows * vocab).map(|_| next() * sharpness).collect();
            let draws: Vec<Draw> = (0..rows)
                .map(|r| Draw {
                    temperature: [1.0, 0.7, 0.0, 1.0][r % 4],
                    uniform: (next() + 0.5).clamp(0.0, 0.999_999),
                })
                .collect();
            let tensor = Tensor::from_vec(logits.clone(), (rows, vocab), &Device::Cpu).unwrap();
            let (tokens, logprobs) = sample_rows(&tensor, &draws).unwrap();
            for (r, draw) in draws.iter().enumerate() {
                let row = &logits[r * vocab..(r + 1) * vocab];
                let settings = Sampling { temperature: draw.temperature, ..Default::default() };
                let (token, logprob) = sample_with(&settings, row, draw.uniform);
                compared += 1;
                if token == tokens[r] {
                    assert!((logprob - logprobs[r]).abs() < 1e-4, "row {r}: {logprob} vs {}", logprobs[r]);
                    continue;
                }
                // Sums in another order: only a draw within rounding of a boundary may land
                // on a neighbour.
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f64> = row.iter().map(|&l| f64::from(((l - max) / draw.temperature).exp())).collect();
                let total: f64 = weights.iter().sum();
                let boundary: f64 = weights[..=token.min(tokens[r]) as usize].iter().sum();
                let distance = (boundary - f64::from(draw.uniform) * total).abs() / total;
                assert!(distance < 1e-5, "row {r}: {token} vs {} at {distance}", tokens[r]);
                near_boundary += 1;
            }
        }
        assert_eq!(compared, 96);
        // Flat rows over 49,229 tokens give each token ~2e-5 of the mass, so a running sum
        // that rounds by 1e-6 of its total moves a few draws to a neighbour (7 of 96 here,
        // all within 6e-6 of a boundary); peaked rows never.
        assert!(near_boundary <= 10, "{near_boundary} of {compared} draws landed on a neighbour");
    }

    #[test]
    fn rows_and_draws_must_agree() {
        let logits = Tensor::zeros((2, 10), candle_core::DType::F32, &Device::Cpu).unwrap();
        let error = sample_rows(&logits, &[Draw { temperature: 1.0, uniform: 0.5 }]).unwrap_err().to_string();
        assert!(error.contains("1 draws for 2 rows"), "{error}");
    }
}
