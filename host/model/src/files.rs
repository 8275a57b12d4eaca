//! Writing directories whole or not at all, and safetensors files others can read.

use crate::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Io { file: path.display().to_string(), source: e }
}

/// Make `dir` (which must not exist yet) by `fill`ing a directory beside it and renaming
/// that when `fill` succeeds: the directory appears whole or not at all. `fill` fails in its
/// caller's errors (the engine's export writes its own files into it).
pub fn write_dir_atomically<E: From<Error>>(
    dir: &Path,
    fill: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    if dir.exists() {
        return Err(Error::Format {
            file: dir.display().to_string(),
            message: "already exists; remove it or choose another directory".into(),
        }
        .into());
    }
    let partial = partial_path(dir);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| io(&partial, e))?;
    }
    std::fs::create_dir_all(&partial).map_err(|e| io(&partial, e))?;
    fill(&partial)?;
    Ok(std::fs::rename(&partial, dir).map_err(|e| io(dir, e))?)
}

/// Save `tensors` (contiguous copies on the CPU, as safetensors wants) to `path`, readable
/// by others (the writer makes it private to the user; the directory is for sharing).
pub fn save_safetensors(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let cpu: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(name, t)| Ok((name.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_>>()?;
    candle_core::safetensors::save(&cpu, path).map_err(|e| io(path, std::io::Error::other(e)))?;
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

/// The most bytes read from a model's small files (`config.json`, `tokenizer_config.json`,
/// `generation_config.json`, an adapter's config): real ones are kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// The most bytes read from a `tokenizer.json` (Gemma 3's, the largest here, is 33 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// Open `path` for reading only if it is a regular file (a link is followed, then checked):
/// a FIFO would block for ever, `/dev/zero` would never end.
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    let metadata = std::fs::metadata(path).map_err(|e| io(path, e))?;
    if !metadata.is_file() {
        return Err(Error::Format {
            file: path.display().to_string(),
            message: "not a regular file (a model's files must be plain files, not FIFOs, devices or directories)"
                .into(),
        });
    }
    std::fs::File::open(path).map_err(|e| io(path, e))
}

/// The text of the regular file `path`, refused past `limit` bytes (naming the limit).
pub fn read_text_within(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let file = open_regular(path)?;
    let mut text = String::new();
    file.take(limit + 1).read_to_string(&mut text).map_err(|e| io(path, e))?;
    if text.len() as u64 > limit {
        return Err(Error::Format {
            file: path.display().to_string(),
            message: format!("over {limit} bytes: not a model's file of this kind"),
        });
    }
    Ok(text)
}

/// `name`, as a model's index gives it, inside `dir`: a relative path without `..`, and
/// (links followed) still inside `dir`. The error quotes `name` as given, never what it
/// resolves to.
pub fn inside(dir: &Path, name: &str, origin: &Path) -> Result<PathBuf> {
    let relative = Path::new(name);
    let plain = relative.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    let refuse = |why: &str| Error::Format {
        file: origin.display().to_string(),
        message: format!("names the file {name:?}: {why}; a shard must be a file inside the model's directory"),
    };
    if name.is_empty() || !plain {
        return Err(refuse("an absolute path or one through `..`"));
    }
    let joined = dir.join(relative);
    if let (Ok(real_dir), Ok(real)) = (dir.canonicalize(), joined.canonicalize())
        && !real.starts_with(&real_dir)
    {
        return Err(refuse("a link out of the directory"));
    }
    Ok(joined)
}
