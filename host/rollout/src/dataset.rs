//! Datasets of tasks: JSONL, Parquet and Arrow IPC files and Hugging Face `save_to_disk`
//! directories, read in chunks (a Parquet row group, an Arrow record batch, 1,024 JSONL
//! lines) so that no file is loaded whole; rows become tasks through a column mapping.
//!
//! Training draws row `order(index)`: in file order, cycling over epochs, or — shuffled —
//! each epoch visits the chunks in a seeded order and each chunk's rows in a seeded order
//! (a block shuffle: one chunk decoded at a time, and the same index always gives the same
//! row, so a resumed run draws what an uninterrupted one would).

use crate::error::{Context, bail};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use wirl_sandbox::{Message, Task};

/// Which columns of a row make a task.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Columns {
    /// A text column: the user's message.
    pub prompt: Option<String>,
    /// A list of `{role, content}` column: the whole conversation (instead of `prompt`).
    pub messages: Option<String>,
    /// A system message put before the prompt (text, not a column).
    pub system: Option<String>,
    pub answer: Option<String>,
    pub id: Option<String>,
    /// Columns kept in the task's metadata (a JSON object by column name).
    pub metadata: Vec<String>,
}

/// A dataset file or directory and how to read it.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetSpec {
    pub path: PathBuf,
    /// `None`: JSONL lines are tasks (`{"task": {...}}` or the task itself), and other
    /// formats take the columns named `prompt` / `question` / `problem`, `answer`, `id`.
    pub columns: Option<Columns>,
    pub shuffle: bool,
    pub seed: u64,
}

/// Where a dataset's chunks come from.
enum Chunks {
    /// Byte offsets of the non-empty lines, and the sha256 of the bytes scanned for them
    /// (lines appended later leave those bytes as they were).
    Jsonl {
        path: PathBuf,
        lines: Vec<u64>,
        scanned: FileFingerprint,
    },
    Parquet {
        path: PathBuf,
    },
    /// Arrow IPC file format (random access to record batches).
    IpcFile {
        path: PathBuf,
    },
    /// Arrow IPC stream files (Hugging Face `save_to_disk`): per chunk, its file and the
    /// byte range of its record batch message; the file's schema message.
    IpcStream {
        chunks: Vec<(PathBuf, u64, u64)>,
        schemas: Vec<(PathBuf, Vec<u8>)>,
    },
}

const JSONL_CHUNK: usize = 1024;

/// The most bytes of text one row may hold (its messages, answer and metadata): a row is a
/// prompt, not a document, and one 100 MB cell would otherwise be tokenized whole. A row over
/// it is skipped and recorded, like any row that is not a task.
pub const MAX_ROW_BYTES: usize = 1 << 20;

impl Chunks {
    /// The files the chunks are read from, each once.
    fn files(&self) -> Vec<PathBuf> {
        match self {
            Chunks::Jsonl { path, .. } | Chunks::Parquet { path } | Chunks::IpcFile { path } => vec![path.clone()],
            Chunks::IpcStream { schemas, .. } => schemas.iter().map(|(path, _)| path.clone()).collect(),
        }
    }

    /// The file chunk `chunk` is read from.
    fn file_of(&self, chunk: usize) -> &Path {
        match self {
            Chunks::Jsonl { path, .. } | Chunks::Parquet { path } | Chunks::IpcFile { path } => path,
            Chunks::IpcStream { chunks, .. } => &chunks[chunk].0,
        }
    }
}

/// A row's task, if within [`MAX_ROW_BYTES`] and with text in every message.
fn bounded(task: Task) -> crate::error::Result<Task> {
    let bytes = task.messages.iter().map(|m| m.content.len() + m.role.len()).sum::<usize>()
        + task.answer.as_ref().map_or(0, String::len)
        + task.metadata.as_ref().map_or(0, String::len)
        + task.id.len();
    if bytes > MAX_ROW_BYTES {
        bail!(
            "{bytes} bytes of text, over the limit of {MAX_ROW_BYTES} bytes per row (a row is a prompt, not a \
             document); the row is skipped"
        );
    }
    Ok(task)
}

/// Open `path` for reading only if it is a regular file: a FIFO or a device as a dataset
/// would hang or never end.
fn open_regular(path: &Path) -> crate::error::Result<std::fs::File> {
    let metadata = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !metadata.is_file() {
        bail!("{}: not a regular file (a dataset is a file, or a save_to_disk directory)", path.display());
    }
    std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))
}

/// An opened dataset: its chunk sizes, and one decoded chunk kept.
pub struct Dataset {
    spec: DatasetSpec,
    name: String,
    chunks: Chunks,
    sizes: Vec<usize>,
    total: u64,
    /// Each file read, as it was when opened (or last found to have only grown by lines):
    /// rows are read later where they were then.
    opened: Vec<(PathBuf, std::cell::Cell<FileStat>)>,
    /// The chunk last read: each row's task, or why the row is not one.
    cached: Option<(usize, Vec<Result<Task, String>>)>,
}

/// What tells that a file changed after it was opened: its size and modification time.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FileStat {
    bytes: u64,
    modified: Option<SystemTime>,
}

impl FileStat {
    fn of(path: &Path) -> crate::error::Result<Self> {
        let metadata = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(FileStat { bytes: metadata.len(), modified: metadata.modified().ok() })
    }
}

/// A file that a dataset reads, as it was when fingerprinted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileFingerprint {
    pub bytes: u64,
    pub sha256: String,
}

/// Every file the dataset at `path` reads (the file itself, or a `save_to_disk` directory's
/// `state.json` and the files it names), with its size and sha256 now: what a run records
/// so that a resumed run can tell whether its rows are still the ones it trained on.
pub fn fingerprint(path: &Path) -> crate::error::Result<BTreeMap<PathBuf, FileFingerprint>> {
    let files = if path.is_dir() {
        let (state_path, data) = hf_data_files(path)?;
        std::iter::once(state_path).chain(data).collect()
    } else {
        vec![path.to_path_buf()]
    };
    let mut prints = BTreeMap::new();
    for file in files {
        let mut reader = open_regular(&file)?;
        let mut hasher = Sha256::new();
        let bytes = std::io::copy(&mut reader, &mut hasher).with_context(|| format!("reading {}", file.display()))?;
        prints.insert(file, FileFingerprint { bytes, sha256: hex::encode(hasher.finalize()) });
    }
    Ok(prints)
}

impl Dataset {
    /// Open `spec.path`, reading only what locates its rows (footers, line offsets).
    pub fn open(spec: &DatasetSpec) -> crate::error::Result<Self> {
        let path = &spec.path;
        let name = path.file_stem().map_or_else(|| "dataset".into(), |s| s.to_string_lossy().into_owned());
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
        let (chunks, sizes) = if path.is_dir() {
            hf_directory(path)?
        } else {
            match extension.as_str() {
                "jsonl" | "json" | "ndjson" => jsonl(path)?,
                "parquet" => parquet(path)?,
                "arrow" | "feather" | "ipc" => ipc(path)?,
                other => bail!(
                    "{}: unknown dataset format `.{other}` (JSONL, Parquet, Arrow IPC, or a Hugging Face \
                     save_to_disk directory)",
                    path.display()
                ),
            }
        };
        let total: u64 = sizes.iter().map(|&s| s as u64).sum();
        if total == 0 {
            bail!("{}: no rows", path.display());
        }
        let opened = chunks
            .files()
            .into_iter()
            .map(|file| Ok((file.clone(), std::cell::Cell::new(FileStat::of(&file)?))))
            .collect::<crate::error::Result<_>>()?;
        Ok(Dataset { spec: spec.clone(), name, chunks, sizes, total, opened, cached: None })
    }

    /// Whether a JSONL file now `now` big still begins with the bytes its lines were scanned in.
    fn only_appended(&self, now: FileStat) -> crate::error::Result<bool> {
        let Chunks::Jsonl { path, scanned, .. } = &self.chunks else {
            return Ok(false);
        };
        if now.bytes < scanned.bytes {
            return Ok(false);
        }
        let mut hasher = Sha256::new();
        std::io::copy(&mut open_regular(path)?.take(scanned.bytes), &mut hasher)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(hex::encode(hasher.finalize()) == scanned.sha256)
    }

    /// Refuse to read `file` if it changed since it was opened: its rows were located then
    /// (a JSONL line's offset, a Parquet row group, an Arrow batch's bytes), so an edited
    /// file would give other rows, or parts of rows, under the same indices.
    /// Lines appended to a JSONL file are no change: the rows scanned are where they were
    /// (the new ones are not read until the dataset is opened again).
    fn unchanged(&self, file: &Path) -> crate::error::Result<()> {
        let Some((_, opened)) = self.opened.iter().find(|(path, _)| path == file) else {
            return Ok(());
        };
        let (then, now) = (opened.get(), FileStat::of(file)?);
        if now != then && self.only_appended(now)? {
            opened.set(now);
            return Ok(());
        }
        if now != then {
            bail!(
                "{}: changed since the run opened it ({} bytes then, {} now{}): its rows were located when it was \
                 opened, so an edited dataset gives other rows under the same indices. Write a changed dataset to a \
                 new file and swap it in (`wirl ctl apply`), or start the run again",
                file.display(),
                then.bytes,
                now.bytes,
                if now.bytes == then.bytes { ", modified since" } else { "" }
            );
        }
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The task of training index `index` (epochs cycle; shuffled if asked).
    pub fn training(&mut self, index: u64) -> crate::error::Result<Task> {
        let (epoch, position) = (index / self.total, index % self.total);
        let (chunk, row) = if self.spec.shuffle { self.shuffled(epoch, position) } else { self.locate(position) };
        self.task(chunk, row)
    }

    /// The first `count` rows, in file order.
    pub fn first(&mut self, count: usize) -> crate::error::Result<Vec<Task>> {
        self.rows(0, count)
    }

    /// Rows `start .. start + count`, in file order (fewer past the end).
    pub fn rows(&mut self, start: u64, count: usize) -> crate::error::Result<Vec<Task>> {
        (start..start.saturating_add(count as u64)).map_while(|i| self.row(i)).collect()
    }

    /// Row `i` in file order, or why it is no task (`None` past the end).
    pub fn row(&mut self, i: u64) -> Option<crate::error::Result<Task>> {
        (i < self.total).then(|| {
            let (chunk, row) = self.locate(i);
            self.task(chunk, row)
        })
    }

    fn locate(&self, mut position: u64) -> (usize, usize) {
        for (chunk, &size) in self.sizes.iter().enumerate() {
            if position < size as u64 {
                return (chunk, position as usize);
            }
            position -= size as u64;
        }
        unreachable!("position below the total")
    }

    fn shuffled(&self, epoch: u64, mut position: u64) -> (usize, usize) {
        let seed = crate::seed::seed_for(self.spec.seed, epoch);
        for chunk in permutation(self.sizes.len(), seed) {
            let size = self.sizes[chunk];
            if position < size as u64 {
                let rows = permutation(size, crate::seed::seed_for(seed, chunk as u64 + 1));
                return (chunk, rows[position as usize]);
            }
            position -= size as u64;
        }
        unreachable!("position below the total")
    }

    fn task(&mut self, chunk: usize, row: usize) -> crate::error::Result<Task> {
        if self.cached.as_ref().is_none_or(|(c, _)| *c != chunk) {
            let tasks = self.read_chunk(chunk).with_context(|| format!("{}", self.spec.path.display()))?;
            self.cached = Some((chunk, tasks));
        }
        let (_, tasks) = self.cached.as_ref().expect("just cached");
        match tasks.get(row).ok_or_else(|| crate::Error::Internal("a row past its chunk's end".into()))? {
            Ok(task) => Ok(task.clone()),
            Err(reason) => bail!("{}: {reason}", self.spec.path.display()),
        }
    }

    /// The tasks of one chunk: a row that is not a task is its own failure (it is skipped
    /// and recorded), a chunk that cannot be read fails whole.
    fn read_chunk(&self, chunk: usize) -> crate::error::Result<Vec<Result<Task, String>>> {
        self.unchanged(self.chunks.file_of(chunk))?;
        let first_row: usize = self.sizes[..chunk].iter().sum();
        let columns = self.spec.columns.as_ref();
        let batch =
            match &self.chunks {
                Chunks::Jsonl { path, lines, scanned } => {
                    let mut file = std::io::BufReader::new(open_regular(path)?);
                    let mut tasks = Vec::new();
                    for (i, &offset) in lines.iter().enumerate().skip(chunk * JSONL_CHUNK).take(JSONL_CHUNK) {
                        file.seek(SeekFrom::Start(offset))?;
                        let mut line = Vec::new();
                        // A line is read up to the row limit (and a little JSON around it), never whole,
                        // and never past the bytes scanned (a last line without its newline stays
                        // itself when lines are appended).
                        let within = (MAX_ROW_BYTES as u64 * 2).min(scanned.bytes.saturating_sub(offset));
                        (&mut file).take(within).read_until(b'\n', &mut line)?;
                        let task = || -> crate::error::Result<Task> {
                            if line.len() >= MAX_ROW_BYTES * 2 {
                                bail!(
                                    "over {} bytes, past the limit of {MAX_ROW_BYTES} bytes of text per row; the row \
                                 is skipped",
                                    MAX_ROW_BYTES * 2
                                );
                            }
                            let value: serde_json::Value = serde_json::from_slice(&line).context("not JSON")?;
                            match columns {
                                None => {
                                    let task = value.get("task").cloned().unwrap_or(value);
                                    serde_json::from_value(task).context(
                                    "not a task (fields id, messages, answer?, metadata?); name its columns to read \
                                     other rows",
                                )
                                }
                                Some(columns) => json_row_task(&value, columns, &self.name, i),
                            }
                        };
                        tasks.push(task().and_then(bounded).map_err(|e| {
                            format!("line {}: {}", line_number(path, offset), wirl_engine::error_chain(&e))
                        }));
                    }
                    return Ok(tasks);
                }
                Chunks::Parquet { path } => {
                    let file = open_regular(path)?;
                    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
                        .with_row_groups(vec![chunk])
                        .build()?;
                    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>()?;
                    concat(batches)?
                }
                Chunks::IpcFile { path } => {
                    let mut reader = arrow_ipc::reader::FileReader::try_new(open_regular(path)?, None)?;
                    reader.set_index(chunk)?;
                    reader.next().context("a record batch")??
                }
                Chunks::IpcStream { chunks, schemas } => {
                    let (path, start, end) = &chunks[chunk];
                    let schema = &schemas.iter().find(|(p, _)| p == path).context("the file's schema")?.1;
                    let mut bytes = schema.clone();
                    let mut file = open_regular(path)?;
                    file.seek(SeekFrom::Start(*start))?;
                    let mut message = vec![0u8; (end - start) as usize];
                    file.read_exact(&mut message)?;
                    bytes.extend(message);
                    bytes.extend([0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
                    let mut reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
                    reader.next().context("a record batch")??
                }
            };
        Ok(batch_tasks(&batch, columns, &self.name, first_row)?
            .into_iter()
            .map(|r| r.map_err(|e| wirl_engine::error_chain(&e)))
            .collect())
    }
}

fn line_number(path: &Path, offset: u64) -> usize {
    // Only for messages: count the lines before `offset`.
    std::fs::File::open(path).map(|f| std::io::BufReader::new(f.take(offset)).lines().count() + 1).unwrap_or(0)
}

/// A seeded permutation of `0..n` (Fisher–Yates over SplitMix64).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = seed;
    for i in (1..n).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let r = crate::seed::seed_for(state, 0);
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    order
}

fn jsonl(path: &Path) -> crate::error::Result<(Chunks, Vec<usize>)> {
    let mut file = std::io::BufReader::new(open_regular(path)?);
    let mut lines = Vec::new();
    let mut offset = 0u64;
    let mut hasher = Sha256::new();
    loop {
        // Only where lines start is kept: a line is scanned buffer by buffer, never held.
        let mut read = 0usize;
        let mut content = false;
        loop {
            let buffer = file.fill_buf()?;
            if buffer.is_empty() {
                break;
            }
            let (take, end) = match buffer.iter().position(|&b| b == b'\n') {
                Some(at) => (at + 1, true),
                None => (buffer.len(), false),
            };
            content |= buffer[..take].iter().any(|b| !b.is_ascii_whitespace());
            hasher.update(&buffer[..take]);
            file.consume(take);
            read += take;
            if end {
                break;
            }
        }
        if read == 0 {
            break;
        }
        if content {
            lines.push(offset);
        }
        offset += read as u64;
    }
    let sizes = lines.chunks(JSONL_CHUNK).map(<[u64]>::len).collect();
    let scanned = FileFingerprint { bytes: offset, sha256: hex::encode(hasher.finalize()) };
    Ok((Chunks::Jsonl { path: path.to_path_buf(), lines, scanned }, sizes))
}

fn parquet(path: &Path) -> crate::error::Result<(Chunks, Vec<usize>)> {
    let file = open_regular(path)?;
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("{}: not a Parquet file", path.display()))?;
    let sizes = builder.metadata().row_groups().iter().map(|rg| rg.num_rows() as usize).collect();
    Ok((Chunks::Parquet { path: path.to_path_buf() }, sizes))
}

fn ipc(path: &Path) -> crate::error::Result<(Chunks, Vec<usize>)> {
    let mut magic = [0u8; 6];
    open_regular(path)?
        .read_exact(&mut magic)
        .with_context(|| format!("{}: too short for Arrow IPC", path.display()))?;
    if &magic == b"ARROW1" {
        let mut reader = arrow_ipc::reader::FileReader::try_new(std::fs::File::open(path)?, None)
            .with_context(|| format!("{}: not an Arrow IPC file", path.display()))?;
        let mut sizes = Vec::new();
        for i in 0..reader.num_batches() {
            reader.set_index(i)?;
            sizes.push(reader.next().context("a record batch")??.num_rows());
        }
        return Ok((Chunks::IpcFile { path: path.to_path_buf() }, sizes));
    }
    let (chunks, schema, sizes) = ipc_stream(path)?;
    Ok((Chunks::IpcStream { chunks, schemas: vec![(path.to_path_buf(), schema)] }, sizes))
}

/// The messages of an Arrow IPC stream: its schema message's bytes, and per record batch
/// the byte range of its message and its row count.
#[allow(clippy::type_complexity)]
fn ipc_stream(path: &Path) -> crate::error::Result<(Vec<(PathBuf, u64, u64)>, Vec<u8>, Vec<usize>)> {
    let bad = |what: &str| crate::error::invalid!("{}: not an Arrow IPC stream ({what})", path.display());
    let mut file = std::io::BufReader::new(open_regular(path)?);
    let size = file.get_ref().metadata()?.len();
    // Each message: [0xFFFFFFFF] length, metadata, body. Only the metadata is read; bodies
    // are skipped, so opening a stream reads a few bytes per record batch.
    let read_u32 = |file: &mut std::io::BufReader<std::fs::File>| -> crate::error::Result<Option<u32>> {
        let mut word = [0u8; 4];
        match file.read_exact(&mut word) {
            Ok(()) => Ok(Some(u32::from_le_bytes(word))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    let (mut schema, mut chunks, mut sizes) = (None, Vec::new(), Vec::new());
    let mut at = 0u64;
    loop {
        let start = at;
        let Some(mut word) = read_u32(&mut file)? else { break };
        at += 4;
        if word == 0xFFFF_FFFF {
            word = read_u32(&mut file)?.ok_or_else(|| bad("truncated"))?;
            at += 4;
        }
        if word == 0 {
            break; // end of stream
        }
        let mut metadata = vec![0u8; word as usize];
        if at + u64::from(word) > size {
            return Err(bad("truncated"));
        }
        file.read_exact(&mut metadata)?;
        at += u64::from(word);
        let message = arrow_ipc::root_as_message(&metadata).map_err(|_| bad("a damaged message"))?;
        let body = u64::try_from(message.bodyLength()).map_err(|_| bad("a negative body"))?;
        let end = at.checked_add(body).filter(|&e| e <= size).ok_or_else(|| bad("truncated"))?;
        match message.header_type() {
            arrow_ipc::MessageHeader::Schema => {
                let mut bytes = vec![0u8; (end - start) as usize];
                file.seek(SeekFrom::Start(start))?;
                file.read_exact(&mut bytes)?;
                schema = Some(bytes);
            }
            arrow_ipc::MessageHeader::RecordBatch => {
                let rows = message.header_as_record_batch().map_or(0, |b| b.length());
                sizes.push(usize::try_from(rows).map_err(|_| bad("a negative row count"))?);
                chunks.push((path.to_path_buf(), start, end));
            }
            arrow_ipc::MessageHeader::DictionaryBatch => {
                bail!("{}: dictionary-encoded columns are not supported; write plain columns", path.display())
            }
            _ => {}
        }
        file.seek(SeekFrom::Start(end))?;
        at = end;
    }
    Ok((chunks, schema.ok_or_else(|| bad("no schema"))?, sizes))
}

/// A Hugging Face `save_to_disk` directory: `state.json` names its Arrow stream files.
fn hf_directory(dir: &Path) -> crate::error::Result<(Chunks, Vec<usize>)> {
    let (_, files) = hf_data_files(dir)?;
    let (mut chunks, mut schemas, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    for file in files {
        let (c, schema, s) = ipc_stream(&file)?;
        chunks.extend(c);
        sizes.extend(s);
        schemas.push((file, schema));
    }
    Ok((Chunks::IpcStream { chunks, schemas }, sizes))
}

/// The largest `state.json` read (Hugging Face's name a few files in a few KiB).
const STATE_JSON_BYTES: u64 = 16 << 20;

/// A `save_to_disk` directory's `state.json` and the Arrow stream files it names.
fn hf_data_files(dir: &Path) -> crate::error::Result<(PathBuf, Vec<PathBuf>)> {
    let state_path = dir.join("state.json");
    let mut text = String::new();
    // A regular file, and within reason: a state.json names a few files.
    open_regular(&state_path)
        .with_context(|| format!("{}: no state.json (not a save_to_disk directory)", dir.display()))?
        .take(STATE_JSON_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", state_path.display()))?;
    if text.len() as u64 > STATE_JSON_BYTES {
        bail!("{}: over {STATE_JSON_BYTES} bytes: not a save_to_disk directory's state", state_path.display());
    }
    let state: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", state_path.display()))?;
    let files = state["_data_files"]
        .as_array()
        .with_context(|| format!("{}: no `_data_files`", state_path.display()))?
        .iter()
        .filter_map(|f| f["filename"].as_str())
        .map(|name| confined(dir, name, &state_path))
        .collect::<crate::error::Result<_>>()?;
    Ok((state_path, files))
}

/// A file that a `save_to_disk` directory's `state.json` names: a plain name inside the
/// directory (no `..`, no absolute path, no link out of it).
fn confined(dir: &Path, name: &str, state_path: &Path) -> crate::error::Result<PathBuf> {
    let plain = Path::new(name).components().all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain || name.is_empty() {
        bail!(
            "{}: `_data_files` names {name:?}, which is not a file inside its directory; refused",
            state_path.display()
        );
    }
    let path = dir.join(name);
    let (real, root) = (path.canonicalize(), dir.canonicalize());
    if let (Ok(real), Ok(root)) = (&real, &root)
        && !real.starts_with(root)
    {
        bail!("{}: `_data_files` names {name:?}, a link out of its directory; refused", state_path.display());
    }
    Ok(path)
}

fn concat(batches: Vec<RecordBatch>) -> crate::error::Result<RecordBatch> {
    let schema = batches.first().context("no rows in the chunk")?.schema();
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}

/// The task of each row of `batch` (`first_row`: the batch's first row's number).
fn batch_tasks(
    batch: &RecordBatch,
    columns: Option<&Columns>,
    name: &str,
    first_row: usize,
) -> crate::error::Result<Vec<crate::error::Result<Task>>> {
    let schema = batch.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let find = |wanted: &Option<String>, defaults: &[&str], what: &str| -> crate::error::Result<Option<usize>> {
        match wanted {
            Some(column) => names.iter().position(|n| n == column).map(Some).with_context(|| {
                format!("no column `{column}` for the {what} (the columns are: {})", names.join(", "))
            }),
            None => Ok(defaults.iter().find_map(|d| names.iter().position(|n| n == d))),
        }
    };
    let default = Columns::default();
    let columns = columns.unwrap_or(&default);
    let messages = find(&columns.messages, &["messages"], "messages")?;
    let prompt =
        if messages.is_none() { find(&columns.prompt, &["prompt", "question", "problem"], "prompt")? } else { None };
    if messages.is_none() && prompt.is_none() {
        bail!(
            "no prompt column: name one as `columns.prompt` (or a list of messages as `columns.messages`); the \
             columns are: {}",
            names.join(", ")
        );
    }
    let answer = find(&columns.answer, &["answer"], "answer")?;
    let id = find(&columns.id, &["id"], "id")?;
    let metadata: Vec<usize> = columns
        .metadata
        .iter()
        .map(|c| find(&Some(c.clone()), &[], "metadata").map(|i| i.expect("named")))
        .collect::<crate::error::Result<_>>()?;
    let task_of = |row: usize| -> crate::error::Result<Task> {
        let cell = |column: usize| value(batch.column(column).as_ref(), row, names[column]);
        let mut conversation = Vec::new();
        if let Some(system) = &columns.system {
            conversation.push(Message { role: "system".into(), content: system.clone() });
        }
        if let Some(column) = messages {
            conversation.extend(message_list(batch.column(column).as_ref(), row, names[column])?);
        } else if let Some(column) = prompt {
            let text = match cell(column)? {
                serde_json::Value::Null => bail!("the prompt (column `{}`) is null; the row is skipped", names[column]),
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            };
            conversation.push(Message { role: "user".into(), content: text });
        }
        let text_of = |v: serde_json::Value| match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s),
            other => Some(other.to_string()),
        };
        let meta: serde_json::Map<String, serde_json::Value> =
            metadata.iter().map(|&c| Ok((names[c].to_string(), cell(c)?))).collect::<crate::error::Result<_>>()?;
        Ok(Task {
            id: match id {
                Some(c) => text_of(cell(c)?).unwrap_or_else(|| format!("{name}/{}", first_row + row)),
                None => format!("{name}/{}", first_row + row),
            },
            messages: conversation,
            answer: match answer {
                Some(c) => text_of(cell(c)?),
                None => None,
            },
            metadata: (!meta.is_empty()).then(|| serde_json::Value::Object(meta).to_string()),
        })
    };
    Ok((0..batch.num_rows())
        .map(|row| task_of(row).and_then(bounded).with_context(|| format!("row {}", first_row + row)))
        .collect())
}

/// One cell as JSON: text, numbers and booleans; other types name the column.
fn value(array: &dyn Array, row: usize, column: &str) -> crate::error::Result<serde_json::Value> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    if array.is_null(row) {
        return Ok(serde_json::Value::Null);
    }
    Ok(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).into(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).into(),
        DataType::Utf8View => array.as_string_view().value(row).into(),
        DataType::Boolean => array.as_boolean().value(row).into(),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(row).into(),
        DataType::Float32 => serde_json::Number::from_f64(f64::from(array.as_primitive::<Float32Type>().value(row)))
            .map_or(serde_json::Value::Null, Into::into),
        DataType::Float64 => serde_json::Number::from_f64(array.as_primitive::<Float64Type>().value(row))
            .map_or(serde_json::Value::Null, Into::into),
        other => bail!("column `{column}` is of type {other}, which a task cannot hold (text, numbers, booleans)"),
    })
}

/// A list of `{role, content}` structs as messages.
fn message_list(array: &dyn Array, row: usize, column: &str) -> crate::error::Result<Vec<Message>> {
    use arrow_array::cast::AsArray;
    let list = match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().value(row),
        DataType::LargeList(_) => array.as_list::<i64>().value(row),
        other => bail!("column `{column}` is of type {other}; messages are a list of {{role, content}}"),
    };
    let Some(structs) = list.as_struct_opt() else {
        bail!("column `{column}`: messages are a list of {{role, content}} structs");
    };
    let field = |name: &str| {
        structs.column_by_name(name).with_context(|| format!("column `{column}`: its messages have no `{name}`"))
    };
    let (roles, contents) = (field("role")?, field("content")?);
    (0..structs.len())
        .map(|i| {
            let text = |a: &dyn Array, what: &str| -> crate::Result<String> {
                match value(a, i, column)? {
                    serde_json::Value::String(s) => Ok(s),
                    other => bail!("column `{column}`: a message's {what} is {other}, not text"),
                }
            };
            Ok(Message { role: text(roles.as_ref(), "role")?, content: text(contents.as_ref(), "content")? })
        })
        .collect()
}

/// A JSONL row (an object) as a task through `columns`.
fn json_row_task(row: &serde_json::Value, columns: &Columns, name: &str, index: usize) -> crate::error::Result<Task> {
    let object = row.as_object().context("not a JSON object")?;
    let get = |column: &Option<String>, defaults: &[&str]| -> Option<&serde_json::Value> {
        match column {
            Some(c) => object.get(c),
            None => defaults.iter().find_map(|d| object.get(*d)),
        }
    };
    let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let mut messages = Vec::new();
    if let Some(system) = &columns.system {
        messages.push(Message { role: "system".into(), content: system.clone() });
    }
    if let Some(list) = get(&columns.messages, &["messages"]) {
        let list: Vec<Message> =
            serde_json::from_value(list.clone()).context("`messages` is not a list of {role, content}")?;
        messages.extend(list);
    } else if let Some(prompt) = get(&columns.prompt, &["prompt", "question", "problem"]) {
        if prompt.is_null() {
            bail!("the prompt is null; the row is skipped");
        }
        messages.push(Message { role: "user".into(), content: text(prompt) });
    } else {
        bail!("no prompt: name its column as `columns.prompt` (or `columns.messages`)");
    }
    let metadata: serde_json::Map<String, serde_json::Value> =
        columns.metadata.iter().filter_map(|c| Some((c.clone(), object.get(c)?.clone()))).collect();
    Ok(Task {
        id: get(&columns.id, &["id"]).map_or_else(|| format!("{name}/{index}"), text),
        messages,
        answer: get(&columns.answer, &["answer"]).filter(|v| !v.is_null()).map(text),
        metadata: (!metadata.is_empty()).then(|| serde_json::Value::Object(metadata).to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, StringArray};
    use std::sync::Arc;

    /// A Parquet cell of several MiB is skipped (named, before it is tokenized) and a null
    /// prompt refused; the rows around them read as ever.
    #[test]
    fn oversize_and_null_parquet_cells_are_refused_by_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.parquet");
        let huge = "x".repeat(3 * MAX_ROW_BYTES);
        let prompts: ArrayRef =
            Arc::new(StringArray::from(vec![Some("2 + 2?"), Some(huge.as_str()), None, Some("3 + 3?")]));
        let answers: ArrayRef = Arc::new(StringArray::from(vec!["4", "1", "5", "6"]));
        let batch = RecordBatch::try_from_iter([("prompt", prompts), ("answer", answers)]).unwrap();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();

        let columns = Columns { prompt: Some("prompt".into()), answer: Some("answer".into()), ..Columns::default() };
        let mut dataset =
            Dataset::open(&DatasetSpec { path, columns: Some(columns), shuffle: false, seed: 0 }).unwrap();
        assert_eq!(dataset.training(0).unwrap().messages[0].content, "2 + 2?");
        let error = wirl_engine::error_chain(&dataset.training(1).unwrap_err());
        assert!(error.contains("row 1") && error.contains("over the limit") && error.contains("per row"), "{error}");
        let error = wirl_engine::error_chain(&dataset.training(2).unwrap_err());
        assert!(error.contains("row 2") && error.contains("null"), "{error}");
        assert_eq!(dataset.training(3).unwrap().answer.as_deref(), Some("6"));
    }
}
