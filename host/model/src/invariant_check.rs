//! Are the fixed-order kernels batch-invariant on a device? Each of them run on `device` the
//! way a decoding step and a training pass run it, compared bit for bit: a row's product
//! alone and among 3, 8 and 32 rows (f32 and bf16 weights); a row's norm alone and among 32;
//! one query's attention as a decoding step computes it (its keys so far, no mask, or left
//! padding masked) and as a training pass does (the whole sequence, causal mask); and each
//! result against the CPU's kernels within rounding. `wirl model check-device` reports it;
//! on a GPU (`scripts/gpu-check`) it is the first thing that shows whether `invariant.cu`
//! keeps its promise. On the CPU it checks the CPU's kernels, so CI runs the check itself.

use crate::invariant::{self, Mask};
use candle_core::{DType, Device, Tensor};

/// One kernel's outcome.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KernelCheck {
    pub kernel: String,
    /// Every comparison that must be bit-equal was.
    pub bit_equal: bool,
    /// The first comparison that was not, when one was not.
    pub first_difference: Option<String>,
    /// The largest difference from the CPU's kernels, relative to the largest value (at
    /// least 1).
    pub worst_relative_to_cpu: f32,
}

/// Every kernel's outcome, and whether all passed (bit-equal, and within `tolerance` of the
/// CPU).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub kernels: Vec<KernelCheck>,
    pub tolerance: f32,
    pub pass: bool,
}

/// Deterministic values in [-1, 1).
fn values(seed: u32, n: usize) -> Vec<f32> {
    let mut next = crate::test_values(seed);
    (0..n).map(|_| next()).collect()
}

fn host(t: &Tensor) -> crate::Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_device(&Device::Cpu)?.to_vec1()?)
}

/// The largest |a − b| relative to b's largest magnitude (at least 1).
fn relative(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    let worst =
        a.iter().zip(b).fold(0f32, |m, (x, y)| if (x - y).is_nan() { f32::INFINITY } else { m.max((x - y).abs()) });
    if a.len() != b.len() { f32::INFINITY } else { worst / scale }
}

/// Collects one kernel's comparisons.
struct Checker {
    kernel: &'static str,
    first_difference: Option<String>,
    worst: f32,
}

impl Checker {
    fn new(kernel: &'static str) -> Self {
        Self { kernel, first_difference: None, worst: 0.0 }
    }

    fn same_bits(&mut self, what: impl FnOnce() -> String, a: &[f32], b: &[f32]) {
        let equal = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        if !equal && self.first_difference.is_none() {
            let at = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits());
            let shown = at.map_or(format!("{} against {} values", a.len(), b.len()), |i| {
                format!("{} against {} at {i}", a[i], b[i])
            });
            self.first_difference = Some(format!("{}: {shown}", what()));
        }
    }

    fn near_cpu(&mut self, device: &[f32], cpu: &[f32]) {
        self.worst = self.worst.max(relative(device, cpu));
    }

    fn done(self) -> KernelCheck {
        KernelCheck {
            kernel: self.kernel.into(),
            bit_equal: self.first_difference.is_none(),
            first_difference: self.first_difference,
            worst_relative_to_cpu: self.worst,
        }
    }
}

/// Run every check on `device`. `Ok(None)` where the kernels do not run there (a CPU
/// without AVX2 and FMA, or one told `WIRL_CPU_KERNELS=portable`).
pub fn check(device: &Device, tolerance: f32) -> crate::Result<Option<Report>> {
    if device.is_cpu() && !invariant::available() {
        return Ok(None);
    }
    // The CPU's kernels are the reference; where they are declined, only the bits are checked.
    let reference = invariant::available();
    let mut kernels = Vec::new();
    for weights in [DType::F32, DType::BF16] {
        kernels.push(product(device, weights, reference)?);
    }
    kernels.push(norm(device, reference)?);
    kernels.push(attention(device, reference)?);
    let pass = kernels.iter().all(|k| k.bit_equal && k.worst_relative_to_cpu <= tolerance);
    Ok(Some(Report { kernels, tolerance, pass }))
}

/// A row's product alone and among 3, 8 and 32 rows.
fn product(device: &Device, weights: DType, reference: bool) -> crate::Result<KernelCheck> {
    let (rows, out, inner) = (32, 72, 576);
    let mut check =
        Checker::new(if weights == DType::F32 { "product (f32 weights)" } else { "product (bf16 weights)" });
    let x = Tensor::from_vec(values(11, rows * inner), (rows, inner), device)?;
    let w = Tensor::from_vec(values(12, out * inner), (out, inner), device)?.to_dtype(weights)?;
    let all = host(&invariant::matmul_t(&x, &w)?)?;
    for n in [1, 3, 8] {
        let some = host(&invariant::matmul_t(&x.narrow(0, 0, n)?, &w)?)?;
        check.same_bits(|| format!("the first {n} of {rows} rows"), &some, &all[..n * out]);
    }
    for r in [5, rows - 1] {
        let alone = host(&invariant::matmul_t(&x.narrow(0, r, 1)?, &w)?)?;
        check.same_bits(|| format!("row {r} alone"), &alone, &all[r * out..][..out]);
    }
    if reference {
        let cpu = invariant::matmul_t(&x.to_device(&Device::Cpu)?, &w.to_device(&Device::Cpu)?)?;
        check.near_cpu(&all, &host(&cpu)?);
    }
    Ok(check.done())
}

/// A row's norm alone and among 32.
fn norm(device: &Device, reference: bool) -> crate::Result<KernelCheck> {
    let (rows, n, eps) = (32, 576, 1e-5);
    let mut check = Checker::new("rms norm");
    let x = Tensor::from_vec(values(21, rows * n), (rows, n), device)?;
    let w = Tensor::from_vec(values(22, n), n, device)?;
    let all = host(&invariant::rms_norm(&x, &w, eps)?)?;
    for r in [0, 17] {
        let alone = host(&invariant::rms_norm(&x.narrow(0, r, 1)?, &w, eps)?)?;
        check.same_bits(|| format!("row {r} alone"), &alone, &all[r * n..][..n]);
    }
    if reference {
        let cpu = invariant::rms_norm(&x.to_device(&Device::Cpu)?, &w.to_device(&Device::Cpu)?, eps)?;
        check.near_cpu(&all, &host(&cpu)?);
    }
    Ok(check.done())
}

/// One query's attention as a decoding step computes it and as a training pass does.
fn attention(device: &Device, reference: bool) -> crate::Result<KernelCheck> {
    let (heads, kv_heads, len, dim, scale) = (4, 2, 150, 64, 0.125f32);
    let mut check = Checker::new("attention");
    let q = Tensor::from_vec(values(31, heads * len * dim), (1, heads, len, dim), device)?;
    let k = Tensor::from_vec(values(32, kv_heads * len * dim), (1, kv_heads, len, dim), device)?;
    let v = Tensor::from_vec(values(33, kv_heads * len * dim), (1, kv_heads, len, dim), device)?;
    let mut causal = vec![0f32; len * len];
    for i in 0..len {
        causal[i * len + i + 1..(i + 1) * len].fill(f32::NEG_INFINITY);
    }
    let mask = Mask::new(causal.clone(), (len, len), device, DType::F32)?;
    let pass = host(&invariant::attention(&q, &k, &v, scale, Some(&mask))?)?;
    // Query p of the pass: [heads, dim] values, head by head.
    let of_pass =
        |p: usize| -> Vec<f32> { (0..heads).flat_map(|h| pass[(h * len + p) * dim..][..dim].to_vec()).collect() };
    // Positions 0, in the first tile of keys, on a tile's edge and past it, the last.
    for p in [0, 40, 127, 128, len - 1] {
        let query = q.narrow(2, p, 1)?;
        let (keys, vals) = (k.narrow(2, 0, p + 1)?, v.narrow(2, 0, p + 1)?);
        let step = host(&invariant::attention(&query, &keys, &vals, scale, None)?)?;
        check.same_bits(|| format!("position {p}: a decoding step against the pass"), &step, &of_pass(p));
        // The same step behind 3 slots of left padding, which its mask hides.
        let pad = 3;
        let junk = Tensor::from_vec(values(34 + p as u32, kv_heads * pad * dim), (1, kv_heads, pad, dim), device)?;
        let (keys, vals) = (Tensor::cat(&[&junk, &keys], 2)?, Tensor::cat(&[&junk, &vals], 2)?);
        let mut hidden = vec![0f32; pad + p + 1];
        hidden[..pad].fill(f32::NEG_INFINITY);
        let hidden = Mask::new(hidden, (1, pad + p + 1), device, DType::F32)?;
        let padded = host(&invariant::attention(&query, &keys, &vals, scale, Some(&hidden))?)?;
        check.same_bits(|| format!("position {p}: behind left padding against the pass"), &padded, &of_pass(p));
    }
    if reference {
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
        let mask = Mask::new(causal, (len, len), &Device::Cpu, DType::F32)?;
        let on_cpu = invariant::attention(&cpu(&q)?, &cpu(&k)?, &cpu(&v)?, scale, Some(&mask))?;
        check.near_cpu(&pass, &host(&on_cpu)?);
    }
    Ok(check.done())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this CPU the kernels keep their promise: every comparison bit-equal, and the same as
    /// the reference (itself).
    #[test]
    fn the_cpus_kernels_pass_their_own_check() {
        let Some(report) = check(&Device::Cpu, 1e-5).unwrap() else { return };
        assert_eq!(report.kernels.len(), 4);
        for kernel in &report.kernels {
            assert!(kernel.bit_equal, "{kernel:?}");
            assert_eq!(kernel.worst_relative_to_cpu, 0.0, "{kernel:?}");
        }
        assert!(report.pass);
    }

    /// The checker sees one differing bit, and says where.
    #[test]
    fn a_single_differing_bit_is_reported() {
        let mut check = Checker::new("k");
        let a = [1.0f32, 2.0, 3.0];
        let mut b = a;
        b[2] = f32::from_bits(b[2].to_bits() + 1);
        check.same_bits(|| "third".into(), &a, &a);
        assert!(check.first_difference.is_none());
        check.same_bits(|| "third".into(), &a, &b);
        check.near_cpu(&a, &b);
        let done = check.done();
        assert!(!done.bit_equal);
        assert!(done.first_difference.unwrap().contains("at 2"));
        assert!(done.worst_relative_to_cpu > 0.0 && done.worst_relative_to_cpu < 1e-6);
        assert_eq!(relative(&[f32::NAN], &[1.0]), f32::INFINITY);
    }
}
