//! Training's and evaluation's progress on stderr: a line per step (or task) and, on a
//! terminal, a status line saying what the step is doing now.

use std::io::IsTerminal;
use wirl_trainer::{Event, Observer, Phase};

/// `wirl train` on stderr: a line per step and, on a terminal, a status line saying what
/// the step is doing now.
pub struct Terminal;

impl Observer for Terminal {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Loading { path } => say!("loading {}", path.display()),
            Event::Resuming { run_dir, step } => say!("resuming {} from step {step}", run_dir.display()),
            Event::Phase { step, steps, phase } => status(&match phase {
                Phase::Generating { prompts, group_size } => {
                    format!("step {step}/{steps}: generating {prompts} x {group_size}")
                }
                Phase::Agent { task } => format!("step {step}/{steps}: agent of task {}", task + 1),
                Phase::Episodes { groups } => format!("step {step}/{steps}: episodes of {groups} groups"),
                Phase::Scoring => format!("step {step}/{steps}: scoring"),
                Phase::Training { group, groups } => {
                    format!("step {step}/{steps}: training on group {}/{groups}", group + 1)
                }
            }),
            Event::Step { metrics, steps, eta_s } => {
                status("");
                step_lines(metrics, steps, eta_s);
            }
            Event::HeldOut { after: false, pass_rate, problems } => {
                say!("held-out greedy pass rate before training: {pass_rate:.3} ({problems} tasks)")
            }
            Event::HeldOut { after: true, .. } => {}
            Event::Checkpoint { dir } => {
                status("");
                say!("checkpoint {}", dir.display())
            }
            Event::Swap { step, kind, generation, changes, reason, switch_ms } => {
                status("");
                let reason = reason.map_or(String::new(), |r| format!(" ({r})"));
                say!("after step {step}: task set {kind}: generation {generation}{reason}, switch {switch_ms:.2} ms");
                for change in changes {
                    say!("  {change}");
                }
            }
            Event::EvalTask { .. } => {}
        }
    }
}

/// `wirl eval` on stderr: a line per task.
pub struct EvalTerminal {
    started: std::time::Instant,
}

impl EvalTerminal {
    pub fn new() -> Self {
        EvalTerminal { started: std::time::Instant::now() }
    }
}

impl Observer for EvalTerminal {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Loading { path } => say!("loading {}", path.display()),
            Event::EvalTask { done, total, task, greedy_passed, samples } => {
                let samples = samples.map_or(String::new(), |(c, n)| format!(", samples {c}/{n}"));
                say!(
                    "[{done}/{total}] {task}: greedy {}{samples}  ({:.0} s)",
                    if greedy_passed { "pass" } else { "fail" },
                    self.started.elapsed().as_secs_f64()
                );
            }
            _ => {}
        }
    }
}

/// A step's line (and, when it trained nothing, why).
fn step_lines(m: &wirl_trainer::StepMetrics, steps: usize, eta_s: f64) {
    // Under `grpo.kl_in_reward` the loss has no KL term: the KL shown is the
    // rewards', with the β they were shaped with.
    let kl = match (m.reward_kl, m.kl_coef) {
        (Some(kl), Some(beta)) => format!("kl(reward) {kl:.5} β {beta:.4}"),
        _ => format!("kl {:.5}", m.kl),
    };
    // Under `[distill]`: the student's reverse KL to its teacher.
    let kl = match m.distill_kl {
        Some(teacher) => format!("{kl}  kl(teacher) {teacher:.4}"),
        None => kl,
    };
    // Under dynamic sampling a step that drew again generated that many times the
    // groups: say so, and how many of them trained.
    let draws = match m.draws {
        1 => String::new(),
        draws => format!("  draws {draws} (kept {})", m.groups_kept),
    };
    // A step whose every reward call failed has no reward to show: `reward 0.000`
    // would read as a model that scored nothing.
    let figures = if m.trajectories_scored == 0 {
        "no scored trajectory".to_string()
    } else {
        format!("reward {:.3}  pass {:.3}", m.reward_mean, m.pass_rate)
    };
    // LLM judges' calls to the engine: their wait, its share of the step, their tokens.
    let judge = match m.judge_calls {
        0 => String::new(),
        calls => format!(
            " (judge {:.2}s, {:.0}% of the step, {calls} calls, {} tokens)",
            m.time_s.judge,
            100.0 * m.time_s.judge / m.time_s.total.max(1e-9),
            m.judge_tokens
        ),
    };
    // Episodes' later turns and agents' groups are generated outside `generate`: without
    // them an agent's step read `gen 0.0s` beside 30 s of sampling.
    let mut sampling = format!("gen {:.1}s", m.time_s.generate);
    for (name, seconds) in [("episodes", m.time_s.episodes), ("agents", m.time_s.agents)] {
        if seconds > 0.0 {
            sampling.push_str(&format!(" {name} {seconds:.1}s"));
        }
    }
    say!(
        "step {:>3}/{steps}  {figures}  loss {:+.4}  {kl}  len {:.1}{draws}  | {sampling} score {:.2}s{judge} train {:.1}s | ETA {eta_s:.0}s",
        m.step,
        m.loss,
        m.completion_tokens_mean,
        m.time_s.score,
        m.time_s.train,
    );
    if m.trajectories_scored == 0 {
        let failures: Vec<String> = m.failures.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
        say!(
            "          no update: every completion's reward call failed ({}); the step trained nothing \
                 (metrics.jsonl's `failures`, and the plugin's messages above, say why)",
            failures.join(", ")
        );
    } else if m.groups_kept == 0 {
        // A loss and KL of zero read as a bug without this: nothing was trained.
        say!(
            "          no update: every group's samples scored alike (no signal to learn from), so this \
                 step trained nothing"
        );
    }
}

/// A transient status line on a terminal (what the step is doing now), cleared by `""`.
fn status(text: &str) {
    if std::io::stderr().is_terminal() {
        use std::io::Write as _;
        let _ = std::io::stderr().lock().write_all(format!("\r\x1b[2K{text}").as_bytes());
    }
}
