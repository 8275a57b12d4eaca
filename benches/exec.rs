//! Model-written code in the CPython code-runner component: the 164 HumanEval programs
//! (`prompt + canonical_solution + test + check(entry_point)`, as the peer builds them), each
//! in a fresh instance, with 1 and 2 workers (threads of this process, then worker
//! processes); and the grader's whole verdict per completion (judge, candidate, judge: three
//! programs) alone and in groups of 8, also on the humaneval runner (the judge compiled into
//! its snapshot) when given. Also the component's one-time compile and its
//! load from the compiled cache. Prints one JSON line. Run through benches/exec.sh.
//!
//!   cargo bench -p wirl-cli --bench exec -- RUNNER.wasm GRADER.wasm HumanEval.jsonl [REPS [HUMANEVAL_RUNNER.wasm]]

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use wirl_sandbox::{
    CodeRunnerPlugin, Limits, PluginSpec, Program, RewardPlugin, RunLimits, Sandbox, SandboxSettings, Task, Termination,
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let [runner_path, grader_path, tasks_path] = [0, 1, 2].map(|i| args.get(i).cloned());
    let (Some(runner_path), Some(grader_path), Some(tasks_path)) = (runner_path, grader_path, tasks_path) else {
        anyhow::bail!("usage: exec RUNNER.wasm GRADER.wasm HumanEval.jsonl [REPS [HUMANEVAL_RUNNER.wasm]]");
    };
    let reps: usize = args.get(3).map_or(Ok(3), |r| r.parse())?;
    let judge_runner_path = args.get(4).cloned();
    let tasks: Vec<Task> =
        std::fs::read_to_string(&tasks_path)?.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let programs: Vec<Program> = tasks.iter().map(program_of).collect::<anyhow::Result<_>>()?;
    let runner_spec = PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(&runner_path) };

    // One-time costs: compiling the component (an empty cache), then loading it compiled.
    let cache = tempfile::tempdir()?;
    let settings = SandboxSettings { cache_dir: Some(cache.path().to_path_buf()), ..Default::default() };
    let started = Instant::now();
    drop(Sandbox::new(settings.clone())?.load(runner_spec.clone())?);
    let compile = started.elapsed();
    let sandbox = Sandbox::new(settings)?;
    let started = Instant::now();
    let runner = Arc::new(CodeRunnerPlugin::new(sandbox.load(runner_spec.clone())?)?);
    let load = started.elapsed();

    // Warm up (page in the compiled code), and check every program passes.
    let failed: Vec<&str> = programs
        .iter()
        .zip(&tasks)
        .filter(|(p, _)| runner.run(p, &RunLimits::configured()).termination != Termination::Exited(0))
        .map(|(_, t)| t.id.as_str())
        .collect();
    anyhow::ensure!(failed.is_empty(), "canonical programs failed: {failed:?}");

    // Where one program's time goes (1 worker): a fresh instance, then the run itself.
    let (mut instantiate, mut call) = (Vec::new(), Vec::new());
    for program in &programs {
        runner.run(program, &RunLimits::configured());
        let stats = runner.last_call();
        instantiate.push(stats.instantiate);
        call.push(stats.call);
    }
    let empty = (0..100)
        .map(|_| {
            let t = Instant::now();
            runner.run(&Program::python("pass"), &RunLimits::configured());
            t.elapsed()
        })
        .collect::<Vec<_>>();
    let mut empty = empty;
    instantiate.sort();
    call.sort();
    empty.sort();

    // 1 and 2 workers: threads of this process sharing the runner, then as many worker
    // processes (`wirl code-worker`), each fed by a thread of this one.
    let by_threads = by_workers(&programs, reps, |_| runner.clone())?;
    wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
    let in_processes = |workers: usize| -> anyhow::Result<Arc<CodeRunnerPlugin>> {
        let runner = CodeRunnerPlugin::new(sandbox.load(runner_spec.clone())?)?.in_workers(&sandbox, workers)?;
        Ok(Arc::new(runner))
    };
    let (one, two) = (in_processes(1)?, in_processes(2)?);
    let by_processes = by_workers(&programs, reps, |workers| if workers == 1 { one.clone() } else { two.clone() })?;
    drop((one, two));

    // The grader's verdict on each canonical solution: three programs in fresh instances
    // (judge, candidate, judge) plus the grader's own instance; on the plain runner (the
    // judge's source sent whole) and, given, on the humaneval runner (compiled in).
    let verdicts_on = |runner_spec: PluginSpec| -> anyhow::Result<serde_json::Value> {
        let grader_spec = PluginSpec {
            limits: Limits { deadline_ms: 60_000, ..Limits::default() },
            code_runner: Some(Box::new(runner_spec)),
            ..PluginSpec::new(&grader_path)
        };
        let mut grader = RewardPlugin::new(sandbox.load(grader_spec)?)?;
        let mut verdicts = Vec::new();
        let started = Instant::now();
        for task in &tasks {
            let t = Instant::now();
            let score =
                grader.score(task, task.answer.as_deref().unwrap_or_default()).map_err(|f| anyhow::anyhow!("{f}"))?;
            anyhow::ensure!(score.reward == 1.0, "{}: {:?}", task.id, score.note);
            verdicts.push(t.elapsed());
        }
        let grading_rate = tasks.len() as f64 / started.elapsed().as_secs_f64();
        verdicts.sort();
        // As training scores them: a group of 8 completions per task (one first judge run
        // for the group), per completion.
        let mut in_groups = Vec::new();
        for task in &tasks {
            let group = vec![task.answer.clone().unwrap_or_default(); 8];
            let t = Instant::now();
            let scores = grader.score_group(task, &group);
            in_groups.push(t.elapsed() / 8);
            anyhow::ensure!(scores.iter().all(|s| s.as_ref().is_ok_and(|s| s.reward == 1.0)), "{}", task.id);
        }
        in_groups.sort();
        Ok(json!({
            "verdict_ms_median": ms(percentile(&verdicts, 0.5)),
            "verdict_ms_p95": ms(percentile(&verdicts, 0.95)),
            "verdicts_per_s": round(grading_rate),
            "in_group_of_8_ms_median": ms(percentile(&in_groups, 0.5)),
            "passed": verdicts.len(),
        }))
    };
    let grader = verdicts_on(runner_spec.clone())?;
    let grader_compiled_in = match &judge_runner_path {
        Some(path) => verdicts_on(PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(path) })?,
        None => serde_json::Value::Null,
    };

    println!(
        "{}",
        json!({
            "bench": "exec_wirl",
            "problems": programs.len(),
            "repeats": reps,
            "component_mb": round(std::fs::metadata(&runner_path)?.len() as f64 / 1e6),
            "compile_once_s": round(compile.as_secs_f64()),
            "load_compiled_ms": ms(load),
            "instantiate_ms_median": ms(percentile(&instantiate, 0.5)),
            "run_ms_median": ms(percentile(&call, 0.5)),
            "empty_program_ms_median": ms(percentile(&empty, 0.5)),
            "all_passed": true,
            "by_workers": by_threads,
            "by_processes": by_processes,
            "grader": grader,
            "grader_judge_compiled_in": grader_compiled_in,
        })
    );
    Ok(())
}

/// Every program once per repeat, run by 1 and then 2 threads on the runner
/// `runner_for(workers)` gives: throughput and per-program latency.
fn by_workers(
    programs: &[Program],
    reps: usize,
    runner_for: impl Fn(usize) -> Arc<CodeRunnerPlugin>,
) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    let mut by_workers = serde_json::Map::new();
    for workers in [1usize, 2] {
        let runner = runner_for(workers);
        let mut latencies = Vec::new();
        let mut rates = Vec::new();
        for _ in 0..reps {
            let started = Instant::now();
            // Each thread takes the next program not yet taken (as the peer's thread pool).
            let next = AtomicUsize::new(0);
            let chunks: Vec<Vec<Duration>> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        let (runner, next) = (runner.clone(), &next);
                        scope.spawn(move || {
                            std::iter::from_fn(|| programs.get(next.fetch_add(1, Ordering::Relaxed)))
                                .map(|program| {
                                    let t = Instant::now();
                                    let outcome = runner.run(program, &RunLimits::configured());
                                    assert_eq!(outcome.termination, Termination::Exited(0));
                                    t.elapsed()
                                })
                                .collect()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("worker")).collect()
            });
            rates.push(programs.len() as f64 / started.elapsed().as_secs_f64());
            latencies.extend(chunks.into_iter().flatten());
        }
        latencies.sort();
        rates.sort_by(f64::total_cmp);
        by_workers.insert(
            workers.to_string(),
            json!({
                "exec_per_s_median": round(rates[rates.len() / 2]),
                "latency_ms_median": ms(percentile(&latencies, 0.5)),
                "latency_ms_p95": ms(percentile(&latencies, 0.95)),
                "latency_ms_max": ms(*latencies.last().unwrap()),
                "executions": latencies.len(),
            }),
        );
    }
    Ok(by_workers)
}

/// The peer's program: prompt, canonical solution, tests, and the call of `check`.
fn program_of(task: &Task) -> anyhow::Result<Program> {
    let meta: serde_json::Value = serde_json::from_str(task.metadata.as_deref().unwrap_or("{}"))?;
    let field =
        |key: &str| meta[key].as_str().map(str::to_string).ok_or_else(|| anyhow::anyhow!("{}: no {key}", task.id));
    let source = format!(
        "{}{}\n\n{}\n\ncheck({})\n",
        field("prompt")?,
        task.answer.as_deref().unwrap_or_default(),
        field("test")?,
        field("entry_point")?
    );
    Ok(Program::python(source))
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
