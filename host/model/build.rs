//! With the `cuda` feature: `src/invariant.cu` compiled to PTX by the toolkit's nvcc (`$NVCC`,
//! or `nvcc` on the PATH; `scripts/build-cuda` provides one), for compute capability
//! `$CUDA_COMPUTE_CAP` (90 unless set). Without it, nothing.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/invariant.cu");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("invariant.ptx");
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", &format!("-arch=sm_{cap}"), "src/invariant.cu", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| {
            panic!("wirl-model's cuda feature runs `{nvcc}` (set NVCC, or run scripts/build-cuda): {e}")
        });
    assert!(status.success(), "`{nvcc}` could not compile src/invariant.cu ({status})");
}
