//! Held-out evaluation of a model (or checkpoint) on a config's held-out tasks — the greedy
//! pass rate, and with `eval.samples = n` the unbiased pass@k over n samples per task — with
//! one JSONL line per task. Needs only the inference model, not the learner.

use crate::config::RunConfig;
use crate::observer::{Event, Observer};
use anyhow::Context;
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::time::Instant;
use wirl_engine::{GenerateRequest, LoadOptions, Sampling};
use wirl_rollout::{Scorers, TaskSource, fitting_prompt, prompt_ids, seed_for};
use wirl_sandbox::printable;
use wirl_sandbox::{Sandbox, SandboxSettings};

/// The unbiased estimator of pass@k from n samples of which c passed (Chen et al. 2021):
/// 1 - C(n-c, k) / C(n, k), as a product so that large n does not overflow.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n < k || n - c < k {
        return if c > 0 { 1.0 } else { 0.0 };
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// Evaluate the model at `model` (a resolved path; `config.model` names it in the summary);
/// the summary as JSON.
pub fn evaluate(
    config: &RunConfig,
    model: &Path,
    output: &Path,
    observer: &mut dyn Observer,
) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    if let Some(k) = config.eval.k.iter().find(|&&k| config.eval.samples > 0 && k > config.eval.samples) {
        anyhow::bail!("pass@{k} needs at least {k} samples per task, but `eval.samples` is {}", config.eval.samples);
    }
    observer.event(Event::Loading { path: model });
    let loaded = wirl_engine::load(model, &LoadOptions::default())?;
    let sandbox = Sandbox::new(SandboxSettings::default())?;
    let mut source = TaskSource::load(&sandbox, &config.source)?;
    let tasks = source.held_out(config.eval.first_index, config.eval.tasks);
    anyhow::ensure!(!tasks.is_empty(), "no held-out tasks to evaluate (a [dataset] needs an `eval` file)");
    // A task whose prompt does not fit the context is left out, as in training.
    let context = loaded.config.max_position_embeddings;
    let tasks: Vec<_> = tasks
        .into_iter()
        .filter(|task| match fitting_prompt(&loaded.tokenizer, task, config.sampling.max_tokens, context) {
            Ok(_) => true,
            Err(failure) => {
                tracing::warn!("held-out task `{}` left out: {}", task.id, printable(&failure.reason));
                false
            }
        })
        .collect();
    anyhow::ensure!(!tasks.is_empty(), "no held-out task fits the model's context of {context} tokens");
    let mut rewards = Scorers::load(&sandbox, &config.rewards)?;
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut lines = std::io::BufWriter::new(
        std::fs::File::create(output).with_context(|| format!("cannot create {}", output.display()))?,
    );

    let eval = &config.eval;
    let pass = |reward: f32| reward >= config.grpo.pass_reward;
    let (mut greedy_passed, mut estimates) = (0usize, vec![0.0f64; eval.k.len()]);
    let mut done = 0usize;
    for (chunk_index, chunk) in tasks.chunks(eval.batch_tasks).enumerate() {
        let mut requests = Vec::new();
        for (i, task) in chunk.iter().enumerate() {
            let prompt = prompt_ids(&loaded.tokenizer, task)?;
            requests.push(GenerateRequest {
                prompt: prompt.clone(),
                n: 1,
                sampling: Sampling::greedy(config.sampling.max_tokens),
            });
            if eval.samples > 0 {
                // Seeded per task, so a task's samples do not depend on the batch it ran in.
                let sampling =
                    config.sampling.seeded(seed_for(config.grpo.seed, (chunk_index * eval.batch_tasks + i) as u64));
                requests.push(GenerateRequest { prompt, n: eval.samples, sampling });
            }
        }
        let mut outputs = wirl_engine::generate(&loaded.model, &loaded.tokenizer, &requests, |_, _, _| {})?.into_iter();
        for task in chunk {
            let greedy = outputs.next().context("one greedy completion per task")?;
            let greedy_text = greedy[0].text.clone();
            let greedy_score =
                &rewards.score_group(task, std::slice::from_ref(&greedy_text), config.grpo.failure_reward)[0];
            greedy_passed += usize::from(pass(greedy_score.reward));
            let mut line = json!({
                "task_id": task.id,
                "greedy": { "passed": pass(greedy_score.reward), "reward": greedy_score.reward,
                            "notes": greedy_score.notes, "completion": greedy_text },
            });
            let mut passed_samples = None;
            if eval.samples > 0 {
                let texts: Vec<String> =
                    outputs.next().context("samples per task")?.into_iter().map(|c| c.text).collect();
                let scores = rewards.score_group(task, &texts, config.grpo.failure_reward);
                let c = scores.iter().filter(|s| pass(s.reward)).count();
                passed_samples = Some(c);
                let mut per_k = serde_json::Map::new();
                for (k, estimate) in eval.k.iter().zip(&mut estimates) {
                    let p = pass_at_k(texts.len(), c, *k);
                    *estimate += p;
                    per_k.insert(format!("pass@{k}"), p.into());
                }
                line["samples"] = texts.len().into();
                line["passed"] = c.into();
                line["pass_at_k"] = per_k.into();
                line["completions"] = texts
                    .iter()
                    .zip(&scores)
                    .map(|(text, s)| json!({ "passed": pass(s.reward), "notes": s.notes, "completion": text }))
                    .collect();
            }
            serde_json::to_writer(&mut lines, &line)?;
            writeln!(lines)?;
            done += 1;
            observer.event(Event::EvalTask {
                done,
                total: tasks.len(),
                task: &task.id,
                greedy_passed: pass(greedy_score.reward),
                samples: passed_samples.map(|c| (c, eval.samples)),
            });
        }
        lines.flush()?;
    }
    let count = tasks.len();
    let mut summary = json!({
        "model": config.model,
        "tasks": count,
        "greedy_pass_rate": greedy_passed as f64 / count as f64,
        "samples": eval.samples,
        "per_task": output.display().to_string(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    if eval.samples > 0 {
        for (k, estimate) in eval.k.iter().zip(estimates) {
            summary[format!("pass@{k}")] = (estimate / count as f64).into();
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::pass_at_k;

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        // k = 1 is the fraction that passed.
        assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
        assert_eq!(pass_at_k(10, 0, 5), 0.0);
        // Fewer than k failures: some draw of k always holds a pass.
        assert_eq!(pass_at_k(10, 8, 5), 1.0);
    }
}
