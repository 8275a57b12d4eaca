//! The fixed-order product kernel (`invariant::matmul_t`) beside candle's own product (gemm)
//! on the shapes a default-job step multiplies, same run, alternating, best of several:
//! what bitwise on-policy costs in the learner's forward on this CPU.
//!   cargo bench -p wirl-model --bench products        # ROUNDS=7
use candle_core::{Device, Tensor};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !wirl_model::invariant::available() {
        println!("no fixed-order kernels on this CPU (AVX2 + FMA), or WIRL_CPU_KERNELS=portable");
        return Ok(());
    }
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let mut next = wirl_model::test_values(7);
    println!("rows × inner → out   fixed-order ms   gemm ms   fixed/gemm");
    for (rows, inner, out) in [(800, 576, 576), (800, 576, 1536), (800, 1536, 576), (3000, 576, 576), (64, 576, 49152)]
    {
        let x: Vec<f32> = (0..rows * inner).map(|_| next()).collect();
        let w: Vec<f32> = (0..out * inner).map(|_| next()).collect();
        let x = Tensor::from_vec(x, (rows, inner), &Device::Cpu)?;
        let w = Tensor::from_vec(w, (out, inner), &Device::Cpu)?;
        let (mut fixed, mut gemm) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            let start = Instant::now();
            std::hint::black_box(wirl_model::invariant::matmul_t(&x, &w)?);
            fixed = fixed.min(start.elapsed().as_secs_f64());
            let start = Instant::now();
            std::hint::black_box(x.matmul(&w.t()?)?);
            gemm = gemm.min(start.elapsed().as_secs_f64());
        }
        println!("{rows} × {inner} → {out}   {:.2}   {:.2}   {:.3}", fixed * 1e3, gemm * 1e3, fixed / gemm);
    }
    Ok(())
}
