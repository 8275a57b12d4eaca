//! With the `mpi` feature: link Open MPI's library where its compiler wrapper says it is.
//! Nothing otherwise (the default build needs no MPI).

fn main() {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_MPI");
    if std::env::var_os("CARGO_FEATURE_MPI").is_none() {
        return;
    }
    let output = std::process::Command::new("mpicc").arg("--showme:link").output();
    let flags = match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => panic!(
            "the `mpi` feature needs Open MPI's `mpicc` on PATH (Debian: apt install libopenmpi-dev openmpi-bin)"
        ),
    };
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        } else if flag.starts_with("-Wl,") {
            println!("cargo:rustc-link-arg={flag}");
        }
    }
}
