//! Whether a tensor holds only finite values: the check every weight read from a file, an
//! adapter and a merged matrix passes (a model of NaN or infinities is refused, not run).
//! Its own module so that the loader and the adapters both use it without importing each
//! other.

use crate::Result;
use candle_core::{DType, Tensor};

/// Whether every value of a floating-point tensor is finite (integer tensors always are).
pub fn all_finite(tensor: &Tensor) -> Result<bool> {
    if !tensor.dtype().is_float() {
        return Ok(true);
    }
    // x · 0 is 0 for every finite x and NaN for NaN and ±∞, so the sum is 0 or NaN.
    let probe = (tensor.to_dtype(DType::F32)? * 0.0)?.sum_all()?.to_scalar::<f32>()?;
    Ok(probe == 0.0)
}
