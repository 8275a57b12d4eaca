//! The decoding matmul on the CPU: `y = x · Wᵀ` for a few rows of f32 `x` (one per sequence
//! in the batch) against a weight `[out, in]` as HF stores it, in f32 or bf16 (widened to f32
//! as it is loaded into registers: bf16 storage halves the bytes streamed, and the sums
//! stay f32).
//!
//! Decoding G samples makes every linear a matrix of G rows times the whole weight matrix.
//! gemm treats that as a general product and packs (copies) one operand on every call; at
//! G = 8 the packing and the two workers' hand-offs took more time than the arithmetic
//! (docs/BENCHMARKS.md). Here each weight row is read once from memory, straight from the
//! model's storage, and multiplied with every row of `x` while it is in registers: the step
//! costs about what streaming the weights costs. Output rows are split between candle's
//! rayon threads.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, bail};
use half::bf16;
use rayon::prelude::*;

/// Fewer weights than this are not worth waking a second thread for. (At 256 Ki, SmolLM2's
/// key and value projections, 110 Ki each, ran on one thread while the other waited; 64 Ki
/// gave group decoding 163–189 → 189–202 tok/s in interleaved runs.)
const PARALLEL_MIN_WEIGHTS: usize = 64 * 1024;

/// The environment variable that chooses the CPU's kernels: `portable` declines the
/// fixed-order ones, so that this machine computes as a CPU without AVX2 does (candle's ops
/// on both sides: the sampler's log-probs then differ from the learner's within rounding,
/// reported and corrected, not gated); `native` or unset: the fixed-order kernels where the
/// CPU has them. Read once, when the kernels are first asked for.
pub const KERNELS_VARIABLE: &str = "WIRL_CPU_KERNELS";

/// Whether [`KERNELS_VARIABLE`] declines the fixed-order kernels.
fn portable_kernels_asked() -> bool {
    std::env::var_os(KERNELS_VARIABLE).is_some_and(|v| v == "portable")
}

/// Whether [`FewRowMatmul`] has a fast kernel on this CPU; otherwise callers use gemm.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            !portable_kernels_asked() && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `x [rows, in] · w [out, in]ᵀ → [rows, out]`: x f32, w f32 or bf16, both contiguous, on
/// the CPU. Only built when [`available`] says so.
pub struct FewRowMatmul;

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
        let x = f32_contiguous(xs, xl, self.name())?;
        let (rows, out, inner) = product_dims(xl, &[wl], self.name())?;
        let [y] = match ws {
            CpuStorage::BF16(_) => products(x, rows, [bf16_contiguous(ws, wl, self.name())?], out, inner, |_, _, _| {}),
            _ => products(x, rows, [f32_contiguous(ws, wl, self.name())?], out, inner, |_, _, _| {}),
        };
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }

    /// On a GPU: `invariant.cu`'s product, one warp per output element (issue 61, deliver 4).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::invariant_cuda::product(xs, xl, ws, wl, product_dims(xl, &[wl], self.name())?)
    }
}

/// `x [rows, inner] · w [out, inner]ᵀ` on host slices, row-major `[rows, out]` (f32 weights).
pub(crate) fn product_of(x: &[f32], rows: usize, w: &[f32], out: usize, inner: usize) -> Vec<f32> {
    let [y] = products(x, rows, [w], out, inner, |_, _, _| {});
    y
}

/// The first half of a SwiGLU MLP for a few rows: `silu(x · W_gateᵀ) ⊙ (x · W_upᵀ)`, both
/// weights `[out, in]`, in one op: each thread multiplies its output columns with both
/// weights and combines them while they are in cache (instead of two matmuls, a silu and
/// a product, each a pass over the batch and a hand-off between threads). Same conditions
/// as [`FewRowMatmul`]; both weights of one dtype.
pub struct SwiGluMatmul;

impl CustomOp3 for SwiGluMatmul {
    fn name(&self) -> &'static str {
        "swiglu-matmul"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        us: &CpuStorage,
        ul: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let name = self.name();
        let x = f32_contiguous(xs, xl, name)?;
        let (rows, out, inner) = product_dims(xl, &[gl, ul], name)?;
        let swiglu = |[gate, up]: [*mut f32; 2], start: usize, end: usize| {
            for r in 0..rows {
                for o in start..end {
                    let at = r * out + o;
                    // SAFETY: in bounds (`rows × out` each), and columns [start, end) belong
                    // to this call alone.
                    unsafe {
                        let g = *gate.add(at);
                        *gate.add(at) = g / (1.0 + (-g).exp()) * *up.add(at);
                    }
                }
            }
        };
        let [y, _] = match (gs, us) {
            (CpuStorage::BF16(_), CpuStorage::BF16(_)) => {
                let (gate, up) = (bf16_contiguous(gs, gl, name)?, bf16_contiguous(us, ul, name)?);
                products(x, rows, [gate, up], out, inner, swiglu)
            }
            _ => products(x, rows, [f32_contiguous(gs, gl, name)?, f32_contiguous(us, ul, name)?], out, inner, swiglu),
        };
        Ok((CpuStorage::F32(y), Shape::from((rows, out))))
    }
}

/// `product` applied to `x [..., inner]` viewed as a contiguous matrix `[rows, inner]`; its
/// result `[rows, out]` gets x's leading dimensions back: `[..., out]`.
pub fn on_rows(
    x: &Tensor,
    out: usize,
    product: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
) -> crate::Result<Tensor> {
    let mut shape = x.dims().to_vec();
    let Some(last) = shape.last_mut() else {
        return Err(crate::Error::Input("a matmul input without dimensions".into()));
    };
    let inner = *last;
    *last = out;
    let rows = x.elem_count() / inner.max(1);
    let y = product(&x.reshape((rows, inner))?.contiguous()?)?;
    Ok(y.reshape(shape)?)
}

/// The values of a contiguous f32 tensor on the CPU, or an error naming `op`.
pub fn f32_contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(values) = storage else { bail!("{op} takes f32 tensors") };
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("{op} takes contiguous tensors") };
    Ok(&values[start..end])
}

/// The values of a contiguous bf16 tensor on the CPU, or an error naming `op`.
fn bf16_contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [bf16]> {
    let CpuStorage::BF16(values) = storage else { bail!("{op} takes bf16 or f32 weights") };
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("{op} takes contiguous tensors") };
    Ok(&values[start..end])
}

/// A weight element the kernels read: f32 as it is, bf16 widened (its bits are the top half
/// of an f32's).
pub(crate) trait WeightElement: Copy + Sync + 'static {
    fn widen(self) -> f32;
    /// Eight weights from `p` into a register as f32 (AVX2; called from the kernels only).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl WeightElement for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl WeightElement for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // Eight 16-bit values zero-extended to 32 bits, shifted into the high half.
        unsafe {
            let halves = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16))
        }
    }
}

/// `(rows, out, inner)` of `x [rows, inner]` times weights `[out, inner]` of one shape.
fn product_dims(x: &Layout, weights: &[&Layout], op: &str) -> candle_core::Result<(usize, usize, usize)> {
    let (rows, inner) = x.shape().dims2()?;
    let (out, w_inner) = weights[0].shape().dims2()?;
    if inner != w_inner || weights.iter().any(|w| w.dims() != weights[0].dims()) {
        let shapes: Vec<_> = weights.iter().map(|w| w.dims()).collect();
        bail!("{op}: x has {inner} columns, the weights are {shapes:?}")
    }
    Ok((rows, out, inner))
}

/// One product's operands: `x [rows, inner]`, `w [out, inner]` and the output
/// `y [rows, out]`, which threads share, each writing its own output columns.
#[derive(Clone, Copy)]
struct Product<'a, W> {
    x: &'a [f32],
    rows: usize,
    w: &'a [W],
    inner: usize,
    y: *mut f32,
    out: usize,
}
// SAFETY: `y` is only written, at disjoint elements (each thread its own output columns),
// and the owner waits for all threads before reading it.
unsafe impl<W: Sync> Send for Product<'_, W> {}
unsafe impl<W: Sync> Sync for Product<'_, W> {}

/// The outputs of [`products`] as threads share them (each writes its own columns).
struct Outputs<const K: usize>([*mut f32; K]);
// SAFETY: as for `Product`.
unsafe impl<const K: usize> Send for Outputs<K> {}
unsafe impl<const K: usize> Sync for Outputs<K> {}

impl<const K: usize> Outputs<K> {
    // A method, so that closures capture the whole (Sync) struct, not its pointer field.
    fn pointers(&self) -> [*mut f32; K] {
        self.0
    }
}

/// `x · wᵀ` for each of the `K` weights (all `[out, inner]`), output columns split between
/// threads; `finish(outputs, start, end)` runs on a chunk's columns [start, end) as soon as
/// all its products are in (writing only those columns).
fn products<const K: usize, W: WeightElement>(
    x: &[f32],
    rows: usize,
    weights: [&[W]; K],
    out: usize,
    inner: usize,
    finish: impl Fn([*mut f32; K], usize, usize) + Sync,
) -> [Vec<f32>; K] {
    assert!(available(), "few-row-matmul called without AVX2 and FMA");
    assert_eq!(x.len(), rows * inner);
    assert!(weights.iter().all(|w| w.len() == out * inner));
    let mut ys: [Vec<f32>; K] = std::array::from_fn(|_| vec![0f32; rows * out]);
    let outputs = Outputs(std::array::from_fn(|k| ys[k].as_mut_ptr()));
    let run = |start: usize, end: usize| {
        for (w, y) in weights.iter().zip(outputs.pointers()) {
            let product = Product { x, rows, w, inner, y, out };
            // SAFETY: AVX2 and FMA are present (asserted above); the slices hold `rows × inner`
            // and `out × inner` values and `y` holds `rows × out`; [start, end) ⊆ [0, out).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2::columns(product, start, end)
            }
        }
        finish(outputs.pointers(), start, end);
    };
    split_outputs(out, K * out * inner, run);
    ys
}

/// `run(start, end)` over output columns [0, out) of a product of `weights` weights in all:
/// split between candle's threads when it is worth it.
pub fn split_outputs(out: usize, weights: usize, run: impl Fn(usize, usize) + Sync) {
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 || weights < PARALLEL_MIN_WEIGHTS {
        run(0, out);
    } else {
        // A few chunks per thread, so a thread held up elsewhere does not hold the step.
        let chunk = out.div_ceil(threads * 4).next_multiple_of(3);
        (0..out.div_ceil(chunk)).into_par_iter().for_each(|c| run(c * chunk, ((c + 1) * chunk).min(out)));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Product, WeightElement};
    use std::arch::x86_64::*;

    /// Output columns [start, end) of `y [rows, out]`: weight rows in blocks of `M`, times
    /// rows of `x` in blocks of `N`, so that a block's `M × N` sums stay in registers.
    /// Measured on one decoding step's linears at 8 rows (Zen 3, 2 threads, best of 12):
    /// 3 × 4 blocks 40.7 ms, 2 × 4 41.3, 1 × 8 43.6, 2 × 6 44.8, 3 × 3 (then 3 + 3 + 2 rows)
    /// 47.0; reading the weights alone took 33–43 ms that day (the bandwidth varies).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn columns<W: WeightElement>(p: Product<W>, start: usize, end: usize) {
        // Rows of x in tiles that stay in the L2 cache while every weight row of [start, end)
        // passes them: untiled, a 4,000-token prefill's x (9 MB at 576 wide) was read from
        // memory once per 3 weight rows. Each output element is summed the same way
        // whatever its tile.
        let tile = (TILE_FLOATS / p.inner.max(1)).max(4) / 4 * 4;
        let mut first = 0;
        while first < p.rows {
            let rows = first..(first + tile).min(p.rows);
            let mut o = start;
            while o < end {
                let left = end - o;
                // Few rows of x: more weight rows per block, for enough independent sums.
                if p.rows <= 2 && left >= 4 {
                    unsafe { rows_of_x::<4, W>(p, o, rows.clone()) };
                    o += 4;
                } else if left >= 3 {
                    unsafe { rows_of_x::<3, W>(p, o, rows.clone()) };
                    o += 3;
                } else if left >= 2 {
                    unsafe { rows_of_x::<2, W>(p, o, rows.clone()) };
                    o += 2;
                } else {
                    unsafe { rows_of_x::<1, W>(p, o, rows.clone()) };
                    o += 1;
                }
            }
            first = rows.end;
        }
    }

    /// How many values of x a tile of rows holds: 192 KiB, with room in a 512 KiB L2 for
    /// the weights passing through.
    const TILE_FLOATS: usize = 48 * 1024;

    /// Weight rows [o, o + M) against the rows of x in `rows`, four at a time.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn rows_of_x<const M: usize, W: WeightElement>(p: Product<W>, o: usize, rows: std::ops::Range<usize>) {
        let mut r = rows.start;
        while r < rows.end {
            let n = rows.end - r;
            unsafe {
                if n >= 4 && M <= 3 {
                    block::<M, 4, W>(p, o, r);
                    r += 4;
                } else if n >= 3 && M <= 3 {
                    block::<M, 3, W>(p, o, r);
                    r += 3;
                } else if n >= 2 {
                    block::<M, 2, W>(p, o, r);
                    r += 2;
                } else {
                    block::<M, 1, W>(p, o, r);
                    r += 1;
                }
            }
        }
    }

    /// `y[r + j][o + i] = w[o + i] · x[r + j]` for i < M, j < N. Per 8 columns: the M weight
    /// vectors are loaded into registers, then each row of x is loaded once and multiplied
    /// with all of them (`M·N` sums + `M` weights + 1 input ≤ 16 registers).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block<const M: usize, const N: usize, W: WeightElement>(p: Product<W>, o: usize, r: usize) {
        let Product { x, w, inner, y, out, .. } = p;
        let wp = unsafe { w.as_ptr().add(o * inner) };
        let xp = unsafe { x.as_ptr().add(r * inner) };
        let mut acc = [[_mm256_setzero_ps(); N]; M];
        let vectors = inner / 8;
        for c in 0..vectors {
            let mut wv = [_mm256_setzero_ps(); M];
            for (i, v) in wv.iter_mut().enumerate() {
                // Ask for the next block's weights while this one computes: decoding is
                // bound by how fast the weights stream in. (A hint: never faults.)
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add((M + i) * inner + c * 8) as *const i8);
                *v = unsafe { W::load8(wp.add(i * inner + c * 8)) };
            }
            for j in 0..N {
                let xj = unsafe { _mm256_loadu_ps(xp.add(j * inner + c * 8)) };
                for (sums, wi) in acc.iter_mut().zip(&wv) {
                    sums[j] = _mm256_fmadd_ps(*wi, xj, sums[j]);
                }
            }
        }
        for (i, sums) in acc.iter().enumerate() {
            for (j, sum) in sums.iter().enumerate() {
                let mut total = horizontal_sum(*sum);
                for k in vectors * 8..inner {
                    total += w[(o + i) * inner + k].widen() * x[(r + j) * inner + k];
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

    fn tensor(values: &[f32], shape: (usize, usize)) -> candle_core::Tensor {
        candle_core::Tensor::from_vec(values.to_vec(), shape, &candle_core::Device::Cpu).unwrap()
    }

    #[test]
    fn equals_the_plain_product_for_every_shape_and_remainder() {
        if !available() {
            return;
        }
        let mut next = crate::test_values(1);
        // Remainders in every dimension: rows 1..=9, out not a multiple of the blocks,
        // inner not a multiple of 8; and a shape large enough to use several threads.
        for (rows, out, inner) in
            [(1, 7, 13), (2, 5, 8), (3, 9, 31), (5, 6, 64), (8, 11, 576), (9, 3, 17), (8, 700, 400)]
        {
            let x: Vec<f32> = (0..rows * inner).map(|_| next()).collect();
            let w: Vec<f32> = (0..out * inner).map(|_| next()).collect();
            let u: Vec<f32> = (0..out * inner).map(|_| next()).collect();
            let [y] = products(&x, rows, [&w], out, inner, |_, _, _| {});
            // bf16 weights: the product of their widened values (f32 sums).
            let w16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let [y16] = products(&x, rows, [&w16], out, inner, |_, _, _| {});
            let w16_wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
            let u16: Vec<bf16> = u.iter().map(|&v| bf16::from_f32(v)).collect();
            let gated16 = {
                let wt = candle_core::Tensor::from_vec(w16.clone(), (out, inner), &candle_core::Device::Cpu).unwrap();
                let ut = candle_core::Tensor::from_vec(u16.clone(), (out, inner), &candle_core::Device::Cpu).unwrap();
                let xt = tensor(&x, (rows, inner));
                xt.apply_op3_no_bwd(&wt, &ut, &SwiGluMatmul).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
            };
            let u16_wide: Vec<f32> = u16.iter().map(|v| v.to_f32()).collect();
            let gated = {
                let (xt, wt, ut) = (tensor(&x, (rows, inner)), tensor(&w, (out, inner)), tensor(&u, (out, inner)));
                xt.apply_op3_no_bwd(&wt, &ut, &SwiGluMatmul).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
            };
            let dot = |m: &[f32], r: usize, o: usize| -> f32 {
                (0..inner).map(|k| x[r * inner + k] * m[o * inner + k]).sum()
            };
            for r in 0..rows {
                for o in 0..out {
                    let close = |got: f32, want: f32| (got - want).abs() <= 1e-4 * (1.0 + want.abs());
                    let want = dot(&w, r, o);
                    let got = y[r * out + o];
                    assert!(close(got, want), "{rows}×{out}×{inner} [{r},{o}]: {got} vs {want}");
                    let want = want / (1.0 + (-want).exp()) * dot(&u, r, o);
                    let got = gated[r * out + o];
                    assert!(close(got, want), "swiglu {rows}×{out}×{inner} [{r},{o}]: {got} vs {want}");
                    let want = dot(&w16_wide, r, o);
                    let got = y16[r * out + o];
                    assert!(close(got, want), "bf16 {rows}×{out}×{inner} [{r},{o}]: {got} vs {want}");
                    let want = want / (1.0 + (-want).exp()) * dot(&u16_wide, r, o);
                    let got = gated16[r * out + o];
                    assert!(close(got, want), "bf16 swiglu {rows}×{out}×{inner} [{r},{o}]: {got} vs {want}");
                }
            }
        }
        // Weights of different shapes are an error naming the op, not a panic.
        let (x, a, b) = (tensor(&[0.0; 6], (2, 3)), tensor(&[0.0; 12], (4, 3)), tensor(&[0.0; 8], (4, 2)));
        let error = x.apply_op3_no_bwd(&a, &b, &SwiGluMatmul).unwrap_err().to_string();
        assert!(error.contains("swiglu-matmul"), "{error}");
        // So are weights of another dtype (f16), or a bf16 gate with an f32 up.
        let half = a.to_dtype(candle_core::DType::F16).unwrap();
        let error = x.apply_op2_no_bwd(&half, &FewRowMatmul).unwrap_err().to_string();
        assert!(error.contains("few-row-matmul"), "{error}");
        let mixed = a.to_dtype(candle_core::DType::BF16).unwrap();
        let error = x.apply_op3_no_bwd(&mixed, &a, &SwiGluMatmul).unwrap_err().to_string();
        assert!(error.contains("swiglu-matmul"), "{error}");
    }
}
