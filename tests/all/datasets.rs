//! Datasets: Parquet, Arrow IPC (file and stream), Hugging Face `save_to_disk` directories
//! and JSONL rows, read a chunk at a time through a column mapping; seeded shuffling over
//! epochs; damaged files named.

use std::path::PathBuf;
use wirl_rollout::{Columns, Dataset, DatasetSpec};

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn word_problems(path: PathBuf, shuffle: bool) -> Dataset {
    let columns = Columns {
        prompt: Some("question".into()),
        system: Some("Answer with the final number inside <answer></answer> tags.".into()),
        metadata: vec!["template".into()],
        ..Columns::default()
    };
    Dataset::open(&DatasetSpec { path, columns: Some(columns), shuffle, seed: 5 }).unwrap()
}

/// The same 30 rows as Parquet, an Arrow IPC file and a `save_to_disk` directory (both in
/// batches of 8) give the same tasks: id, system + user messages, answer, metadata.
#[test]
fn parquet_arrow_and_save_to_disk_give_the_same_tasks() {
    let examples = root().join("examples/word-problems");
    let fixtures = root().join("tests/fixtures/datasets");
    let mut parquet = word_problems(examples.join("eval.parquet"), false);
    assert_eq!(parquet.len(), 200);
    let expected = parquet.first(30).unwrap();
    assert_eq!(expected[3].id, "word-problems/eval/3");
    assert_eq!(expected[3].messages.len(), 2);
    assert_eq!(expected[3].messages[0].role, "system");
    assert!(expected[3].messages[1].content.ends_with('?'), "{:?}", expected[3].messages[1]);
    assert!(expected[3].answer.as_deref().is_some_and(|a| a.parse::<i64>().is_ok()));
    let metadata: serde_json::Value = serde_json::from_str(expected[3].metadata.as_deref().unwrap()).unwrap();
    assert!(metadata["template"].is_i64(), "{metadata}");
    for other in [fixtures.join("word-problems.arrow"), fixtures.join("hf-word-problems")] {
        let mut dataset = word_problems(other.clone(), false);
        assert_eq!(dataset.len(), 30, "{}", other.display());
        let tasks = dataset.first(30).unwrap();
        for (a, b) in expected.iter().zip(&tasks) {
            assert_eq!((&a.id, &a.messages, &a.answer, &a.metadata), (&b.id, &b.messages, &b.answer, &b.metadata));
        }
        // Training indices past the end cycle over epochs.
        assert_eq!(dataset.training(31).unwrap().id, expected[1].id);
    }
}

/// Shuffled: the same index always gives the same row; each epoch visits every row once,
/// in another order than the file's and than the epoch before.
#[test]
fn shuffling_is_seeded_covers_each_epoch_and_differs_between_epochs() {
    let path = root().join("examples/word-problems/train.parquet");
    let mut dataset = word_problems(path.clone(), true);
    let n = dataset.len();
    assert_eq!(n, 2000);
    let epoch = |dataset: &mut Dataset, e: u64| -> Vec<String> {
        (e * n..(e + 1) * n).map(|i| dataset.training(i).unwrap().id).collect()
    };
    let first = epoch(&mut dataset, 0);
    let mut sorted = first.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 2000, "every row once in an epoch");
    let in_order: Vec<String> = (0..n).map(|i| format!("word-problems/train/{i}")).collect();
    assert_ne!(first, in_order);
    assert_ne!(epoch(&mut dataset, 1), first, "another order in the next epoch");
    let mut again = word_problems(path, true);
    assert_eq!(again.training(1234).unwrap().id, first[1234], "the same index, the same row");
}

/// A list-of-messages column, JSONL rows through columns, and mistakes named: a column that
/// is not there (the real ones listed), a damaged or foreign file, an empty one.
#[test]
fn message_columns_jsonl_rows_and_bad_files() {
    let fixtures = root().join("tests/fixtures/datasets");
    let spec = |path: PathBuf, columns: Option<Columns>| DatasetSpec { path, columns, shuffle: false, seed: 0 };
    let mut messages = Dataset::open(&spec(fixtures.join("messages.parquet"), None)).unwrap();
    let task = messages.training(0).unwrap();
    assert_eq!(task.messages.len(), 2);
    assert_eq!((task.messages[0].role.as_str(), task.messages[1].content.as_str()), ("system", "What is 2 + 2?"));
    assert_eq!(task.answer.as_deref(), Some("4"));

    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(&rows, "{\"q\": \"one?\", \"a\": 1}\n\n{\"q\": \"two?\", \"a\": 2}\n").unwrap();
    let columns = Columns { prompt: Some("q".into()), answer: Some("a".into()), ..Columns::default() };
    let mut jsonl = Dataset::open(&spec(rows, Some(columns))).unwrap();
    assert_eq!(jsonl.len(), 2);
    let second = jsonl.training(1).unwrap();
    assert_eq!((second.messages[0].content.as_str(), second.answer.as_deref()), ("two?", Some("2")));

    let wrong = Columns { prompt: Some("prompt_text".into()), ..Columns::default() };
    let mut parquet = Dataset::open(&spec(root().join("examples/word-problems/eval.parquet"), Some(wrong))).unwrap();
    let error = wirl_engine::error_chain(&parquet.training(0).unwrap_err());
    assert!(error.contains("prompt_text") && error.contains("question"), "{error}");

    let damaged = dir.path().join("damaged.parquet");
    let bytes = std::fs::read(root().join("examples/word-problems/eval.parquet")).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let error = wirl_engine::error_chain(&Dataset::open(&spec(damaged, None)).err().unwrap());
    assert!(error.contains("damaged.parquet"), "{error}");
    for (name, content) in [("garbage.arrow", b"not arrow at all".as_slice()), ("empty.jsonl", b"\n\n".as_slice())] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let error = wirl_engine::error_chain(&Dataset::open(&spec(path, None)).err().unwrap());
        assert!(error.contains(name), "{error}");
    }
    let error = wirl_engine::error_chain(&Dataset::open(&spec(dir.path().join("data.csv"), None)).err().unwrap());
    assert!(error.contains("unknown dataset format"), "{error}");
}

/// Hostile rows and files: a row of 3 MB of text is skipped and named before anything
/// tokenizes it, a null prompt is skipped (not trained as an empty prompt), a FIFO is refused
/// at once (not read forever), and a `save_to_disk` `state.json` cannot name files outside
/// its directory.
#[test]
fn oversize_and_null_rows_fifos_and_escaping_state_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.jsonl");
    let huge = "x".repeat(3 << 20);
    let rows = [
        serde_json::json!({"prompt": "2 + 2?", "answer": "4"}),
        serde_json::json!({"prompt": huge, "answer": "1"}),
        serde_json::json!({"prompt": null, "answer": "5"}),
        serde_json::json!({"prompt": "3 + 3?", "answer": "6"}),
    ];
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let columns = Columns { prompt: Some("prompt".into()), answer: Some("answer".into()), ..Columns::default() };
    let mut dataset =
        Dataset::open(&DatasetSpec { path: path.clone(), columns: Some(columns), shuffle: false, seed: 0 }).unwrap();
    assert_eq!(dataset.len(), 4);
    assert_eq!(dataset.training(0).unwrap().messages[0].content, "2 + 2?");
    let error = wirl_engine::error_chain(&dataset.training(1).unwrap_err());
    assert!(error.contains("line 2") && error.contains("per row"), "{error}");
    let error = wirl_engine::error_chain(&dataset.training(2).unwrap_err());
    assert!(error.contains("line 3") && error.contains("null"), "{error}");
    assert_eq!(dataset.training(3).unwrap().answer.as_deref(), Some("6"));

    let fifo = dir.path().join("pipe.jsonl");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let error = Dataset::open(&DatasetSpec { path: fifo, columns: None, shuffle: false, seed: 0 }).err().unwrap();
    let error = wirl_engine::error_chain(&error);
    assert!(error.contains("not a regular file"), "{error}");

    let hf = dir.path().join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let outside = root().join("tests/fixtures/datasets/word-problems.arrow");
    for name in ["../rows.jsonl", outside.to_str().unwrap()] {
        let state = serde_json::json!({"_data_files": [{"filename": name}]});
        std::fs::write(hf.join("state.json"), state.to_string()).unwrap();
        let error =
            Dataset::open(&DatasetSpec { path: hf.clone(), columns: None, shuffle: false, seed: 0 }).err().unwrap();
        let error = wirl_engine::error_chain(&error);
        assert!(error.contains("not a file inside its directory"), "{name}: {error}");
    }
    std::os::unix::fs::symlink(&outside, hf.join("data.arrow")).unwrap();
    std::fs::write(hf.join("state.json"), r#"{"_data_files": [{"filename": "data.arrow"}]}"#).unwrap();
    let error = Dataset::open(&DatasetSpec { path: hf, columns: None, shuffle: false, seed: 0 }).err().unwrap();
    let error = wirl_engine::error_chain(&error);
    assert!(error.contains("a link out of its directory"), "{error}");
}

/// A dataset file edited while a run reads it is refused when a chunk is next read (its rows
/// were located when it was opened: other rows, or halves of rows, would come back under the
/// same indices), naming the file; the chunk already read stays, and lines appended to a
/// JSONL file are no edit (its rows read as they were). Fingerprints cover every
/// file a dataset reads (a `save_to_disk` directory's `state.json` and its data files) and
/// tell an edit apart; a FIFO is refused, not read forever.
#[test]
fn a_dataset_edited_under_a_reader_is_refused_and_fingerprints_tell_edits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.jsonl");
    let rows = |answer: &str| -> String {
        (0..1500)
            .map(|i| format!("{}\n", serde_json::json!({"prompt": format!("{i} + 1?"), "answer": answer})))
            .collect()
    };
    std::fs::write(&path, rows("1")).unwrap();
    let columns = Columns { prompt: Some("prompt".into()), answer: Some("answer".into()), ..Columns::default() };
    let spec = DatasetSpec { path: path.clone(), columns: Some(columns), shuffle: false, seed: 0 };
    // Lines appended (to a file whose last line has no newline) are no change: the rows
    // opened read as they were, the new ones wait for the next open.
    std::fs::write(&path, rows("1").trim_end()).unwrap();
    let mut dataset = Dataset::open(&spec).unwrap();
    assert_eq!(dataset.training(0).unwrap().messages[0].content, "0 + 1?");
    let appended = [rows("1").trim_end().as_bytes(), br#"{"prompt": "new?", "answer": "3"}"#, b"\n"].concat();
    std::fs::write(&path, &appended).unwrap();
    assert_eq!(dataset.len(), 1500);
    assert_eq!(dataset.training(1499).unwrap().messages[0].content, "1499 + 1?", "the last row as it was");
    assert_eq!(Dataset::open(&spec).unwrap().len(), 1500, "the appended text joins the unterminated line");
    std::fs::write(&path, rows("1")).unwrap();
    let mut dataset = Dataset::open(&spec).unwrap();
    assert_eq!(dataset.training(0).unwrap().messages[0].content, "0 + 1?");
    let before = wirl_rollout::dataset::fingerprint(&path).unwrap();
    // Rewritten (the same rows with other answers): refused.
    std::fs::write(&path, rows("22")).unwrap();
    assert_eq!(dataset.training(1).unwrap().messages[0].content, "1 + 1?", "the chunk read before stays");
    let error = wirl_engine::error_chain(&dataset.training(1200).unwrap_err());
    assert!(
        error.contains("rows.jsonl: changed since the run opened it") && error.contains("wirl ctl apply"),
        "{error}"
    );
    let after = wirl_rollout::dataset::fingerprint(&path).unwrap();
    assert_eq!(before.keys().collect::<Vec<_>>(), [&path]);
    assert!(before[&path].sha256 != after[&path].sha256 && after[&path].bytes == before[&path].bytes + 1500);
    // Opened again, the edited file reads.
    assert_eq!(Dataset::open(&spec).unwrap().training(1200).unwrap().answer.as_deref(), Some("22"));

    let hf = root().join("tests/fixtures/datasets/hf-word-problems");
    let prints = wirl_rollout::dataset::fingerprint(&hf).unwrap();
    assert!(prints.contains_key(&hf.join("state.json")) && prints.len() >= 2, "{prints:?}");
    assert!(prints.values().all(|p| p.sha256.len() == 64 && p.bytes > 0), "{prints:?}");

    let fifo = dir.path().join("pipe.jsonl");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let error = wirl_engine::error_chain(&wirl_rollout::dataset::fingerprint(&fifo).unwrap_err());
    assert!(error.contains("not a regular file"), "{error}");
}
