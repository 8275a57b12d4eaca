//! TensorBoard scalars beside `metrics.jsonl`: `RUN_DIR/tensorboard/events.out.tfevents.*`,
//! so that `tensorboard --logdir runs/` shows every run. Written here (a TFRecord file of
//! `Event` protocol buffers, a few fields of each) rather than through a TensorFlow binding.
//!
//! A record: the data's length (u64, little-endian), a masked CRC-32C of those 8 bytes, the
//! data, a masked CRC-32C of the data. The first event names the file version; each step is
//! one event with its step number, wall time and one `simple_value` per tag.

use crate::metrics::StepMetrics;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Appends events to one file of a run's `tensorboard/` directory (a new file per session,
/// as TensorBoard expects).
pub struct EventWriter {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

impl EventWriter {
    pub fn create(run_dir: &Path) -> crate::error::Result<Self> {
        let dir = run_dir.join("tensorboard");
        std::fs::create_dir_all(&dir)?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        // The name's last part is the writer's host in TensorFlow; any name does.
        let path = dir.join(format!("events.out.tfevents.{}.{}.wirl", now.as_secs(), std::process::id()));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        let mut writer = EventWriter { file: std::io::BufWriter::new(file), path };
        let mut event = Vec::new();
        field_f64(&mut event, 1, now.as_secs_f64());
        field_bytes(&mut event, 3, b"brain.Event:2");
        writer.record(&event)?;
        writer.file.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One step's scalars: the run's figures, the time split, and each task's.
    pub fn step(&mut self, metrics: &StepMetrics) -> crate::error::Result<()> {
        let mut scalars: Vec<(String, f64)> = vec![
            ("reward/mean".into(), f64::from(metrics.reward_mean)),
            ("reward/std".into(), f64::from(metrics.reward_std)),
            ("reward/pass_rate".into(), f64::from(metrics.pass_rate)),
            ("loss/loss".into(), f64::from(metrics.loss)),
            ("loss/kl".into(), f64::from(metrics.kl)),
            ("loss/entropy".into(), f64::from(metrics.entropy)),
            ("loss/clip_fraction".into(), f64::from(metrics.clip_fraction)),
            ("loss/grad_norm".into(), metrics.grad_norm),
            ("optim/learning_rate".into(), metrics.learning_rate),
            ("groups/kept".into(), metrics.groups_kept as f64),
            // Under dynamic sampling, draws of `prompts_per_step` tasks the step made (1 else).
            ("groups/draws".into(), metrics.draws as f64),
            ("groups/unusable".into(), metrics.groups_unusable as f64),
            ("groups/trajectories_masked".into(), metrics.trajectories_masked as f64),
            ("length/completion_tokens_mean".into(), f64::from(metrics.completion_tokens_mean)),
            ("length/completion_tokens_max".into(), metrics.completion_tokens_max as f64),
            ("prefix/prompt_positions_cached".into(), metrics.prompt_positions_cached as f64),
            ("prefix/prompt_positions_computed".into(), metrics.prompt_positions_computed as f64),
            ("time/generate_s".into(), metrics.time_s.generate),
            ("time/episodes_s".into(), metrics.time_s.episodes),
            ("time/agents_s".into(), metrics.time_s.agents),
            ("time/score_s".into(), metrics.time_s.score),
            ("time/train_s".into(), metrics.time_s.train),
            ("time/total_s".into(), metrics.time_s.total),
            // A step in this line marks a hot swap or rollback of the task set.
            ("manifest/generation".into(), metrics.manifest_generation as f64),
        ];
        if let (Some(mean), Some(max)) = (metrics.sampler_logp_diff_mean, metrics.sampler_logp_diff_max) {
            scalars.push(("sampler/logp_diff_mean".into(), mean));
            scalars.push(("sampler/logp_diff_max".into(), max));
        }
        // Under `grpo.kl_in_reward` (verl's `actor/reward_kl_penalty` and its coefficient).
        if let (Some(kl), Some(beta)) = (metrics.reward_kl, metrics.kl_coef) {
            scalars.push(("kl/reward".into(), kl));
            scalars.push(("kl/coef".into(), beta));
        }
        for (name, parts) in &metrics.parts {
            scalars.push((format!("parts/{name}"), f64::from(*parts)));
        }
        for (name, task) in &metrics.tasks {
            scalars.push((format!("tasks/{name}/reward_mean"), f64::from(task.reward_mean)));
            scalars.push((format!("tasks/{name}/pass_rate"), f64::from(task.pass_rate)));
            scalars.push((format!("tasks/{name}/completion_tokens_mean"), f64::from(task.completion_tokens_mean)));
        }
        self.scalars(metrics.step as i64, &scalars)
    }

    /// An event of `scalars` at `step` (non-finite values are left out: TensorBoard would
    /// draw them as gaps anyway, and JSON readers choke on them).
    pub fn scalars(&mut self, step: i64, scalars: &[(String, f64)]) -> crate::error::Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in scalars.iter().filter(|(_, v)| v.is_finite()) {
            let mut entry = Vec::new();
            field_bytes(&mut entry, 1, tag.as_bytes());
            field_f32(&mut entry, 2, *value as f32);
            field_bytes(&mut summary, 1, &entry);
        }
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64();
        let mut event = Vec::new();
        field_f64(&mut event, 1, wall);
        field_varint(&mut event, 2, step as u64);
        field_bytes(&mut event, 5, &summary);
        self.record(&event)?;
        self.file.flush()?;
        Ok(())
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let length = (data.len() as u64).to_le_bytes();
        self.file.write_all(&length)?;
        self.file.write_all(&masked_crc32c(&length).to_le_bytes())?;
        self.file.write_all(data)?;
        self.file.write_all(&masked_crc32c(data).to_le_bytes())
    }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u32, value: u64) {
    varint(out, u64::from(field << 3));
    varint(out, value);
}

fn field_f64(out: &mut Vec<u8>, field: u32, value: f64) {
    varint(out, u64::from(field << 3 | 1));
    out.extend(value.to_le_bytes());
}

fn field_f32(out: &mut Vec<u8>, field: u32, value: f32) {
    varint(out, u64::from(field << 3 | 5));
    out.extend(value.to_le_bytes());
}

fn field_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field << 3 | 2));
    varint(out, bytes.len() as u64);
    out.extend(bytes);
}

/// CRC-32C (Castagnoli), bitwise: event files are small and written once a step.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

/// TFRecord's masking of a CRC, so that a CRC of data holding CRCs stays well mixed.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xA282_EAD8)
}

/// One event read back: its step and its scalars by tag.
pub type ScalarEvent = (i64, Vec<(String, f32)>);

/// Read back an event file: each record checked, each event's step and scalars (for tests
/// and tools; the first event, the file version, has none).
pub fn read_scalars(path: &Path) -> crate::error::Result<Vec<ScalarEvent>> {
    use crate::error::{Context, bail};
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut at = 0;
    let mut events = Vec::new();
    while at < bytes.len() {
        let header = bytes.get(at..at + 12).context("a truncated record header")?;
        let length = u64::from_le_bytes(header[..8].try_into()?) as usize;
        if u32::from_le_bytes(header[8..12].try_into()?) != masked_crc32c(&header[..8]) {
            bail!("a record length's CRC does not match");
        }
        let data = bytes.get(at + 12..at + 12 + length).context("a truncated record")?;
        let crc = bytes.get(at + 12 + length..at + 16 + length).context("a truncated record CRC")?;
        if u32::from_le_bytes(crc.try_into()?) != masked_crc32c(data) {
            bail!("a record's CRC does not match");
        }
        at += 16 + length;
        let (mut step, mut scalars) = (0i64, Vec::new());
        for (field, value) in fields(data)? {
            match (field, value) {
                (2, Field::Varint(v)) => step = v as i64,
                (5, Field::Bytes(summary)) => {
                    for (_, value) in fields(summary)? {
                        let Field::Bytes(entry) = value else { continue };
                        let (mut tag, mut simple) = (String::new(), f32::NAN);
                        for (f, v) in fields(entry)? {
                            match (f, v) {
                                (1, Field::Bytes(t)) => tag = String::from_utf8_lossy(t).into_owned(),
                                (2, Field::Fixed32(x)) => simple = f32::from_le_bytes(x),
                                _ => {}
                            }
                        }
                        scalars.push((tag, simple));
                    }
                }
                _ => {}
            }
        }
        events.push((step, scalars));
    }
    Ok(events)
}

enum Field<'a> {
    Varint(u64),
    Fixed64,
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
}

fn fields(mut data: &[u8]) -> crate::error::Result<Vec<(u32, Field<'_>)>> {
    use crate::error::Context;
    fn read_varint(data: &mut &[u8]) -> crate::error::Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = data.split_first().context("a truncated varint")?;
            *data = rest;
            value |= u64::from(byte & 0x7F) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        crate::error::bail!("a varint too long")
    }
    let mut out = Vec::new();
    while !data.is_empty() {
        let key = read_varint(&mut data)?;
        let field = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Field::Varint(read_varint(&mut data)?),
            1 => {
                data = data.get(8..).context("a truncated fixed64")?;
                Field::Fixed64
            }
            5 => {
                let bytes: [u8; 4] = data.get(..4).context("a truncated fixed32")?.try_into()?;
                data = &data[4..];
                Field::Fixed32(bytes)
            }
            2 => {
                let length = read_varint(&mut data)? as usize;
                let bytes = data.get(..length).context("a truncated field")?;
                data = &data[length..];
                Field::Bytes(bytes)
            }
            other => crate::error::bail!("wire type {other}"),
        };
        out.push((field, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The CRC-32C of "123456789" is 0xE3069283 (RFC 3720's check value).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn scalars_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = EventWriter::create(dir.path()).unwrap();
        writer.scalars(3, &[("reward/mean".into(), 0.25), ("loss".into(), f64::NAN)]).unwrap();
        let path = writer.path().to_path_buf();
        let events = read_scalars(&path).unwrap();
        assert_eq!(events.len(), 2, "the file version, then the step");
        assert_eq!(events[1], (3, vec![("reward/mean".to_string(), 0.25)]));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 6;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(read_scalars(&path).is_err());
    }
}
