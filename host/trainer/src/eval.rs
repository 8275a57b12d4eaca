//! Held-out evaluation of a model (or checkpoint) on a config's held-out tasks — the greedy
//! pass rate, and with `eval.samples = n` the unbiased pass@k over n samples per task — with
//! one JSONL line per task. Needs only the inference model, not the learner.

use crate::config::{RunConfig, TaskSpec};
use crate::observer::{Event, Observer};
use anyhow::Context;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::Instant;
use wirl_engine::{GenerateRequest, LoadOptions, Sampling};
use wirl_rollout::{
    EpisodeGroup, LoadedTask, SamplingSpec, Scored, Scorers, TaskSource, held_out_prompts, prompt_ids, run_episodes,
    seed_for,
};
use wirl_sandbox::Task;
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
        sampling: SamplingSpec { temperature: 0.0, top_p: 1.0, top_k: 0, ..spec.sampling },
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

/// A held-out trajectory judged: its score, its (last) completion, and for an episode the
/// messages after the prompt.
type Judged = (Scored, String, Vec<wirl_sandbox::Message>);

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
    let (model, tokenizer) = (std::sync::Arc::new(loaded.model), std::sync::Arc::new(loaded.tokenizer));
    // Episodes (multi-turn tasks) generate their later turns through the batching actor.
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(model.clone(), tokenizer.clone())?;
    let sandbox = Sandbox::new(SandboxSettings::default())?;
    // Every task's held-out problems, in task order; one whose prompt does not fit the
    // context is left out, as in training.
    let context = loaded.config.max_position_embeddings;
    let mut loaded = Vec::new();
    let mut tasks: Vec<(usize, Task)> = Vec::new();
    for (t, spec) in config.tasks.iter().enumerate() {
        let mut task = LoadedTask::load(&sandbox, spec, &tokenizer)?;
        let (first, count, room) = (config.eval.first_index, config.eval.tasks, spec.sampling.max_tokens);
        let held_out = held_out_prompts(&spec.name, &mut task.source, first, 0, count, &tokenizer, room, context);
        tasks.extend(held_out.into_iter().map(|(problem, _)| (t, problem)));
        loaded.push(task);
    }
    let (sources, mut scorers): (Vec<TaskSource>, Vec<Scorers>) =
        loaded.into_iter().map(|task| (task.source, task.scorers)).unzip();
    // Agent tasks make their own held-out rollouts.
    let mut agent_tallies = Vec::new();
    for (t, (spec, source)) in config.tasks.iter().zip(&sources).enumerate() {
        if let TaskSource::Agent { agent, limits } = source {
            let (passed, count) = agent_held_out(
                spec,
                agent,
                *limits,
                &engine,
                &tokenizer,
                context,
                config.eval.first_index..config.eval.first_index.saturating_add(config.eval.tasks as u64),
            );
            agent_tallies.push((t, passed, count));
        }
    }
    anyhow::ensure!(
        !tasks.is_empty() || !agent_tallies.is_empty(),
        "no held-out task to evaluate (a dataset needs an `eval` file; prompts must fit the model's context of \
         {context} tokens)"
    );
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut lines = std::io::BufWriter::new(
        std::fs::File::create(output).with_context(|| format!("cannot create {}", output.display()))?,
    );

    let eval = &config.eval;
    // Per task: problems, greedy passes, pass@k estimates summed.
    let mut tallies: Vec<(usize, usize, Vec<f64>)> =
        config.tasks.iter().map(|_| (0, 0, vec![0.0; eval.k.len()])).collect();
    for &(t, passed, count) in &agent_tallies {
        tallies[t].0 += count;
        tallies[t].1 += passed;
    }
    let mut done = 0usize;
    for (chunk_index, chunk) in tasks.chunks(eval.batch_tasks).enumerate() {
        let mut requests = Vec::new();
        for (i, (t, task)) in chunk.iter().enumerate() {
            let sampling_spec = &config.tasks[*t].sampling;
            let prompt = prompt_ids(&tokenizer, task)?;
            requests.push(GenerateRequest {
                prompt: prompt.clone(),
                n: 1,
                sampling: Sampling::greedy(sampling_spec.max_tokens),
            });
            if eval.samples > 0 {
                // Seeded per task, so a task's samples do not depend on the batch it ran in.
                let sampling =
                    sampling_spec.seeded(seed_for(config.grpo.seed, (chunk_index * eval.batch_tasks + i) as u64));
                requests.push(GenerateRequest { prompt, n: eval.samples, sampling });
            }
        }
        let prompts: Vec<Vec<u32>> =
            requests.iter().step_by(1 + usize::from(eval.samples > 0)).map(|r| r.prompt.clone()).collect();
        let mut outputs = wirl_engine::generate(&model, &tokenizer, &requests, |_, _, _| {})?.into_iter();
        let mut generated = Vec::with_capacity(chunk.len());
        for _ in chunk {
            let greedy = outputs.next().context("one greedy completion per task")?;
            let sampled = if eval.samples > 0 { Some(outputs.next().context("samples per task")?) } else { None };
            generated.push((greedy, sampled));
        }
        let mut prescored = score_single_turn(chunk, &generated, &config.tasks, &mut scorers);
        for (i, (((t, task), prompt), (greedy, sampled))) in chunk.iter().zip(&prompts).zip(generated).enumerate() {
            let spec = &config.tasks[*t];
            // A masked verdict (a plugin failed) is not a pass.
            let pass = |score: &Scored| score.status.usable() && score.reward >= spec.pass_reward;
            // Scored, with each trajectory's conversation after the prompt (episodes only).
            let (greedy, sampled): (Judged, Option<Vec<Judged>>) = if spec.max_turns > 1 {
                let TaskSource::Environment { plugin, .. } = &sources[*t] else {
                    anyhow::bail!("task `{}`: max_turns needs an environment plugin", spec.name);
                };
                let group = |first: Vec<wirl_engine::Completion>, sampling, seed| EpisodeGroup {
                    environment: plugin,
                    task,
                    prompt,
                    first: first.into_iter().map(Into::into).collect(),
                    sampling,
                    seed,
                    max_turns: spec.max_turns,
                    failures: spec.failures,
                };
                let greedy_spec = SamplingSpec { temperature: 0.0, top_p: 1.0, top_k: 0, ..spec.sampling };
                let mut groups = vec![group(greedy, greedy_spec, 0)];
                if let Some(sampled) = sampled {
                    let seed = seed_for(config.grpo.seed, (chunk_index * eval.batch_tasks + i) as u64);
                    groups.push(group(sampled, spec.sampling, seed));
                }
                let never = || false;
                let ran = run_episodes(&engine, &tokenizer, context, groups, &never).expect("never stopped")?;
                let mut ran = ran.groups.into_iter().map(|outcomes| {
                    outcomes
                        .into_iter()
                        .map(|o| (o.score, o.trajectory.text, o.trajectory.conversation))
                        .collect::<Vec<_>>()
                });
                let greedy = ran.next().context("the greedy episode")?.remove(0);
                (greedy, ran.next())
            } else {
                let (score, scores) = prescored.remove(&i).context("every single-turn task is scored above")?;
                let text = greedy[0].text.clone();
                let sampled = sampled.zip(scores).map(|(sampled, scores)| {
                    scores.into_iter().zip(sampled).map(|(s, c)| (s, c.text, Vec::new())).collect()
                });
                ((score, text, Vec::new()), sampled)
            };
            let tally = &mut tallies[*t];
            let (greedy_score, greedy_text, greedy_conversation) = &greedy;
            tally.0 += 1;
            tally.1 += usize::from(pass(greedy_score));
            let mut line = json!({
                "task_name": spec.name,
                "task_id": task.id,
                "greedy": { "passed": pass(greedy_score), "reward": greedy_score.reward,
                            "notes": greedy_score.notes, "completion": greedy_text },
            });
            if !greedy_conversation.is_empty() {
                line["greedy"]["conversation"] = conversation_json(greedy_conversation);
            }
            let mut passed_samples = None;
            if let Some(sampled) = &sampled {
                let c = sampled.iter().filter(|(s, _, _)| pass(s)).count();
                passed_samples = Some(c);
                let mut per_k = serde_json::Map::new();
                for (k, estimate) in eval.k.iter().zip(&mut tally.2) {
                    let p = pass_at_k(sampled.len(), c, *k);
                    *estimate += p;
                    per_k.insert(format!("pass@{k}"), p.into());
                }
                line["samples"] = sampled.len().into();
                line["passed"] = c.into();
                line["pass_at_k"] = per_k.into();
                line["completions"] = sampled
                    .iter()
                    .map(|(s, text, conversation)| {
                        let mut one = json!({ "passed": pass(s), "notes": s.notes, "completion": text });
                        if !conversation.is_empty() {
                            one["conversation"] = conversation_json(conversation);
                        }
                        one
                    })
                    .collect();
            }
            serde_json::to_writer(&mut lines, &line)?;
            writeln!(lines)?;
            done += 1;
            observer.event(Event::EvalTask {
                done,
                total: tasks.len(),
                task: &task.id,
                greedy_passed: pass(&greedy.0),
                samples: passed_samples.map(|c| (c, eval.samples)),
            });
        }
        lines.flush()?;
    }
    // Over all problems together, and per task.
    let figures = |count: usize, passed: usize, estimates: &[f64]| {
        let mut figures = json!({ "tasks": count, "greedy_pass_rate": passed as f64 / count.max(1) as f64 });
        if eval.samples > 0 {
            for (k, estimate) in eval.k.iter().zip(estimates) {
                figures[format!("pass@{k}")] = (estimate / count.max(1) as f64).into();
            }
        }
        figures
    };
    let (count, passed) = tallies.iter().fold((0, 0), |(n, p), t| (n + t.0, p + t.1));
    let estimates: Vec<f64> = (0..eval.k.len()).map(|i| tallies.iter().map(|t| t.2[i]).sum()).collect();
    let mut summary = figures(count, passed, &estimates);
    summary["model"] = config.model.clone().into();
    summary["samples"] = eval.samples.into();
    summary["per_task"] = output.display().to_string().into();
    summary["seconds"] = started.elapsed().as_secs_f64().into();
    summary["by_task"] = config
        .tasks
        .iter()
        .zip(&tallies)
        .filter(|(_, tally)| tally.0 > 0)
        .map(|(spec, (n, p, e))| (spec.name.clone(), figures(*n, *p, e)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    Ok(summary)
}

/// The verdicts of a chunk's single-turn tasks (by position in the chunk): the greedy
/// completion's and, with samples, theirs. A task's groups are scored together, at once
/// where its graders run programs in worker processes.
fn score_single_turn(
    chunk: &[(usize, wirl_sandbox::Task)],
    generated: &[(Vec<wirl_engine::Completion>, Option<Vec<wirl_engine::Completion>>)],
    specs: &[TaskSpec],
    scorers: &mut [Scorers],
) -> BTreeMap<usize, (Scored, Option<Vec<Scored>>)> {
    let mut verdicts = BTreeMap::new();
    let single_turn: BTreeSet<usize> = chunk.iter().map(|(t, _)| *t).filter(|&t| specs[t].max_turns <= 1).collect();
    for t in single_turn {
        let members: Vec<usize> = (0..chunk.len()).filter(|&i| chunk[i].0 == t).collect();
        // Each member's greedy group, then its sampled group.
        let texts: Vec<(Vec<String>, Option<Vec<String>>)> = members
            .iter()
            .map(|&i| {
                let (greedy, sampled) = &generated[i];
                let text = |c: &[wirl_engine::Completion]| c.iter().map(|c| c.text.clone()).collect::<Vec<_>>();
                (text(&greedy[..1]), sampled.as_deref().map(text))
            })
            .collect();
        let mut groups: Vec<(&wirl_sandbox::Task, &[String])> = Vec::new();
        for (&i, (greedy, sampled)) in members.iter().zip(&texts) {
            groups.push((&chunk[i].1, greedy));
            groups.extend(sampled.as_deref().map(|sampled| (&chunk[i].1, sampled)));
        }
        let mut scored = scorers[t].score_groups(&groups, specs[t].failures).into_iter();
        for (&i, (_, sampled)) in members.iter().zip(&texts) {
            let greedy = scored.next().and_then(|mut one| one.pop()).expect("a verdict per completion");
            let sampled = sampled.as_ref().map(|_| scored.next().expect("a verdict per group"));
            verdicts.insert(i, (greedy, sampled));
        }
    }
    verdicts
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
