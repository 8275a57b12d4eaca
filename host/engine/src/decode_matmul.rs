//! The decoding matmul on the CPU: `y = x · Wᵀ` for a few rows of `x` (one per sequence in
//! the batch) against an f32 weight `[out, in]` as HF stores it.
//!
//! Decoding G samples makes every linear a matrix of G rows times the whole weight matrix.
//! gemm treats that as a general product and packs (copies) one operand on every call; at
//! G = 8 the packing and the two workers' hand-offs took more time than the arithmetic
//! (docs/BENCHMARKS.md). Here each weight row is read once from memory, straight from the
//! model's storage, and multiplied with every row of `x` while it is in registers: the step
//! costs about what streaming the weights costs. Output rows are split between candle's
//! rayon threads.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape};
use rayon::prelude::*;

/// Fewer weights than this (a key/value projection of a small model) are not worth waking
/// a second thread for.
const PARALLEL_MIN_WEIGHTS: usize = 256 * 1024;

/// Whether [`FewRowMatmul`] has a fast kernel on this CPU; otherwise callers use gemm.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x [rows, in] · w [out, in]ᵀ → [rows, out]`, both f32, contiguous, on the CPU. Only
/// built when [`available`] says so.
pub(crate) struct FewRowMatmul;

impl CustomOp2 for FewRowMatmul {
    fn name(&self) -> &'static str {
        "few-row-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (xs, ws) else {
            candle_core::bail!("few-row-matmul takes f32 inputs")
        };
        let (Some((x0, x1)), Some((w0, w1))) = (xl.contiguous_offsets(), wl.contiguous_offsets()) else {
            candle_core::bail!("few-row-matmul takes contiguous inputs")
        };
        let (rows, inner) = xl.shape().dims2()?;
        let (out, w_inner) = wl.shape().dims2()?;
        if inner != w_inner {
            candle_core::bail!("few-row-matmul: x has {inner} columns, the weight {w_inner}")
        }
        let y = matmul(&x[x0..x1], rows, &w[w0..w1], out, inner);
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }
}

/// One product's operands: `x [rows, inner]`, `w [out, inner]` and the output
/// `y [rows, out]`, which threads share, each writing its own output columns.
#[derive(Clone, Copy)]
struct Product<'a> {
    x: &'a [f32],
    rows: usize,
    w: &'a [f32],
    inner: usize,
    y: *mut f32,
    out: usize,
}
// SAFETY: `y` is only written, at disjoint elements (each thread its own output columns),
// and the owner waits for all threads before reading it.
unsafe impl Send for Product<'_> {}
unsafe impl Sync for Product<'_> {}

fn matmul(x: &[f32], rows: usize, w: &[f32], out: usize, inner: usize) -> Vec<f32> {
    assert!(available(), "few-row-matmul called without AVX2 and FMA");
    assert_eq!(x.len(), rows * inner);
    assert_eq!(w.len(), out * inner);
    let mut y = vec![0f32; rows * out];
    let product = Product { x, rows, w, inner, y: y.as_mut_ptr(), out };
    let run = |start: usize, end: usize| {
        // SAFETY: AVX2 and FMA are present (asserted above); the slices hold `rows × inner`
        // and `out × inner` values and `y` holds `rows × out`; [start, end) ⊆ [0, out).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx2::columns(product, start, end)
        }
    };
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 || out * inner < PARALLEL_MIN_WEIGHTS {
        run(0, out);
    } else {
        // A few chunks per thread, so a thread held up elsewhere does not hold the step.
        let chunk = out.div_ceil(threads * 4).next_multiple_of(3);
        (0..out.div_ceil(chunk)).into_par_iter().for_each(|c| run(c * chunk, ((c + 1) * chunk).min(out)));
    }
    y
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Product;
    use std::arch::x86_64::*;

    /// Output columns [start, end) of `y [rows, out]`: weight rows in blocks of `M`, times
    /// rows of `x` in blocks of `N`, so that a block's `M × N` sums stay in registers
    /// (16 ymm: `M·N` sums, `M` weight vectors and `N` input vectors). Measured on one
    /// decoding step's linears at 8 rows (Zen 3, 2 threads): 3 × 3 blocks 30 ms, 2 × 4 31 ms,
    /// 1 × 8 33 ms; the weights alone stream in 23 ms (what 1 row takes).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn columns(p: Product, start: usize, end: usize) {
        let mut o = start;
        while o < end {
            let left = end - o;
            // Few rows of x: more weight rows per block, for enough independent sums.
            if p.rows <= 2 && left >= 4 {
                unsafe { rows_of_x::<4>(p, o) };
                o += 4;
            } else if left >= 3 {
                unsafe { rows_of_x::<3>(p, o) };
                o += 3;
            } else if left >= 2 {
                unsafe { rows_of_x::<2>(p, o) };
                o += 2;
            } else {
                unsafe { rows_of_x::<1>(p, o) };
                o += 1;
            }
        }
    }

    /// Weight rows [o, o + M) against every row of x.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn rows_of_x<const M: usize>(p: Product, o: usize) {
        let mut r = 0;
        while r < p.rows {
            let n = p.rows - r;
            unsafe {
                if n >= 3 && M == 3 {
                    block::<M, 3>(p, o, r);
                    r += 3;
                } else if n >= 4 && M <= 2 {
                    block::<M, 4>(p, o, r);
                    r += 4;
                } else if n >= 2 {
                    block::<M, 2>(p, o, r);
                    r += 2;
                } else {
                    block::<M, 1>(p, o, r);
                    r += 1;
                }
            }
        }
    }

    /// `y[r + j][o + i] = w[o + i] · x[r + j]` for i < M, j < N.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block<const M: usize, const N: usize>(p: Product, o: usize, r: usize) {
        let Product { x, w, inner, y, out, .. } = p;
        let wp = unsafe { w.as_ptr().add(o * inner) };
        let xp = unsafe { x.as_ptr().add(r * inner) };
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let vectors = inner / 8;
        for c in 0..vectors {
            let mut xv = [_mm256_setzero_ps(); N];
            for (j, v) in xv.iter_mut().enumerate() {
                *v = unsafe { _mm256_loadu_ps(xp.add(j * inner + c * 8)) };
            }
            for (i, sums) in acc.iter_mut().enumerate() {
                // Ask for the next block's weights while this one computes: decoding is
                // bound by how fast the weights stream in. (A hint: never faults.)
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add((M + i) * inner + c * 8) as *const i8);
                let wv = unsafe { _mm256_loadu_ps(wp.add(i * inner + c * 8)) };
                for (sum, xj) in sums.iter_mut().zip(&xv) {
                    *sum = _mm256_fmadd_ps(wv, *xj, *sum);
                }
            }
        }
        for (i, sums) in acc.iter().enumerate() {
            for (j, sum) in sums.iter().enumerate() {
                let mut total = horizontal_sum(*sum);
                for k in vectors * 8..inner {
                    total += w[(o + i) * inner + k] * x[(r + j) * inner + k];
                }
                unsafe { *y.add((r + j) * out + o + i) = total };
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn horizontal_sum(v: __m256) -> f32 {
        let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
        _mm_cvtss_f32(_mm_add_ss(quad, _mm_shuffle_ps(quad, quad, 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_the_plain_product_for_every_shape_and_remainder() {
        if !available() {
            return;
        }
        let mut state = 1u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        // Remainders in every dimension: rows 1..=9, out not a multiple of the blocks,
        // inner not a multiple of 8; and a shape large enough to use several threads.
        for (rows, out, inner) in
            [(1, 7, 13), (2, 5, 8), (3, 9, 31), (5, 6, 64), (8, 11, 576), (9, 3, 17), (8, 700, 400)]
        {
            let x: Vec<f32> = (0..rows * inner).map(|_| next()).collect();
            let w: Vec<f32> = (0..out * inner).map(|_| next()).collect();
            let y = matmul(&x, rows, &w, out, inner);
            for r in 0..rows {
                for o in 0..out {
                    let want: f32 = (0..inner).map(|k| x[r * inner + k] * w[o * inner + k]).sum();
                    let got = y[r * out + o];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{rows}×{out}×{inner} [{r},{o}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
