//! Writing directories whole or not at all, and safetensors files others can read.

use crate::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub(crate) fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io { file: path.display().to_string(), message: e.to_string() }
}

/// Make `dir` (which must not exist yet) by `fill`ing a directory beside it and renaming
/// that when `fill` succeeds: the directory appears whole or not at all.
pub(crate) fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if dir.exists() {
        return Err(Error::Io {
            file: dir.display().to_string(),
            message: "already exists; remove it or choose another directory".into(),
        });
    }
    let partial = partial_path(dir);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| io(&partial, e))?;
    }
    std::fs::create_dir_all(&partial).map_err(|e| io(&partial, e))?;
    fill(&partial)?;
    std::fs::rename(&partial, dir).map_err(|e| io(dir, e))
}

/// Save `tensors` (contiguous copies on the CPU, as safetensors wants) to `path`, readable
/// by others (the writer makes it private to the user; the directory is for sharing).
pub(crate) fn save_safetensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let cpu: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(name, t)| Ok((name.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_>>()?;
    candle_core::safetensors::save(&cpu, path)
        .map_err(|e| Error::Io { file: path.display().to_string(), message: e.to_string() })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| io(path, e))?;
    }
    Ok(())
}

fn partial_path(dir: &Path) -> PathBuf {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
    dir.with_file_name(format!(".{name}.partial"))
}
