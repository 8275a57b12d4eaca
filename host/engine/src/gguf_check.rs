//! What candle's GGUF reader takes on trust, checked first: the data alignment (0 divided
//! by in its reader) and the tensors' dimensions (their product overflowed in its size
//! arithmetic). Both are refusals naming the file and the field, never a panic.

use candle_core::quantized::gguf_file;
use std::io::{BufReader, Read, Seek, SeekFrom};

/// Deepest nesting of arrays read (candle refuses deeper ones too).
const MAX_DEPTH: u32 = 4;
/// The most elements a GGUF tensor may have (2^40: ~10^12, beyond any model's tensor).
pub const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

/// The metadata key `general.alignment`, if the file sets it, checked: a power of two
/// (candle's reader divides by it). The file is read without trusting any length in it;
/// a file this scan cannot follow (cut short, not GGUF) is left to candle's reader, whose
/// error says so.
pub fn alignment(file: &mut std::fs::File) -> Result<Option<u64>, crate::Refused> {
    let found = scan_alignment(file);
    file.seek(SeekFrom::Start(0)).map_err(|e| crate::Refused(e.to_string()))?;
    let Ok(Some(value)) = found else { return Ok(None) };
    if value <= 0 || !(value as u128).is_power_of_two() || value > 1 << 20 {
        return Err(crate::refused!(
            "metadata key `general.alignment` is {value}: it must be a power of two up to 2^20 (llama.cpp writes 32)"
        ));
    }
    Ok(Some(value as u64))
}

/// The value of `general.alignment` as the file gives it (an integer of any width).
fn scan_alignment(file: &mut std::fs::File) -> Result<Option<i128>, crate::Refused> {
    let size = file.seek(SeekFrom::End(0)).map_err(|e| crate::Refused(e.to_string()))?;
    file.seek(SeekFrom::Start(0)).map_err(|e| crate::Refused(e.to_string()))?;
    let mut reader = Scanner { inner: BufReader::new(&mut *file), size, wide: true };
    if reader.u32()? != 0x4655_4747 {
        return Ok(None);
    }
    reader.wide = reader.u32()? >= 2;
    let _tensors = reader.length()?;
    let entries = reader.length()?;
    let mut found = None;
    for _ in 0..entries {
        let key = reader.string()?;
        let kind = reader.u32()?;
        if key == "general.alignment" {
            found = Some(match kind {
                0 => i128::from(reader.bytes::<1>()?[0]),
                1 => i128::from(reader.bytes::<1>()?[0] as i8),
                2 => i128::from(u16::from_le_bytes(reader.bytes()?)),
                3 => i128::from(i16::from_le_bytes(reader.bytes()?)),
                4 => i128::from(u32::from_le_bytes(reader.bytes()?)),
                5 => i128::from(i32::from_le_bytes(reader.bytes()?)),
                10 => i128::from(u64::from_le_bytes(reader.bytes()?)),
                11 => i128::from(i64::from_le_bytes(reader.bytes()?)),
                // Not an integer: candle's reader uses its default alignment.
                other => {
                    reader.skip_value(other, 0)?;
                    continue;
                }
            });
        } else {
            reader.skip_value(kind, 0)?;
        }
    }
    Ok(found)
}

/// Every tensor's dimensions multiplied without overflow and within [`MAX_TENSOR_ELEMENTS`].
pub fn tensor_dims(content: &gguf_file::Content) -> Result<(), crate::Refused> {
    for (name, info) in &content.tensor_infos {
        let elements = info.shape.dims().iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        if elements.is_none_or(|n| n > MAX_TENSOR_ELEMENTS) {
            return Err(crate::refused!(
                "tensor `{name}` has dimensions {:?}: more than {MAX_TENSOR_ELEMENTS} elements",
                info.shape.dims()
            ));
        }
    }
    Ok(())
}

struct Scanner<R> {
    inner: R,
    size: u64,
    /// GGUF v2 and later write lengths as u64, v1 as u32.
    wide: bool,
}

impl<R: Read + Seek> Scanner<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], crate::Refused> {
        let mut out = [0u8; N];
        self.inner.read_exact(&mut out).map_err(|_| "cut short in its metadata".to_string())?;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, crate::Refused> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn length(&mut self) -> Result<u64, crate::Refused> {
        if self.wide { Ok(u64::from_le_bytes(self.bytes()?)) } else { Ok(u64::from(self.u32()?)) }
    }

    /// Skip `bytes`, refusing to pass the end of the file.
    fn skip(&mut self, bytes: u64) -> Result<(), crate::Refused> {
        let at = self.inner.stream_position().map_err(|e| crate::Refused(e.to_string()))?;
        if at.checked_add(bytes).is_none_or(|end| end > self.size) {
            return Err("a length in its metadata runs past the end of the file".into());
        }
        self.inner.seek_relative(bytes as i64).map_err(|e| crate::Refused(e.to_string()))
    }

    fn string(&mut self) -> Result<String, crate::Refused> {
        let length = self.length()?;
        if length > 1 << 16 {
            self.skip(length)?;
            return Ok(String::new());
        }
        let at = self.inner.stream_position().map_err(|e| crate::Refused(e.to_string()))?;
        if at.saturating_add(length) > self.size {
            return Err("a length in its metadata runs past the end of the file".into());
        }
        let mut text = vec![0u8; length as usize];
        self.inner.read_exact(&mut text).map_err(|_| "cut short in its metadata".to_string())?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    fn skip_value(&mut self, kind: u32, depth: u32) -> Result<(), crate::Refused> {
        match kind {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4..=6 => self.skip(4),
            10..=12 => self.skip(8),
            8 => {
                let length = self.length()?;
                self.skip(length)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err("arrays nested too deep in its metadata".into());
                }
                let inner = self.u32()?;
                let count = self.length()?;
                let fixed = match inner {
                    0 | 1 | 7 => Some(1u64),
                    2 | 3 => Some(2),
                    4..=6 => Some(4),
                    10..=12 => Some(8),
                    _ => None,
                };
                match fixed {
                    Some(width) => self.skip(count.checked_mul(width).ok_or("an array's length overflows")?),
                    None => {
                        // Each element takes at least a byte: a count past the file's end is a lie.
                        let at = self.inner.stream_position().map_err(|e| crate::Refused(e.to_string()))?;
                        if count > self.size.saturating_sub(at) {
                            return Err("an array's length runs past the end of the file".into());
                        }
                        (0..count).try_for_each(|_| self.skip_value(inner, depth + 1))
                    }
                }
            }
            other => Err(crate::refused!("unknown metadata value type {other}")),
        }
    }
}
