//! llama.cpp's quantized matrices (Q4_1, Q8_0) multiplied on the CPU as they are stored.
//!
//! candle's CPU dot product for Q4_1 is scalar code, so the quantized path used to re-encode
//! every matrix as Q8_0: 1.06 bytes a weight instead of 0.625, and decoding one row is bound
//! by how fast the weights stream in. Here a matrix keeps its blocks, and the activations
//! are quantized to 8 bits per block of 32 as llama.cpp does (its `Q8_1` / `Q8_0`), so that
//! a block's dot product is integer arithmetic (`maddubs`) and one scale. Both types share
//! one activation quantization per product and one threading. AVX2, FMA and F16C; without
//! them the loader keeps the Q8_0 re-encoding through candle.

use crate::decode_matmul::{self, f32_contiguous, split_outputs};
use crate::{Error, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, bail};

/// Weights per block (both types).
const BLOCK: usize = 32;

/// A block format this kernel multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scale `d` and minimum `m` (f16 each), then 32 4-bit levels `q`: weight = d·q + m.
    /// Level `j < 16` is the low nibble of byte `j`, level `16 + j` the high one.
    Q4_1,
    /// Scale `d` (f16), then 32 signed 8-bit levels: weight = d·q.
    Q8_0,
}

impl Format {
    /// The kernel's format for a GGUF type, if it has one.
    pub fn of(dtype: GgmlDType) -> Option<Format> {
        match dtype {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    const fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
        }
    }
}

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

/// A quantized matrix `[out, inner]` in llama.cpp's blocks, row by row `inner / 32` blocks.
#[derive(Debug)]
pub struct BlockMatrix {
    format: Format,
    blocks: Vec<u8>,
    out: usize,
    inner: usize,
}

impl BlockMatrix {
    /// From a GGUF tensor of a type [`Format::of`] knows. `heads`: undo llama.cpp's
    /// permutation of a q or k projection's rows for that many heads (see
    /// `load::unpermute_rows`), whole rows moved.
    pub fn from_qtensor(tensor: &QTensor, heads: Option<usize>) -> Result<Self> {
        let Some(format) = Format::of(tensor.dtype()) else {
            return Err(Error::Input(format!("no CPU block kernel for {:?} tensors", tensor.dtype())));
        };
        let (out, inner) = tensor.shape().dims2()?;
        let data = tensor.data()?;
        let row_bytes = inner / BLOCK * format.block_bytes();
        if !inner.is_multiple_of(BLOCK) || data.len() != out * row_bytes {
            return Err(Error::Input(format!("a {format:?} matrix [{out}, {inner}] of {} bytes", data.len())));
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
        Ok(BlockMatrix { format, blocks, out, inner })
    }

    /// Rows of the output (`out`).
    pub fn out(&self) -> usize {
        self.out
    }

    /// `x · Wᵀ` for `x [..., inner]` (f32, on the CPU): `[..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(decode_matmul::on_rows(x, self.out, |x2| x2.apply_op1_no_bwd(&BlockProduct(self)))?)
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

struct BlockProduct<'a>(&'a BlockMatrix);

impl CustomOp1 for BlockProduct<'_> {
    fn name(&self) -> &'static str {
        "block-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = f32_contiguous(storage, layout, self.name())?;
        let (rows, inner) = layout.shape().dims2()?;
        let matrix = self.0;
        if inner != matrix.inner {
            bail!("block-matmul: x has {inner} columns, the matrix {}", matrix.inner)
        }
        if !available() {
            bail!("block-matmul needs AVX2, FMA and F16C")
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
                match matrix.format {
                    Format::Q4_1 => {
                        avx2::columns::<avx2::Q4_1>(matrix, &activations, rows, output.pointer(), start, end)
                    }
                    Format::Q8_0 => {
                        avx2::columns::<avx2::Q8_0>(matrix, &activations, rows, output.pointer(), start, end)
                    }
                }
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
    use super::{Activations, BLOCK, BlockMatrix, Format};
    use std::arch::x86_64::*;

    /// A block format's arithmetic: its levels unpacked once per block, then a dot product
    /// with each row's 8-bit activations.
    pub(super) trait Kernel {
        /// The format whose blocks this reads.
        const FORMAT: Format;
        /// Scale, minimum (0 without one) and levels of the block at `block`.
        unsafe fn unpack(block: *const u8) -> (f32, f32, __m256i);
        /// Sums of levels × activations, in 8 lanes of i32.
        unsafe fn dot(levels: __m256i, x: __m256i) -> __m256i;
    }

    pub(super) struct Q4_1;
    pub(super) struct Q8_0;

    impl Kernel for Q4_1 {
        const FORMAT: Format = Format::Q4_1;

        #[inline(always)]
        unsafe fn unpack(block: *const u8) -> (f32, f32, __m256i) {
            unsafe {
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(block.cast::<i32>().read_unaligned()));
                let packed = _mm_loadu_si128(block.add(4).cast());
                let nibble = _mm_set1_epi8(0x0F);
                let low = _mm_and_si128(packed, nibble);
                let high = _mm_and_si128(_mm_srli_epi16(packed, 4), nibble);
                (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)), _mm256_set_m128i(high, low))
            }
        }

        #[inline(always)]
        unsafe fn dot(levels: __m256i, x: __m256i) -> __m256i {
            // Levels 0..15 (unsigned) times -127..127: pairs summed in i16 stay within ±3810.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(levels, x), _mm256_set1_epi16(1)) }
        }
    }

    impl Kernel for Q8_0 {
        const FORMAT: Format = Format::Q8_0;

        #[inline(always)]
        unsafe fn unpack(block: *const u8) -> (f32, f32, __m256i) {
            unsafe {
                let d = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(block.cast::<u16>().read_unaligned())));
                (_mm_cvtss_f32(d), 0.0, _mm256_loadu_si256(block.add(2).cast()))
            }
        }

        #[inline(always)]
        unsafe fn dot(levels: __m256i, x: __m256i) -> __m256i {
            // maddubs wants its first operand unsigned: |w| times x with w's sign moved onto
            // it (llama.cpp's trick). Pairs: 2 · 127 · 127 fits in i16 (saturating only at
            // w = -128, which the format does not produce).
            unsafe {
                let products = _mm256_maddubs_epi16(_mm256_sign_epi8(levels, levels), _mm256_sign_epi8(x, levels));
                _mm256_madd_epi16(products, _mm256_set1_epi16(1))
            }
        }
    }

    /// Output columns [start, end) of `y [rows, out]`, up to four rows of x per pass over a
    /// weight row (its levels unpacked once for all of them).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn columns<K: Kernel>(
        m: &BlockMatrix,
        a: &Activations,
        rows: usize,
        y: *mut f32,
        start: usize,
        end: usize,
    ) {
        assert_eq!(m.format, K::FORMAT, "the kernel reads the matrix's own block format");
        for o in start..end {
            let mut r = 0;
            while r < rows {
                unsafe {
                    match rows - r {
                        1 => row::<K, 1>(m, a, o, r, y),
                        2 => row::<K, 2>(m, a, o, r, y),
                        3 => row::<K, 3>(m, a, o, r, y),
                        _ => row::<K, 4>(m, a, o, r, y),
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
    unsafe fn row<K: Kernel, const N: usize>(m: &BlockMatrix, a: &Activations, o: usize, r: usize, y: *mut f32) {
        let blocks = m.inner / BLOCK;
        let bytes = K::FORMAT.block_bytes();
        let weights = &m.blocks[o * blocks * bytes..][..blocks * bytes];
        let mut sums = [[_mm256_setzero_ps(); 2]; N];
        let mut minimums = [[0f32; 2]; N];
        // Row r + j's activation blocks start at block (r + j) · blocks.
        assert!((r + N) * blocks <= a.scales.len() && a.levels.len() == a.scales.len() * BLOCK);
        for (b, block) in weights.chunks_exact(bytes).enumerate() {
            // SAFETY: `block` holds one block of the format.
            let (d, minimum, levels) = unsafe { K::unpack(block.as_ptr()) };
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
                let dots = unsafe { K::dot(levels, x) };
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
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let dense = q.dequantize(&Device::Cpu).unwrap();
            let matrix = BlockMatrix::from_qtensor(&q, None).unwrap();
            for rows in [1, 2, 3, 4, 5, 9] {
                let x =
                    Tensor::from_vec((0..rows * inner).map(|_| next()).collect(), (rows, inner), &Device::Cpu).unwrap();
                let want = x.matmul(&dense.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
                let got = matrix.forward(&x).unwrap().to_vec2::<f32>().unwrap();
                for (r, (got, want)) in got.iter().zip(&want).enumerate() {
                    for (o, (g, w)) in got.iter().zip(want).enumerate() {
                        // 8-bit activations: each block's error is at most half a level (1/254
                        // of its largest |x|) times the sum of |w|; ~0.01 here.
                        assert!((g - w).abs() < 0.02, "{dtype:?}, rows {rows}, [{r},{o}]: {g} vs {w}");
                    }
                }
            }

            // Rows moved as the dense path's `unpermute_rows` moves them.
            let moved = BlockMatrix::from_qtensor(&q, Some(heads)).unwrap();
            let expected = crate::load::unpermute_rows(&dense, heads).unwrap();
            let x = Tensor::from_vec((0..inner).map(|_| next()).collect(), (1, inner), &Device::Cpu).unwrap();
            let want = x.matmul(&expected.t().unwrap()).unwrap().to_vec2::<f32>().unwrap();
            let got = moved.forward(&x).unwrap().to_vec2::<f32>().unwrap();
            for (g, w) in got[0].iter().zip(&want[0]) {
                assert!((g - w).abs() < 0.02, "{dtype:?} permuted: {g} vs {w}");
            }

            // A wrong width is an error naming the op.
            let wide = Tensor::zeros((1, inner + 32), candle_core::DType::F32, &Device::Cpu).unwrap();
            let error = matrix.forward(&wide).unwrap_err().to_string();
            assert!(error.contains("block-matmul"), "{error}");
        }
        // A type without a kernel is refused.
        let q = QTensor::quantize(&w, GgmlDType::Q4_0).unwrap();
        assert!(BlockMatrix::from_qtensor(&q, None).is_err());
    }
}
