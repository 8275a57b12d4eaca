//! Held-out evaluation of a model (or checkpoint) on a config's held-out tasks — the greedy
//! pass rate, and with `eval.samples = n` the unbiased pass@k over n samples per task — with
//! one JSONL line per task. Needs only the inference model, not the learner.

use crate::config::{EvalSection, RunConfig, TaskSpec};
use crate::error::Context;
use crate::observer::{Event, Observer};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use wirl_engine::LoadOptions;
use wirl_rollout::{Engine, GroupAsk, LoadedTask, RolloutGroup, Scored, SkippedTask, TaskSource};
use wirl_sandbox::{Sandbox, SandboxSettings};

/// An agent task's held-out score: it is asked greedily for one group of one rollout per
/// index of `indices`; `(passed, rollouts)`.
pub(crate) fn agent_held_out(
    spec: &crate::config::TaskSpec,
    agent: &wirl_sandbox::AgentPlugin,
    limits: wirl_rollout::AgentLimits,
    engine: &wirl_engine::EngineHandle,
    tokenizer: &std::sync::Arc<wirl_engine::Tokenizer>,
    context: usize,
    indices: std::ops::Range<u64>,
) -> (usize, usize) {
    let call = wirl_rollout::AgentCall {
        agent,
        engine,
        tokenizer,
        context,
        groups: (indices.end - indices.start) as usize,
        group_size: 1,
        sampling: wirl_rollout::collect::greedy(spec.sampling),
        seed: 0,
        cursor: indices.start,
        limits,
        failures: spec.failures,
        task_name: &spec.name,
    };
    let groups = wirl_rollout::agent_groups(&call);
    let scores: Vec<&Scored> = groups.iter().flat_map(|g| &g.scores).collect();
    let passed = scores.iter().filter(|s| s.status.usable() && s.reward >= spec.pass_reward).count();
    (passed, scores.len())
}

fn conversation_json(messages: &[wirl_sandbox::Message]) -> serde_json::Value {
    messages.iter().map(|m| json!({ "role": m.role, "content": m.content })).collect()
}

/// The unbiased estimator of pass@k from n samples of which c passed (Chen et al. 2021):
/// 1 - C(n-c, k) / C(n, k), as a product so that large n does not overflow.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n < k || n - c < k {
        return if c > 0 { 1.0 } else { 0.0 };
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// The file of per-problem lines at `output`, its directory made.
fn lines_at(output: &Path) -> crate::error::Result<std::io::BufWriter<std::fs::File>> {
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let file = std::fs::File::create(output).with_context(|| format!("cannot create {}", output.display()))?;
    Ok(std::io::BufWriter::new(file))
}

/// A problem's greedy group of one, then (for pass@k) its samples, seeded alike.
fn asks_of(config: &RunConfig, greedy: &GroupAsk) -> Vec<GroupAsk> {
    let eval = &config.eval;
    let mut asks = vec![greedy.clone()];
    if eval.samples > 0 {
        let sampling = config.tasks[greedy.task].sampling;
        asks.push(GroupAsk { size: eval.samples, sampling, ..greedy.clone() });
    }
    asks
}

/// Evaluate the model at `model` (a resolved path; `config.model` names it in the summary),
/// with the LoRA adapter at `adapter` merged in if one is given; the summary as JSON.
///
/// Over ~80 lines on purpose: the evaluation's start (model, engine, tasks, judges) and its
/// loop over the problems share a dozen values (the engine's thread and the sandbox must
/// outlive the loop); split, they would travel in a struct made for this one call.
pub fn evaluate(
    config: &RunConfig,
    model: &Path,
    adapter: Option<&Path>,
    output: &Path,
    observer: &mut dyn Observer,
) -> crate::error::Result<serde_json::Value> {
    let started = Instant::now();
    let eval = &config.eval;
    if let Some(k) = eval.k.iter().find(|&&k| eval.samples > 0 && k > eval.samples) {
        crate::error::bail!("pass@{k} needs at least {k} samples per task, but `eval.samples` is {}", eval.samples);
    }
    observer.event(Event::Loading { path: model });
    // On `model.device`, as training samples (it read the CPU only, whatever the config said).
    let options = LoadOptions {
        device: config.device.open()?,
        adapter: adapter.map(Path::to_path_buf),
        ..LoadOptions::default()
    };
    let loaded = wirl_engine::load(model, &options)?;
    let context = loaded.config.context();
    let mut tokenizer = loaded.tokenizer;
    tokenizer.set_template_vars(config.chat_template_kwargs.clone())?;
    let tokenizer = Arc::new(tokenizer);
    // Every group goes through the batching actor, first turns and episodes alike.
    let (engine, _thread) =
        wirl_engine::EngineHandle::spawn_with(Arc::new(loaded.model), tokenizer.clone(), config.engine_options())?;
    let sandbox = Sandbox::new(SandboxSettings::default())?;
    let mut tasks = config
        .tasks
        .iter()
        .map(|spec| LoadedTask::load(&sandbox, spec, &tokenizer))
        .collect::<wirl_rollout::Result<Vec<_>>>()?;
    // 0.2.0 rewards that judge with the model call the one evaluated.
    let for_rewards = wirl_rollout::RewardEngine {
        handle: engine.clone(),
        tokenizer: tokenizer.clone(),
        context,
        seed: config.grpo.seed,
        usage: Default::default(),
    };
    let judges = crate::judges::load_judges(
        &tasks,
        model,
        &options.device,
        config.engine_options(),
        config.grpo.seed,
        &for_rewards.usage,
        observer,
    )?;
    for task in &mut tasks {
        task.scorers.set_engine(Some(for_rewards.clone()));
        task.scorers.set_judges(&judges);
    }
    let engine = Engine { handle: &engine, tokenizer: &tokenizer, context };
    // Every task's held-out problems, in task order; one whose prompt does not fit the
    // context is left out, as in training. Agent tasks make their own.
    let (problems, left_out) = wirl_rollout::collect::held_out_asks(
        &mut tasks,
        eval.first_index,
        eval.tasks,
        &tokenizer,
        context,
        config.grpo.seed,
    );
    let mut tallies = agent_tallies(&tasks, eval, engine, &tokenizer);
    crate::error::ensure!(
        !problems.is_empty() || tallies.iter().any(|t| t.problems > 0),
        "no held-out task to evaluate (a dataset needs an `eval` file; prompts must fit the model's context of \
         {context} tokens)"
    );
    let mut lines = lines_at(output)?;
    let mut done = 0usize;
    for chunk in problems.chunks(eval.batch_tasks) {
        let asks = chunk.iter().flat_map(|greedy| asks_of(config, greedy)).collect();
        let never = || false;
        let mut groups =
            wirl_rollout::collect_groups(engine, &mut tasks, asks, &never).expect("never stopped")?.into_iter();
        for ask in chunk {
            let greedy = groups.next().ok_or_else(|| crate::Error::Internal("no greedy group for a problem".into()))?;
            let sampled = if eval.samples > 0 {
                Some(groups.next().ok_or_else(|| crate::Error::Internal("no sampled group for a problem".into()))?)
            } else {
                None
            };
            let spec = &config.tasks[ask.task];
            let judged = judge(spec, eval, &greedy, sampled.as_ref(), &mut tallies[ask.task]);
            serde_json::to_writer(&mut lines, &judged.line)?;
            writeln!(lines)?;
            done += 1;
            observer.event(Event::EvalTask {
                done,
                total: problems.len(),
                task: &ask.problem.id,
                greedy_passed: judged.greedy_passed,
                samples: judged.samples_passed.map(|c| (c, eval.samples)),
            });
        }
        lines.flush()?;
    }
    let mut summary = summary(config, output, &tallies, &left_out, started);
    if let Some(adapter) = adapter {
        summary["adapter"] = adapter.display().to_string().into();
    }
    Ok(summary)
}

/// Every task's tally, with the held-out rollouts of its agent tasks (which make their own)
/// counted in.
fn agent_tallies(
    tasks: &[LoadedTask],
    eval: &EvalSection,
    engine: Engine<'_>,
    tokenizer: &Arc<wirl_engine::Tokenizer>,
) -> Vec<Tally> {
    let mut tallies: Vec<Tally> = tasks.iter().map(|_| Tally::new(eval.k.len())).collect();
    for (t, task) in tasks.iter().enumerate() {
        if let TaskSource::Agent { agent, limits } = &task.source {
            let indices = eval.first_index..eval.first_index.saturating_add(eval.tasks as u64);
            let (passed, count) =
                agent_held_out(&task.spec, agent, *limits, engine.handle, tokenizer, engine.context, indices);
            tallies[t].problems += count;
            tallies[t].greedy_passed += passed;
        }
    }
    tallies
}

/// A task's held-out figures so far: problems, greedy passes, pass@k estimates summed.
struct Tally {
    problems: usize,
    greedy_passed: usize,
    estimates: Vec<f64>,
}

impl Tally {
    fn new(ks: usize) -> Self {
        Tally { problems: 0, greedy_passed: 0, estimates: vec![0.0; ks] }
    }
}

/// A problem judged: its JSONL line, whether its greedy completion passed, how many samples did.
struct Judged {
    line: serde_json::Value,
    greedy_passed: bool,
    samples_passed: Option<usize>,
}

/// Judge one problem's greedy group (and samples), adding it to its task's tally.
fn judge(
    spec: &TaskSpec,
    eval: &EvalSection,
    greedy: &RolloutGroup,
    sampled: Option<&RolloutGroup>,
    tally: &mut Tally,
) -> Judged {
    // A masked verdict (a plugin failed) is not a pass.
    let pass = |score: &Scored| score.status.usable() && score.reward >= spec.pass_reward;
    let (greedy_score, greedy_trajectory) = (&greedy.scores[0], &greedy.trajectories[0]);
    let greedy_passed = pass(greedy_score);
    tally.problems += 1;
    tally.greedy_passed += usize::from(greedy_passed);
    let mut line = json!({
        "task_name": spec.name,
        "task_id": greedy.task.id,
        "greedy": { "passed": greedy_passed, "reward": greedy_score.reward,
                    "notes": greedy_score.notes, "completion": greedy_trajectory.text },
    });
    if !greedy_trajectory.conversation.is_empty() {
        line["greedy"]["conversation"] = conversation_json(&greedy_trajectory.conversation);
    }
    let mut samples_passed = None;
    if let Some(sampled) = sampled {
        let c = sampled.scores.iter().filter(|s| pass(s)).count();
        samples_passed = Some(c);
        let mut per_k = serde_json::Map::new();
        for (k, estimate) in eval.k.iter().zip(&mut tally.estimates) {
            let p = pass_at_k(sampled.scores.len(), c, *k);
            *estimate += p;
            per_k.insert(format!("pass@{k}"), p.into());
        }
        line["samples"] = sampled.scores.len().into();
        line["passed"] = c.into();
        line["pass_at_k"] = per_k.into();
        line["completions"] = sampled
            .scores
            .iter()
            .zip(&sampled.trajectories)
            .map(|(s, trajectory)| {
                let mut one = json!({ "passed": pass(s), "notes": s.notes, "completion": trajectory.text });
                if !trajectory.conversation.is_empty() {
                    one["conversation"] = conversation_json(&trajectory.conversation);
                }
                one
            })
            .collect();
    }
    Judged { line, greedy_passed, samples_passed }
}

/// The summary: over all problems together, and per task.
fn summary(
    config: &RunConfig,
    output: &Path,
    tallies: &[Tally],
    left_out: &[(usize, SkippedTask)],
    started: Instant,
) -> serde_json::Value {
    let eval = &config.eval;
    let figures = |count: usize, passed: usize, estimates: &[f64]| {
        let mut figures = json!({ "tasks": count, "greedy_pass_rate": passed as f64 / count.max(1) as f64 });
        if eval.samples > 0 {
            for (k, estimate) in eval.k.iter().zip(estimates) {
                figures[format!("pass@{k}")] = (estimate / count.max(1) as f64).into();
            }
        }
        figures
    };
    let count = tallies.iter().map(|t| t.problems).sum();
    let passed = tallies.iter().map(|t| t.greedy_passed).sum();
    let estimates: Vec<f64> = (0..eval.k.len()).map(|i| tallies.iter().map(|t| t.estimates[i]).sum()).collect();
    let mut summary = figures(count, passed, &estimates);
    summary["model"] = config.model.clone().into();
    summary["samples"] = eval.samples.into();
    summary["per_task"] = output.display().to_string().into();
    summary["seconds"] = started.elapsed().as_secs_f64().into();
    summary["by_task"] = config
        .tasks
        .iter()
        .zip(tallies)
        .filter(|(_, tally)| tally.problems > 0)
        .map(|(spec, t)| (spec.name.clone(), figures(t.problems, t.greedy_passed, &t.estimates)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    // The problems left out, so that a pass rate over fewer than `eval.tasks` says why.
    summary["skipped"] = left_out
        .iter()
        .map(|(t, skip)| {
            json!({ "task": config.tasks[*t].name, "index": skip.index, "id": skip.id, "reason": skip.reason })
        })
        .collect::<Vec<_>>()
        .into();
    summary
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
