//! What `wirl train CONFIG --check` shows: the config validated and lowered, as the run would
//! take it — the objective, the tasks, the scale — without loading a model or a plugin.

use std::fmt::Write;
use wirl_rollout::{RewardSource, SourceSpec};
use wirl_trainer::config::RunConfig;

/// What `--check` prints for a lowered config (`origin`: where it came from).
pub fn describe(origin: &str, config: &RunConfig) -> String {
    let g = &config.grpo;
    let mut out = String::new();
    let _ = writeln!(out, "{origin}: valid");
    let device = match config.device {
        wirl_trainer::config::DeviceSpec::Cpu => "cpu".to_string(),
        wirl_trainer::config::DeviceSpec::Cuda(n) => format!("cuda:{n}"),
    };
    let _ = writeln!(out, "model: {} on {device}", config.model);
    let _ = writeln!(
        out,
        "steps: {}, each {} prompts x {} completions, learning rate {} ({} schedule, {} warmup steps)",
        g.steps,
        g.prompts_per_step,
        g.group_size,
        g.learning_rate,
        serde_json::to_value(g.schedule).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        g.warmup_steps
    );
    let _ = writeln!(out, "objective:\n{}", config.objective);
    let _ = writeln!(out, "tasks:");
    for task in &config.tasks {
        let role = if task.weight == 0.0 { "held out only".to_string() } else { format!("weight {}", task.weight) };
        let _ = writeln!(out, "  {} ({role}): {}", task.name, source(&task.source));
        for reward in &task.rewards {
            let what = match &reward.source {
                RewardSource::Plugin { plugin, .. } => format!("plugin {}", plugin.path.display()),
                RewardSource::Model(model) => format!("reward model {} (label {})", model.path.display(), model.label),
            };
            let _ = writeln!(out, "    reward x{}: {what}", reward.weight);
        }
        let s = &task.sampling;
        let _ = writeln!(
            out,
            "    sampling: max_tokens {}, temperature {}, top_p {}, top_k {}; {} turn(s) at most",
            s.max_tokens, s.temperature, s.top_p, s.top_k, task.max_turns
        );
    }
    if let Some(lora) = &config.lora {
        let _ = writeln!(out, "lora: rank {}, alpha {}", lora.rank, lora.alpha);
    }
    if let Some(distill) = &config.distill {
        let _ = writeln!(out, "distill: teacher {} (weight {})", distill.teacher.display(), distill.weight);
    }
    let _ = writeln!(out, "eval: {} held-out tasks", config.eval.tasks);
    out.push_str("nothing was loaded: the model and the plugins are read when the run starts");
    out
}

fn source(spec: &SourceSpec) -> String {
    match spec {
        SourceSpec::Environment { plugin, seed } => format!("environment {} (seed {seed})", plugin.path.display()),
        SourceSpec::Dataset { train, eval } => {
            let path = |d: &Option<Box<wirl_rollout::DatasetSpec>>| {
                d.as_ref().map_or("none".to_string(), |d| d.path.display().to_string())
            };
            format!("dataset {} (held out: {})", path(train), path(eval))
        }
        SourceSpec::Agent { plugin, .. } => format!("agent {}", plugin.path.display()),
        SourceSpec::Remote(remote) => format!("remote task server {}", remote.url),
        SourceSpec::OpenEnv { spec, .. } => format!("OpenEnv server {}", spec.url),
    }
}
