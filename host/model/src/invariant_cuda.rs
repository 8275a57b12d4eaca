//! The fixed-order reductions on CUDA (issue 61, deliver 4): `invariant.cu`'s kernels, compiled
//! to PTX by `build.rs` and launched here as the CUDA side of the ops `invariant.rs` defines
//! (the product, the norm, attention). Each output's sums run in an order fixed by its own
//! operands, never by the rows around it, so a decoding step and a training pass on one GPU
//! give the same bits. Their bits are not the CPU's: [`crate::invariant_check`] measures both.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::{DType, Layout, Shape, bail};

/// The kernels' PTX, compiled by `build.rs` with the toolkit's nvcc.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/invariant.ptx"));
/// The name the device caches the module under.
const MODULE: &str = "wirl_invariant";
/// As in `invariant.cu`.
const PRODUCT_WARPS: usize = 8;
const NORM_THREADS: u32 = 256;
const ATTENTION_THREADS: u32 = 128;
const ATTENTION_MAX_DIM: usize = 512;
/// The most blocks a grid's y and z dimensions may hold.
const GRID_YZ_MAX: usize = 65_535;

/// A size as the kernels' `int`, or an error naming what is too large.
fn int(value: usize, what: &str) -> candle_core::Result<i32> {
    i32::try_from(value)
        .map_err(|_| candle_core::Error::Msg(format!("{what} of {value} is more than a CUDA kernel's int")))
}

/// The storage's values from the layout's offset on, which must be contiguous.
fn contiguous<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("{op} takes contiguous tensors") };
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

/// `x [rows, inner] · w [out, inner]ᵀ → [rows, out]`: x f32, w f32 or bf16.
pub(crate) fn product(
    xs: &CudaStorage,
    xl: &Layout,
    ws: &CudaStorage,
    wl: &Layout,
    (rows, out, inner): (usize, usize, usize),
) -> candle_core::Result<(CudaStorage, Shape)> {
    let op = "the fixed-order product";
    if xs.dtype() != DType::F32 {
        bail!("{op} takes f32 activations, not {:?}", xs.dtype())
    }
    let device = xs.device.clone();
    // SAFETY: every element is written by the kernel (one warp per output) before it is read.
    let mut y = unsafe { device.alloc::<f32>(rows * out) }?;
    if rows == 0 || out == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(y, device), Shape::from((rows, out))));
    }
    let blocks = out.div_ceil(PRODUCT_WARPS);
    if blocks > GRID_YZ_MAX {
        bail!("{op}: {out} outputs are more than its grid holds")
    }
    let x = contiguous::<f32>(xs, xl, op)?;
    let (r, o, i) = (int(rows, "rows")?, int(out, "outputs")?, int(inner, "an inner dimension")?);
    let config = LaunchConfig {
        grid_dim: (rows as u32, blocks as u32, 1),
        block_dim: ((PRODUCT_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    match ws.dtype() {
        DType::F32 => {
            let w = contiguous::<f32>(ws, wl, op)?;
            let func = device.get_or_load_custom_func("fixed_product_f32", MODULE, PTX)?;
            let mut launch = func.builder();
            launch.arg(&x).arg(&w).arg(&mut y).arg(&r).arg(&o).arg(&i);
            // SAFETY: the kernel reads rows × inner and out × inner values and writes rows × out.
            unsafe { launch.launch(config) }.w()?;
        }
        DType::BF16 => {
            let w = contiguous::<half::bf16>(ws, wl, op)?;
            let func = device.get_or_load_custom_func("fixed_product_bf16", MODULE, PTX)?;
            let mut launch = func.builder();
            launch.arg(&x).arg(&w).arg(&mut y).arg(&r).arg(&o).arg(&i);
            // SAFETY: as above; bf16 is read as its 16 bits.
            unsafe { launch.launch(config) }.w()?;
        }
        other => bail!("{op} takes f32 or bf16 weights, not {other:?}"),
    }
    Ok((CudaStorage::wrap_cuda_slice(y, device), Shape::from((rows, out))))
}

/// RMS norm over the last dimension: x f32 `[..., n]`, weight f32 `[n]`.
pub(crate) fn rms_norm(
    xs: &CudaStorage,
    xl: &Layout,
    ws: &CudaStorage,
    wl: &Layout,
    eps: f64,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let op = "the fixed-order norm";
    let n = xl.dims().last().copied().unwrap_or(0);
    if wl.dims() != [n] || xs.dtype() != DType::F32 || ws.dtype() != DType::F32 {
        bail!(
            "{op}: x {:?} {:?} and weight {:?} {:?}: expected f32 and a weight of {n}",
            xl.dims(),
            xs.dtype(),
            wl.dims(),
            ws.dtype()
        )
    }
    let rows = xl.shape().elem_count() / n.max(1);
    let device = xs.device.clone();
    // SAFETY: every element is written by the kernel (one block per row) before it is read.
    let mut y = unsafe { device.alloc::<f32>(rows * n) }?;
    if rows > 0 && n > 0 {
        let (x, w) = (contiguous::<f32>(xs, xl, op)?, contiguous::<f32>(ws, wl, op)?);
        let (r, width) = (int(rows, "rows")?, int(n, "a row")?);
        let func = device.get_or_load_custom_func("fixed_rms_norm", MODULE, PTX)?;
        let config =
            LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (NORM_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut launch = func.builder();
        launch.arg(&x).arg(&w).arg(&mut y).arg(&r).arg(&width).arg(&eps);
        // SAFETY: the kernel reads rows × n and n values and writes rows × n.
        unsafe { launch.launch(config) }.w()?;
    }
    Ok((CudaStorage::wrap_cuda_slice(y, device), xl.shape().clone()))
}

/// The shapes of one attention: q `[batch, heads, len, dim]`, k and v `[batch, kv_heads,
/// total, dim]`, the mask `[len, total]` or `[batch, len, total]` (as values).
pub(crate) struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub len: usize,
    pub total: usize,
    pub dim: usize,
    pub kv_heads: usize,
    pub per_row_mask: bool,
}

/// Attention of `q` over `k` and `v` with an optional additive mask (f32, contiguous).
pub(crate) fn attention(
    (qs, ql): (&CudaStorage, &Layout),
    (ks, kl): (&CudaStorage, &Layout),
    (vs, vl): (&CudaStorage, &Layout),
    mask: Option<(&CudaStorage, &Layout)>,
    s: &AttentionShape,
    scale: f32,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let op = "the fixed-order attention";
    if s.dim > ATTENTION_MAX_DIM {
        bail!("{op}: heads of {} dimensions (at most {ATTENTION_MAX_DIM})", s.dim)
    }
    if s.heads > GRID_YZ_MAX || s.batch > GRID_YZ_MAX {
        bail!("{op}: {} heads × {} rows are more than its grid holds", s.heads, s.batch)
    }
    let device = qs.device.clone();
    let elements = s.batch * s.heads * s.len * s.dim;
    // SAFETY: every element is written by the kernel (one block per query) before it is read.
    let mut out = unsafe { device.alloc::<f32>(elements) }?;
    let shape = Shape::from((s.batch, s.heads, s.len, s.dim));
    if elements == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(out, device), shape));
    }
    let (q, k, v) = (contiguous::<f32>(qs, ql, op)?, contiguous::<f32>(ks, kl, op)?, contiguous::<f32>(vs, vl, op)?);
    // Without a mask the kernel never reads its pointer: the queries stand in for it.
    let m = match mask {
        Some((ms, ml)) => contiguous::<f32>(ms, ml, op)?,
        None => contiguous::<f32>(qs, ql, op)?,
    };
    let args = [
        int(s.heads, "heads")?,
        int(s.len, "queries")?,
        int(s.total, "keys")?,
        int(s.dim, "a head's dimensions")?,
        int(s.heads / s.kv_heads.max(1), "a group")?,
        int(s.kv_heads, "key/value heads")?,
        i32::from(mask.is_some()),
        i32::from(s.per_row_mask),
    ];
    let func = device.get_or_load_custom_func("fixed_attention", MODULE, PTX)?;
    let config = LaunchConfig {
        grid_dim: (int(s.len, "queries")? as u32, s.heads as u32, s.batch as u32),
        block_dim: (ATTENTION_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = func.builder();
    launch.arg(&q).arg(&k).arg(&v).arg(&m).arg(&mut out);
    for value in &args {
        launch.arg(value);
    }
    launch.arg(&scale);
    // SAFETY: the caller checked the shapes (`invariant::Attention`): the kernel reads q, k,
    // v and the mask within them and writes batch × heads × len × dim values.
    unsafe { launch.launch(config) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(out, device), shape))
}
