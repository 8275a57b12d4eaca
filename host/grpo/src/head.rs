//! The head's token statistics and their gradient, fused (Liger's fused linear cross-entropy
//! is the anchor): per chunk of positions, one `[positions, vocab]` buffer holds the logits,
//! then, in place, their gradient; the weight's gradient is added into its sum by the matrix
//! product itself.
//!
//! Written by hand rather than from candle's ops because the vocabulary is wide: candle's
//! log-softmax, gather, entropy and their backward make about ten `[positions, vocab]`
//! temporaries and a fresh `[vocab, hidden]` weight gradient per chunk (113 MB for a
//! 49,152 × 576 head), and on the CPU those allocations, their page faults and the passes
//! over them cost more than the products. The math, per position with logits z, target t
//! and p = softmax(z):
//!   log p_t = z_t − lse,   H = lse − Σ_j p_j z_j,
//!   ∂(a·log p_t + b·H)/∂z_j = a (δ_jt − p_j) − b p_j (z_j − lse + H).

use crate::grads::in_row_parts;
use gemm::Parallelism;

/// The stats of `n` positions: the target's log-probability, the entropy, and the
/// log-sum-exp the gradient needs.
pub(crate) struct HeadStats {
    pub logp: Vec<f32>,
    pub entropy: Vec<f32>,
    pub lse: Vec<f32>,
}

/// Logits `z = h · Wᵀ` (`[n, v]`) of hidden states `h` (`[n, d]`) through the head `w`
/// (`[v, d]`), all row-major.
pub(crate) fn logits(h: &[f32], w: &[f32], n: usize, d: usize, v: usize) -> Vec<f32> {
    if wirl_model::invariant::available() {
        // The sampler's logits to the bit: one order of summation at every row count.
        return wirl_model::invariant::matmul_t_slices(h, n, w, v, d);
    }
    let mut z = vec![0f32; n * v];
    product(&mut z, [n, v, d], false, rows(h, d), transposed(w, d));
    z
}

/// The stats of each row of `z` (`[n, v]`) for its target.
pub(crate) fn stats(z: &[f32], targets: &[u32], v: usize) -> HeadStats {
    let n = targets.len();
    assert_eq!(z.len(), n * v, "logits shape");
    // One (logp, entropy, lse) triple per row, filled by parts of rows.
    let mut out = vec![0f32; n * 3];
    in_row_parts(&mut out, 3, v, |first, part| {
        for (k, row) in part.chunks_mut(3).enumerate() {
            let i = first + k;
            let zs = &z[i * v..(i + 1) * v];
            let max = zs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut sum, mut weighted) = (0f64, 0f64);
            for &x in zs {
                let e = f64::from((x - max).exp());
                sum += e;
                weighted += e * f64::from(x);
            }
            // The sampler's log-norm (`wirl_model::invariant::log_norm`: the same sum).
            let lse = wirl_model::invariant::log_norm_from(max, zs.iter().map(|&x| (x - max).exp()));
            row[0] = zs[targets[i] as usize] - lse;
            row[1] = lse - (weighted / sum) as f32;
            row[2] = lse;
        }
    });
    let column = |c: usize| out.iter().skip(c).step_by(3).copied().collect::<Vec<f32>>();
    HeadStats { logp: column(0), entropy: column(1), lse: column(2) }
}

/// Turn the logits `z` into the gradient of Σ_i (d_logp_i · log p_t(i) + d_entropy_i · H_i)
/// with respect to them, in place.
pub(crate) fn logits_grad_in_place(
    z: &mut [f32],
    targets: &[u32],
    stats: &HeadStats,
    d_logp: &[f32],
    d_entropy: Option<&[f32]>,
    v: usize,
) {
    in_row_parts(z, v, v, |first, part| {
        for (k, row) in part.chunks_mut(v).enumerate() {
            let i = first + k;
            let (a, b) = (d_logp[i], d_entropy.map_or(0.0, |d| d[i]));
            let (lse, entropy) = (stats.lse[i], stats.entropy[i]);
            for x in row.iter_mut() {
                let log_p = *x - lse;
                let p = log_p.exp();
                *x = -a * p - b * p * (log_p + entropy);
            }
            row[targets[i] as usize] += a;
        }
    });
}

/// `dst += dzᵀ · h`: the head weight's gradient (`[v, d]`) from the logits' (`[n, v]`).
pub(crate) fn add_weight_grad(dst: &mut [f32], dz: &[f32], h: &[f32], n: usize, d: usize, v: usize) {
    product(dst, [v, d, n], true, transposed(dz, v), rows(h, d));
}

/// `dz · W`: the gradient with respect to the hidden states (`[n, d]`).
pub(crate) fn input_grad(dz: &[f32], w: &[f32], n: usize, d: usize, v: usize) -> Vec<f32> {
    let mut dh = vec![0f32; n * d];
    product(&mut dh, [n, d, v], false, rows(dz, v), rows(w, d));
    dh
}

/// A matrix for [`product`]: its values and the steps between columns and between rows.
struct View<'a> {
    values: &'a [f32],
    column_step: usize,
    row_step: usize,
}

/// `values` as a row-major matrix of rows of `width`.
fn rows(values: &[f32], width: usize) -> View<'_> {
    View { values, column_step: 1, row_step: width }
}

/// The transpose of `values` read as a row-major matrix of rows of `width`.
fn transposed(values: &[f32], width: usize) -> View<'_> {
    View { values, column_step: width, row_step: 1 }
}

/// `dst` (`[m, n]`, row-major) = lhs (`[m, k]`) · rhs (`[k, n]`), or `+=` if `accumulate`.
fn product(dst: &mut [f32], [m, n, k]: [usize; 3], accumulate: bool, lhs: View, rhs: View) {
    // The last element each view is read at must lie inside it.
    let fits = |view: &View, r: usize, c: usize| {
        r == 0 || c == 0 || (r - 1) * view.row_step + (c - 1) * view.column_step < view.values.len()
    };
    assert!(dst.len() == m * n && fits(&lhs, m, k) && fits(&rhs, k, n), "matrix shapes");
    // SAFETY: every index gemm reads or writes is inside the slices (asserted above), and
    // `dst` is borrowed mutably, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.values.as_ptr(),
            lhs.column_step as isize,
            lhs.row_step as isize,
            rhs.values.as_ptr(),
            rhs.column_step as isize,
            rhs.row_step as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
}

fn parallelism() -> Parallelism {
    match crate::grads::cores() {
        1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small head by the textbook formulas, in f64.
    fn naive(h: &[f32], w: &[f32], targets: &[u32], n: usize, d: usize, v: usize) -> Vec<(f64, f64, Vec<f64>)> {
        (0..n)
            .map(|i| {
                let z: Vec<f64> =
                    (0..v).map(|j| (0..d).map(|k| f64::from(h[i * d + k]) * f64::from(w[j * d + k])).sum()).collect();
                let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                let p: Vec<f64> = z.iter().map(|x| (x - lse).exp()).collect();
                let entropy = -p.iter().zip(&z).map(|(p, z)| p * (z - lse)).sum::<f64>();
                (z[targets[i] as usize] - lse, entropy, p)
            })
            .collect()
    }

    #[test]
    fn stats_and_gradients_match_the_textbook() {
        let (n, d, v) = (5, 4, 7);
        let h: Vec<f32> = (0..n * d).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect();
        let w: Vec<f32> = (0..v * d).map(|i| ((i * 13 % 9) as f32 - 4.0) / 2.0).collect();
        let targets = [0u32, 6, 3, 3, 1];
        let (d_logp, d_entropy) = ([0.5f32, -1.0, 2.0, 0.0, 1.5], [0.1f32, 0.2, -0.3, 0.4, 0.0]);
        let expected = naive(&h, &w, &targets, n, d, v);
        let mut z = logits(&h, &w, n, d, v);
        let stats = stats(&z, &targets, v);
        for (i, (logp, entropy, _)) in expected.iter().enumerate() {
            assert!((f64::from(stats.logp[i]) - logp).abs() < 1e-5, "logp {i}");
            assert!((f64::from(stats.entropy[i]) - entropy).abs() < 1e-5, "entropy {i}");
        }
        logits_grad_in_place(&mut z, &targets, &stats, &d_logp, Some(&d_entropy), v);
        for (i, (_, entropy, p)) in expected.iter().enumerate() {
            for j in 0..v {
                let log_p = p[j].ln();
                let onehot = f64::from(u8::from(j == targets[i] as usize));
                let want = f64::from(d_logp[i]) * (onehot - p[j]) - f64::from(d_entropy[i]) * p[j] * (log_p + entropy);
                assert!((f64::from(z[i * v + j]) - want).abs() < 1e-5, "dz {i} {j}");
            }
        }
        // dW = dzᵀ h added onto what is there; dh = dz W.
        let mut dw = vec![1f32; v * d];
        add_weight_grad(&mut dw, &z, &h, n, d, v);
        let dh = input_grad(&z, &w, n, d, v);
        for j in 0..v {
            for k in 0..d {
                let want: f32 = 1.0 + (0..n).map(|i| z[i * v + j] * h[i * d + k]).sum::<f32>();
                assert!((dw[j * d + k] - want).abs() < 1e-5, "dw {j} {k}");
            }
        }
        for i in 0..n {
            for k in 0..d {
                let want: f32 = (0..v).map(|j| z[i * v + j] * w[j * d + k]).sum();
                assert!((dh[i * d + k] - want).abs() < 1e-5, "dh {i} {k}");
            }
        }
    }
}
