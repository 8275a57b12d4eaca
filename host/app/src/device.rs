//! `--device` as the commands take it.

use wirl_trainer::config::DeviceSpec;

/// `cpu`, `cuda` or `cuda:N`, opened.
pub fn parse_device(text: &str) -> anyhow::Result<wirl_engine::Device> {
    let ordinal = match DeviceSpec::parse(text) {
        Some(DeviceSpec::Cpu) => return Ok(wirl_engine::Device::Cpu),
        Some(DeviceSpec::Cuda(ordinal)) => ordinal,
        None => anyhow::bail!("--device {text:?}: expected cpu, cuda or cuda:N"),
    };
    if !cfg!(feature = "cuda") {
        anyhow::bail!("--device {text}: this wirl was built without CUDA; build one with scripts/build-cuda");
    }
    wirl_engine::Device::new_cuda(ordinal).map_err(|e| anyhow::anyhow!("--device {text}: {e}"))
}
