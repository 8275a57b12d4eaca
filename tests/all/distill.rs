//! On-policy distillation (`[distill]`): a teacher (the tiny Qwen2-shaped model, with the
//! student's tokenizer) reads the student's samples, and each token's advantage gains the
//! teacher's log-prob minus the student's. With the rewards left out, the student's reverse KL
//! to the teacher falls over a run; a teacher whose tokenizer reads ids otherwise is refused.

use crate::engine::write_tiny_model;
use std::path::Path;

/// A teacher beside the student of `write_config` in `dir`: other weights, the student's
/// tokenizer.
fn teacher_beside(dir: &Path) -> std::path::PathBuf {
    let teacher = dir.join("teacher");
    std::fs::create_dir_all(&teacher).unwrap();
    write_tiny_model(&teacher, true);
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        let from = dir.join("model").join(file);
        if from.exists() {
            std::fs::copy(from, teacher.join(file)).unwrap();
        }
    }
    teacher
}

fn with_distill(config: &Path, section: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(config, format!("{text}\n{section}\n")).unwrap();
}

#[test]
fn distillation_alone_brings_the_student_toward_the_teacher() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 8, 0.05);
    teacher_beside(dir.path());
    with_distill(&config, "[distill]\nteacher = \"teacher\"\nrewards = false");
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = crate::grpo::metrics(&run);
    let kl: Vec<f64> = metrics.iter().map(|m| m["distill_kl"].as_f64().unwrap_or_else(|| panic!("{m}"))).collect();
    // Every group trains: the KL term is a signal whatever the rewards.
    assert!(metrics.iter().all(|m| m["groups_kept"] == 2), "{metrics:?}");
    assert!(kl.iter().all(|k| k.is_finite()), "{kl:?}");
    // The teacher's forward is timed as a phase of its own.
    assert!(metrics.iter().all(|m| m["time_s"]["teacher"].as_f64().unwrap() > 0.0), "{metrics:?}");
    let (first, last) = (kl[..2].iter().sum::<f64>() / 2.0, kl[kl.len() - 2..].iter().sum::<f64>() / 2.0);
    assert!(last < first * 0.8, "the student's reverse KL to the teacher fell: {kl:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kl(teacher)"), "{stderr}");
}

#[test]
fn a_teacher_is_refused_when_its_tokenizer_or_its_settings_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 1, 0.01);
    let teacher = teacher_beside(dir.path());
    let run = dir.path().join("run");
    let refused = |section: &str, expected: &str| {
        let text = std::fs::read_to_string(&config).unwrap();
        let attempt = dir.path().join("attempt.toml");
        std::fs::write(&attempt, format!("{text}\n{section}\n")).unwrap();
        let out = crate::grpo::train(&attempt, &run);
        assert!(!out.status.success(), "{section}");
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(error.contains(expected), "{section}: expected `{expected}` in: {error}");
        assert!(!run.join("metrics.jsonl").exists());
    };
    refused("[distill]\nteacher = \"nowhere\"", "`distill.teacher`");
    // A FIFO where the teacher should be is refused before anything opens it (a read would block).
    let fifo = dir.path().join("fifo.gguf");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    refused("[distill]\nteacher = \"fifo.gguf\"", "is not a model's directory or GGUF file");
    // The judge's model likewise.
    let judged = "[[rewards]]\nplugin = \"builtin:judge\"\njudge_model = \"fifo.gguf\"";
    refused(judged, "`rewards[1].judge_model`");
    refused("[distill]\nteacher = \"teacher\"\nweight = 0", "`distill.weight` = 0");
    refused("[distill]\nteacher = \"teacher\"\nweight = nan", "`distill.weight` = NaN");
    refused("[distill]\nteacher = \"teacher\"\nrewards = \"no\"", "expected a boolean");
    refused("[distill]\nteacher = \"teacher\"\ntemperature = 2", "temperature");
    // The tiny models' own tokenizer: other words for the same ids.
    crate::engine::write_tiny_tokenizer(&teacher);
    refused("[distill]\nteacher = \"teacher\"", "its tokenizer is not the student's (token \"");
}
