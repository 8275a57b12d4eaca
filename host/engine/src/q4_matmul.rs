//! llama.cpp's Q4_1 matrices multiplied on the CPU as they are stored.
//!
//! candle's CPU dot product for Q4_1 is scalar code, so the quantized path used to re-encode
//! every matrix as Q8_0: 1.06 bytes a weight instead of 0.625, and decoding one row is bound
//! by how fast the weights stream in. Here a Q4_1 matrix keeps its blocks, and the
//! activations are quantized to 8 bits per block of 32 as llama.cpp does for this type (its
//! `Q8_1`), so that a block's dot product is integer arithmetic (`maddubs`) and one scale.
//! AVX2, FMA and F16C; without them the loader keeps the Q8_0 re-encoding.

use crate::decode_matmul::{self, f32_contiguous, split_outputs};
use crate::{Error, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, bail};

/// Weights per block.
const BLOCK: usize = 32;
/// Bytes per block: scale `d` and minimum `m` (f16 each), then 32 4-bit levels.
const BLOCK_BYTES: usize = 20;

/// Whether this CPU has the kernel (AVX2, FMA, F16C).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| decode_matmul::available() && is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A Q4_1 matrix `[out, inner]` in llama.cpp's blocks: row by row, `inner / 32` blocks of
/// (scale d, minimum m, levels q), weight = d·q + m. Level `j < 16` of a block is the low
/// nibble of its byte `j`, level `16 + j` the high one.
#[derive(Debug)]
pub struct Q4_1Matrix {
    blocks: Vec<u8>,
    out: usize,
    inner: usize,
}

impl Q4_1Matrix {
    /// From a GGUF tensor of type Q4_1. `heads`: undo llama.cpp's permutation of a q or k
    /// projection's rows for that many heads (see `load::unpermute_rows`), whole rows moved.
    pub fn from_qtensor(tensor: &QTensor, heads: Option<usize>) -> Result<Self> {
        if tensor.dtype() != GgmlDType::Q4_1 {
            return Err(Error::Input(format!("a Q4_1 matrix from a {:?} tensor", tensor.dtype())));
        }
        let (out, inner) = tensor.shape().dims2()?;
        let data = tensor.data()?;
        let row_bytes = inner / BLOCK * BLOCK_BYTES;
        if !inner.is_multiple_of(BLOCK) || data.len() != out * row_bytes {
            return Err(Error::Input(format!("a Q4_1 matrix [{out}, {inner}] of {} bytes", data.len())));
        }
        let blocks = match heads {
            None => data.into_owned(),
            Some(heads) => {
                let head_dim = out / heads;
                if head_dim * heads != out || !head_dim.is_multiple_of(2) {
                    return Err(Error::Input(format!("{out} rows do not split into {heads} heads of pairs")));
                }
                let half = head_dim / 2;
                // New row (head h, half a, index i) was stored as row (h, i, a).
                (0..out)
                    .flat_map(|row| {
                        let (head, within) = (row / head_dim, row % head_dim);
                        let stored = head * head_dim + 2 * (within % half) + within / half;
                        &data[stored * row_bytes..][..row_bytes]
                    })
                    .copied()
                    .collect()
            }
        };
        Ok(Q4_1Matrix { blocks, out, inner })
    }

    /// Rows of the output (`out`).
    pub fn out(&self) -> usize {
        self.out
    }

    /// `x · Wᵀ` for `x [..., inner]` (f32, on the CPU): `[..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let inner = dims.last().copied().unwrap_or(0);
        let rows = x.elem_count() / inner.max(1);
        let y = x.reshape((rows, inner))?.contiguous()?.apply_op1_no_bwd(&Q4Product(self))?;
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("a matmul input has dimensions") = self.out;
        Ok(y.reshape(shape)?)
    }
}

/// Activations quantized per block of 32, as llama.cpp's `Q8_1`: levels, scale, and the
/// scale times the sum of the levels (for the minimum's term).
struct Activations {
    levels: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<f32>,
}

impl Activations {
    /// Like llama.cpp's `quantize_row_q8_1` on AVX2: levels `round(x · 127 / max|x|)`, ties
    /// to even.
    #[inline(always)]
    fn quantize_with(x: &[f32]) -> Self {
        let blocks = x.len() / BLOCK;
        let mut levels = vec![0i8; x.len()];
        let (mut scales, mut sums) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
        for (values, levels) in x.chunks_exact(BLOCK).zip(levels.chunks_exact_mut(BLOCK)) {
            let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inverse = if largest > 0.0 { 127.0 / largest } else { 0.0 };
            let mut total = 0i32;
            for (level, value) in levels.iter_mut().zip(values) {
                *level = (value * inverse).round_ties_even() as i8;
                total += i32::from(*level);
            }
            let scale = largest / 127.0;
            scales.push(scale);
            sums.push(scale * total as f32);
        }
        Activations { levels, scales, sums }
    }
}

struct Q4Product<'a>(&'a Q4_1Matrix);

impl CustomOp1 for Q4Product<'_> {
    fn name(&self) -> &'static str {
        "q4_1-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_contiguous(storage, layout, self.name())?;
        let (rows, inner) = layout.shape().dims2()?;
        let matrix = self.0;
        if inner != matrix.inner {
            bail!("q4_1-matmul: x has {inner} columns, the matrix {}", matrix.inner)
        }
        if !available() {
            bail!("q4_1-matmul needs AVX2, FMA and F16C")
        }
        // SAFETY: the features are present (checked above).
        #[cfg(target_arch = "x86_64")]
        let activations = unsafe { avx2::quantize(x) };
        #[cfg(not(target_arch = "x86_64"))]
        let activations = Activations::quantize_with(x);
        let mut y = vec![0f32; rows * matrix.out];
        let output = Output(y.as_mut_ptr());
        split_outputs(matrix.out, matrix.out * inner, |start, end| {
            // SAFETY: the features are present (checked above); `y` holds `rows × out` values
            // and this call writes only its columns [start, end) ⊆ [0, out).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2::columns(matrix, &activations, rows, output.pointer(), start, end)
            }
        });
        Ok((CpuStorage::F32(y), Shape::from((rows, matrix.out))))
    }
}

/// The output as threads share it, each writing its own columns.
struct Output(*mut f32);
// SAFETY: written at disjoint elements; the owner waits for all threads before reading.
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

impl Output {
    // A method, so that closures capture the whole (Sync) struct, not its pointer field.
    fn pointer(&self) -> *mut f32 {
        self.0
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Activations, BLOCK, BLOCK_BYTES, Q4_1Matrix};
    use std::arch::x86_64::*;

    /// Output columns [start, end) of `y [rows, out]`, up to four rows of x per pass over a
    /// weight row (its levels unpacked once for all of them).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn columns(m: &Q4_1Matrix, a: &Activations, rows: usize, y: *mut f32, start: usize, end: usize) {
        for o in start..end {
            let mut r = 0;
            while r < rows {
                unsafe {
                    match rows - r {
                        1 => row::<1>(m, a, o, r, y),
                        2 => row::<2>(m, a, o, r, y),
                        3 => row::<3>(m, a, o, r, y),
                        _ => row::<4>(m, a, o, r, y),
                    }
                }
                r += 4;
            }
        }
    }

    /// `y[r + j][o] = w[o] · x[r + j]` for j < N. Two sums per row of x, for even and odd
    /// blocks: with one, every block waited for the previous block's FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn row<const N: usize>(m: &Q4_1Matrix, a: &Activations, o: usize, r: usize, y: *mut f32) {
        let blocks = m.inner / BLOCK;
        let weights = &m.blocks[o * blocks * BLOCK_BYTES..][..blocks * BLOCK_BYTES];
        let nibble = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut sums = [[_mm256_setzero_ps(); 2]; N];
        let mut minimums = [[0f32; 2]; N];
        // Row r + j's activation blocks start at block (r + j) · blocks.
        assert!((r + N) * blocks <= a.scales.len() && a.levels.len() == a.scales.len() * BLOCK);
        for (b, block) in weights.chunks_exact(BLOCK_BYTES).enumerate() {
            // SAFETY: `block` holds 20 bytes: d and m (4), then 16 bytes of levels.
            let (d, minimum, levels) = unsafe {
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(block.as_ptr().cast::<i32>().read_unaligned()));
                let packed = _mm_loadu_si128(block.as_ptr().add(4).cast());
                let low = _mm_and_si128(packed, nibble);
                let high = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
                (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)), _mm256_set_m128i(high, low))
            };
            for j in 0..N {
                let at = (r + j) * blocks + b;
                // SAFETY: at < (r + N) · blocks ≤ the activation blocks (asserted above).
                let (x, scale, sum) = unsafe {
                    (
                        _mm256_loadu_si256(a.levels.as_ptr().add(at * BLOCK).cast()),
                        *a.scales.get_unchecked(at),
                        *a.sums.get_unchecked(at),
                    )
                };
                // Levels 0..15 (unsigned) times -127..127: pairs summed in i16 stay within
                // ±3810, then summed in i32.
                let dots = _mm256_madd_epi16(_mm256_maddubs_epi16(levels, x), ones);
                let half = b & 1;
                sums[j][half] = _mm256_fmadd_ps(_mm256_set1_ps(d * scale), _mm256_cvtepi32_ps(dots), sums[j][half]);
                minimums[j][half] += minimum * sum;
            }
        }
        for j in 0..N {
            let v = _mm256_add_ps(sums[j][0], sums[j][1]);
            let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
            let total = _mm_cvtss_f32(_mm_add_ss(quad, _mm_shuffle_ps(quad, quad, 1)));
            // SAFETY: `y` holds `rows × out` values; r + j < rows, o < out.
            unsafe { *y.add((r + j) * m.out + o) = total + minimums[j][0] + minimums[j][1] };
        }
    }

    /// [`Activations::quantize`]'s loop compiled for AVX2 (rounding in vector registers).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize(x: &[f32]) -> Activations {
        Activations::quantize_with(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_the_dequantized_product_within_activation_rounding() {
        if !available() {
            return;
        }
        let mut next = crate::test_values(3);
        let (out, inner, heads) = (12, 96, 3);
        let w: Vec<f32> = (0..out * inner).map(|_| next()).collect();
        let w = Tensor::from_vec(w, (out, inner), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let dense = q.dequantize(&Device::Cpu).unwrap();
        let matrix = Q4_1Matrix::from_qtensor(&q, None).unwrap();
        for rows in [1, 2, 3, 4, 5, 9] {
            let x = Tensor::from_vec((0..rows * inner).map(|_| next()).collect(), (rows, inner), &Device::Cpu).unwrap();
            let want = x.matmul(&dense.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
            let got = matrix.forward(&x).unwrap().to_vec2::<f32>().unwrap();
            for (r, (got, want)) in got.iter().zip(&want).enumerate() {
                for (o, (g, w)) in got.iter().zip(want).enumerate() {
                    // 8-bit activations: each block's error is at most half a level (1/254 of its
                    // largest |x|) times the sum of |w|; ~0.01 here.
                    assert!((g - w).abs() < 0.02, "rows {rows}, [{r},{o}]: {g} vs {w}");
                }
            }
        }

        // Rows moved as the dense path's `unpermute_rows` moves them.
        let moved = Q4_1Matrix::from_qtensor(&q, Some(heads)).unwrap();
        let expected = crate::load::unpermute_rows(&dense, heads).unwrap();
        let x = Tensor::from_vec((0..inner).map(|_| next()).collect(), (1, inner), &Device::Cpu).unwrap();
        let want = x.matmul(&expected.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
        let got = moved.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for (g, w) in got[0].iter().zip(&want[0]) {
            assert!((g - w).abs() < 0.02, "permuted: {g} vs {w}");
        }

        // A wrong width is an error naming the op.
        let wide = Tensor::zeros((1, inner + 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let error = matrix.forward(&wide).unwrap_err().to_string();
        assert!(error.contains("q4_1-matmul"), "{error}");
    }
}
