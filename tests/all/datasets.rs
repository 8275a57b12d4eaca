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
    let error = format!("{:#}", parquet.training(0).unwrap_err());
    assert!(error.contains("prompt_text") && error.contains("question"), "{error}");

    let damaged = dir.path().join("damaged.parquet");
    let bytes = std::fs::read(root().join("examples/word-problems/eval.parquet")).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    let error = format!("{:#}", Dataset::open(&spec(damaged, None)).err().unwrap());
    assert!(error.contains("damaged.parquet"), "{error}");
    for (name, content) in [("garbage.arrow", b"not arrow at all".as_slice()), ("empty.jsonl", b"\n\n".as_slice())] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let error = format!("{:#}", Dataset::open(&spec(path, None)).err().unwrap());
        assert!(error.contains(name), "{error}");
    }
    let error = format!("{:#}", Dataset::open(&spec(dir.path().join("data.csv"), None)).err().unwrap());
    assert!(error.contains("unknown dataset format"), "{error}");
}
