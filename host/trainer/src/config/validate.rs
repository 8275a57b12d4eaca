//! Every rule a config must meet, each error naming the file (or `--set`), the key and what
//! to do: the shape of its tasks and their plugins (`check_with`), then every number
//! (`check_numbers`, run again after command-line overrides).

use super::lower::TaskView;
use super::*;
use std::collections::BTreeSet;

/// A float setting: its key, value, what it must be, and the test of that.
type FloatRule = (&'static str, f64, &'static str, fn(f64) -> bool);

/// The largest plugin memory a config may ask for: the sandbox's.
use wirl_sandbox::MAX_MEMORY_MIB;

/// `model.prefix_cache_mib` past this is a typo (1 TiB).
const MAX_PREFIX_CACHE_MIB: u64 = 1 << 20;

impl TrainConfig {
    pub(super) fn check(&self, origin: &str) -> crate::error::Result<()> {
        self.check_with(origin, true)
    }

    /// [`TrainConfig::check`]; without `plugins_on_disk`, plugin files need not exist (a
    /// manifest's plugins are loaded from the bytes the run keeps).
    pub(super) fn check_with(&self, origin: &str, plugins_on_disk: bool) -> crate::error::Result<()> {
        // A file's path is read from the config's directory; one given by `--set`, from here.
        let relative_to = if origin.starts_with("--set") { "the current directory" } else { "the config's directory" };
        let files = Files { origin, relative_to, plugins_on_disk };
        if !self.tasks.is_empty() && (self.environment.is_some() || self.dataset.is_some()) {
            bail!(
                "{origin}: with [[tasks]], each task names its own source: move [environment] into a task as \
                 [tasks.environment] (or [dataset] as [tasks.dataset])"
            );
        }
        let mut names = BTreeSet::new();
        for view in self.task_views() {
            check_task_name(origin, &view, &mut names)?;
            if let Some(remote) = view.remote {
                check_remote_task(origin, &view, remote)?;
            } else if let Some(openenv) = view.openenv {
                check_openenv_task(origin, &view, openenv)?;
            } else if let Some(agent) = view.agent {
                check_agent_task(&files, &view, agent)?;
            } else {
                check_task_source(&files, &view)?;
                check_task_scoring(&files, &view)?;
            }
        }
        if let Some(distill) = &self.distill {
            files.teacher("distill.teacher", &distill.teacher)?;
        }
        self.check_numbers(origin)
    }

    /// Every number of the config finite and in range, the error naming the key. Run on
    /// load and again after command-line overrides.
    pub fn check_numbers(&self, origin: &str) -> crate::error::Result<()> {
        if let Err(reason) = wirl_engine::check_template_vars(&self.model.chat_template_kwargs) {
            bail!("{origin}: `model.chat_template_kwargs`: {reason}");
        }
        if let Some(device) = &self.model.device
            && super::DeviceSpec::parse(device).is_none()
        {
            bail!("{origin}: `model.device` = {device:?}: expected \"cpu\", \"cuda\" or \"cuda:N\"");
        }
        if let Some(dtype) = &self.model.inference_dtype
            && super::parse_inference_dtype(dtype).is_none()
        {
            bail!(
                "{origin}: `model.inference_dtype` = {dtype:?}: expected \"f32\" (share the trainer's weights), \"bf16\" or \"f16\" (a copy refreshed after each update)"
            );
        }
        if let Some(dtype) = &self.model.train_dtype
            && super::parse_train_dtype(dtype).is_none()
        {
            bail!(
                "{origin}: `model.train_dtype` = {dtype:?}: expected \"f32\" or \"bf16\" (bf16 products, f32 weights, \
                 optimizer, norms, softmax and loss)"
            );
        }
        if let Some(mib) = self.model.prefix_cache_mib
            && mib > MAX_PREFIX_CACHE_MIB
        {
            bail!("{origin}: `model.prefix_cache_mib` = {mib}: at most {MAX_PREFIX_CACHE_MIB} (1 TiB); 0 keeps none");
        }
        self.check_counts(origin)?;
        self.check_swap_numbers(origin)?;
        self.check_grpo_floats(origin)?;
        self.check_objective(origin)?;
        self.check_unread_keys(origin)?;
        self.check_lora(origin)?;
        if let Some(distill) = &self.distill
            && !(distill.weight.is_finite() && distill.weight > 0.0 && distill.weight <= MAX_REWARD_SCALE)
        {
            bail!(
                "{origin}: `distill.weight` = {}: it must be a number above 0, at most 1e6 (the KL term's weight in \
                 each token's advantage)",
                distill.weight
            );
        }
        check_sampling(origin, "sampling.", &self.sampling.clone().into())?;
        let views = self.task_views();
        self.check_generation_lag(origin, &views)?;
        for view in &views {
            check_task_numbers(origin, view)?;
        }
        self.check_mixture(origin, &views)
    }

    /// Counts of `[grpo]` and `[sampling]` that must be at least 1 (a group: 2).
    fn check_counts(&self, origin: &str) -> crate::error::Result<()> {
        let g = &self.grpo;
        let positive = [
            ("grpo.steps", g.steps),
            ("grpo.prompts_per_step", g.prompts_per_step),
            ("grpo.inner_epochs", g.inner_epochs),
            ("grpo.max_skipped_updates", g.max_skipped_updates),
            ("grpo.max_draws", g.max_draws),
            ("sampling.max_tokens", self.sampling.max_tokens),
        ];
        for (key, value) in positive {
            if value == 0 {
                bail!("{origin}: `{key}` must be at least 1");
            }
        }
        if g.group_size < 2 {
            bail!("{origin}: `grpo.group_size` must be at least 2 (advantages compare samples of a group)");
        }
        // Far below the indices of extra draws' tasks (`trainer::EXTRA_DRAWS`).
        if g.max_draws > 1 << 10 {
            bail!("{origin}: `grpo.max_draws` = {}: at most 1024 draws a step", g.max_draws);
        }
        if let Some(overlong) = &g.overlong
            && overlong.buffer >= self.sampling.max_tokens
        {
            bail!(
                "{origin}: `grpo.overlong.buffer` = {}: it must be less than `sampling.max_tokens` = {} (the penalty \
                 starts max_tokens − buffer tokens into a completion)",
                overlong.buffer,
                self.sampling.max_tokens
            );
        }
        Ok(())
    }

    /// `[swap]`'s window and rates.
    fn check_swap_numbers(&self, origin: &str) -> crate::error::Result<()> {
        let w = &self.swap;
        if w.rollback_window == 0 {
            bail!("{origin}: `swap.rollback_window` must be at least 1");
        }
        let swap_floats: [FloatRule; 3] = [
            ("swap.max_failure_rate", w.max_failure_rate, "in [0, 1]", |x| (0.0..=1.0).contains(&x)),
            ("swap.rollback_failure_rate", w.rollback_failure_rate, "in [0, 1]", |x| (0.0..=1.0).contains(&x)),
            ("swap.backoff_s", w.backoff_s, "a number of seconds >= 0", |x| (0.0..=1e7).contains(&x)),
        ];
        for (key, value, wanted, ok) in swap_floats {
            if !(value.is_finite() && ok(value)) {
                bail!("{origin}: `{key}` = {value}: it must be {wanted}");
            }
        }
        Ok(())
    }

    /// `[grpo]`'s real numbers: finite, each in its range.
    fn check_grpo_floats(&self, origin: &str) -> crate::error::Result<()> {
        let g = &self.grpo;
        // `!(x >= lo)` and friends are true for NaN too: every comparison below refuses NaN.
        let floats: [FloatRule; 5] = [
            ("grpo.learning_rate", g.learning_rate, "a positive number", |x| x > 0.0),
            ("grpo.weight_decay", g.weight_decay, "a number >= 0", |x| x >= 0.0),
            ("grpo.entropy", g.entropy, "a finite number", |_| true),
            ("grpo.failure_reward", f64::from(g.failure_reward), "a number from -1e6 to 1e6", |x| {
                x.abs() <= MAX_REWARD_SCALE
            }),
            ("grpo.pass_reward", f64::from(g.pass_reward), "a finite number", |_| true),
        ];
        for (key, value, wanted, ok) in floats {
            if !(value.is_finite() && ok(value)) {
                bail!("{origin}: `{key}` = {value}: it must be {wanted}");
            }
        }
        if let Some(norm) = g.max_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            bail!(
                "{origin}: `grpo.max_grad_norm` = {norm}: it must be a positive number (leave it out for no clipping)"
            );
        }
        if let Some(name) = &g.preset
            && super::preset::keys(name, 1).is_none()
        {
            return Err(super::preset::unknown(origin, name));
        }
        Ok(())
    }

    /// The objective's numbers, each named as its table spells it (`grpo.loss.clip_low`;
    /// `objective_numbers`), the lagged groups' cap where none lags, the adaptive β's horizon.
    fn check_objective(&self, origin: &str) -> crate::error::Result<()> {
        let g = &self.grpo;
        let floats = objective_numbers(g);
        for (key, value, wanted, ok) in floats {
            if !(value.is_finite() && ok(value)) {
                bail!("{origin}: `{key}` = {value}: it must be {wanted}");
            }
        }
        // The lagged groups' cap where no group lags: never read.
        if let CorrectionSpec::Off { tis_cap } = g.correction
            && tis_cap != super::spelling::DEFAULT_TIS_CAP
            && g.generation_lag == 0
        {
            bail!(
                "{origin}: `grpo.correction.tis_cap` = {tis_cap} caps the importance weight of groups sampled a step \
                 behind, and grpo.generation_lag is 0: set generation_lag = 1, or leave it out"
            );
        }
        let KlSpec::Reward { target, horizon: Some(horizon), .. } = g.kl else { return Ok(()) };
        let completions = g.prompts_per_step.saturating_mul(g.group_size);
        if target.is_none() {
            bail!(
                "{origin}: `grpo.kl.horizon` = {horizon} without `grpo.kl.target`: there is no adaptive β to pace (set \
                 target, or leave horizon out)"
            );
        }
        // A step of n completions multiplies β by 1 ± 0.2·n/horizon: at n ≥ 5·horizon it could
        // reach 0 or change sign.
        if horizon.saturating_mul(5) <= completions {
            bail!(
                "{origin}: `grpo.kl.horizon` = {horizon}: it must be more than a fifth of the completions a step \
                 trains (prompts_per_step × group_size = {completions}), or one step's update could take β to 0 or \
                 below"
            );
        }
        Ok(())
    }

    /// `max_draws` without dynamic sampling, which alone reads it, refused where it differs
    /// from its default: a value set there would be silently ignored. (The objective's
    /// tables cannot hold a key their choice does not read.)
    fn check_unread_keys(&self, origin: &str) -> crate::error::Result<()> {
        let g = &self.grpo;
        if g.max_draws != GrpoSection::default().max_draws && !g.dynamic_sampling {
            bail!(
                "{origin}: `grpo.max_draws` = {} is read only with grpo.dynamic_sampling = true (it caps its draws): \
                 set that, or leave it out",
                g.max_draws
            );
        }
        Ok(())
    }

    /// `[lora]`: rank, alpha and targets as the adapter format allows; dropout 0.
    fn check_lora(&self, origin: &str) -> crate::error::Result<()> {
        let Some(lora) = &self.lora else { return Ok(()) };
        if lora.dropout != 0.0 {
            bail!(
                "{origin}: `lora.dropout` = {}: only 0 is supported (the layer-by-layer backward rebuilds layers \
                 and would draw another dropout mask than the forward did); remove the key or set 0",
                lora.dropout
            );
        }
        if let Err(message) = lora.spec().validate() {
            bail!("{origin}: `[lora]`: {message}");
        }
        Ok(())
    }

    /// `grpo.generation_lag`: 0 or 1, and 1 only where every trained task is single-turn.
    fn check_generation_lag(&self, origin: &str, views: &[TaskView<'_>]) -> crate::error::Result<()> {
        let g = &self.grpo;
        if g.generation_lag > 1 {
            bail!(
                "{origin}: `grpo.generation_lag` = {}: it must be 0 (sample with the step's own weights) or 1 (sample the \
                 next step while this one trains)",
                g.generation_lag
            );
        }
        if g.generation_lag > 0
            && let Some(view) = views.iter().find(|v| !v.eval_only && (v.max_turns > 1 || v.agent.is_some()))
        {
            let what = if view.agent.is_some() { "an agent task" } else { "a multi-turn task" };
            bail!(
                "{origin}: `grpo.generation_lag` = 1 samples single-turn tasks only, and task `{}` ({}) is {what} \
                 (its later turns would be sampled by newer weights than its first): set `grpo.generation_lag = 0`",
                view.name,
                if view.key.is_empty() { "the top-level task" } else { view.key.trim_end_matches('.') }
            );
        }
        Ok(())
    }

    /// The task mixture and the evaluation: a failure reward used somewhere, at least one
    /// group per trained task, training indices below the held-out ones, `[eval]`'s counts.
    fn check_mixture(&self, origin: &str, views: &[TaskView<'_>]) -> crate::error::Result<()> {
        let g = &self.grpo;
        if g.failure_reward != 0.0 && views.iter().all(|v| v.on_failure.unwrap_or(g.on_failure) == OnFailure::Mask) {
            bail!(
                "{origin}: `grpo.failure_reward` = {} is used only where failures are rewarded: set \
                 `grpo.on_failure = \"reward\"` (or a task's `on_failure`), or leave it out (failed trajectories are \
                 masked by default)",
                g.failure_reward
            );
        }
        // Each trained task gets at least one group a step (Megatron's rule).
        let weights: Vec<f64> = views.iter().map(|v| if v.eval_only { 0.0 } else { v.weight }).collect();
        if let Err(error) = wirl_rollout::allocate(&weights, g.prompts_per_step) {
            let error = match error {
                wirl_rollout::MixtureError::NothingToSample => {
                    "no task is trained on: give at least one task a positive weight and no `eval_only`".to_string()
                }
                other => other.to_string(),
            };
            bail!("{origin}: {error}");
        }
        let training_tasks = (g.steps as u64).checked_mul(g.prompts_per_step as u64);
        let Some(training_tasks) = training_tasks.filter(|&n| n < 1 << 40) else {
            bail!("{origin}: `grpo.steps` x `grpo.prompts_per_step` is too large (at most 2^40 tasks)");
        };
        if views.iter().any(|v| v.environment.is_some()) && self.eval.first_index < training_tasks {
            bail!("{origin}: `eval.first_index` overlaps the training tasks; raise it above steps x prompts_per_step");
        }
        if let Some(&k) = self.eval.k.iter().find(|&&k| k == 0 || (self.eval.samples > 0 && k > self.eval.samples)) {
            bail!("{origin}: `eval.k` = {k}: each k must be between 1 and `eval.samples` ({})", self.eval.samples);
        }
        // Bounded before anything is allocated for them: `--samples 100000000` once took 6 GB
        // in 16 s, and 2^64 - 1 overflowed a product.
        if self.eval.samples > MAX_EVAL_SAMPLES {
            bail!("{origin}: `eval.samples` = {}: at most {MAX_EVAL_SAMPLES} completions a task", self.eval.samples);
        }
        if self.eval.tasks > MAX_EVAL_TASKS {
            bail!("{origin}: `eval.tasks` = {}: at most {MAX_EVAL_TASKS} held-out tasks", self.eval.tasks);
        }
        if self.eval.batch_tasks == 0 {
            bail!("{origin}: `eval.batch_tasks` must be at least 1");
        }
        Ok(())
    }
}

/// Where a config's files are read from, and whether plugin files must exist.
struct Files<'a> {
    origin: &'a str,
    relative_to: &'a str,
    plugins_on_disk: bool,
}

impl Files<'_> {
    /// A plugin is a file, or a built-in named `builtin:NAME`.
    fn plugin(&self, key: &str, path: &Path) -> crate::error::Result<()> {
        let (origin, relative_to) = (self.origin, self.relative_to);
        match wirl_builtins::lookup(path) {
            Err(message) => bail!("{origin}: `{key}`: {message}"),
            Ok(Some(_)) => Ok(()),
            Ok(None) if path.is_file() || !self.plugins_on_disk => Ok(()),
            Ok(None) if path.exists() => bail!(
                "{origin}: `{key}`: plugin file {} is not a regular file (a directory, FIFO, device or socket); \
                 a plugin is a .wasm component file",
                path.display()
            ),
            Ok(None) => bail!(
                "{origin}: `{key}`: plugin file {} does not exist (build the plugins with scripts/build-plugins, \
                 name a built-in such as builtin:math-answer, or fix the path; relative paths are from \
                 {relative_to})",
                path.display()
            ),
        }
    }

    /// A distillation teacher: a model's directory or GGUF file.
    fn teacher(&self, key: &str, path: &Path) -> crate::error::Result<()> {
        let (origin, relative_to) = (self.origin, self.relative_to);
        if path.is_dir() || path.is_file() || !self.plugins_on_disk {
            return Ok(());
        }
        bail!(
            "{origin}: `{key}`: {} is not a model's directory or GGUF file (relative paths are from {relative_to})",
            path.display()
        )
    }

    /// A judge model: one of `JUDGE_WORDS`, or a model's directory or GGUF file.
    fn judge_model(&self, key: &str, path: &Path) -> crate::error::Result<()> {
        let (origin, relative_to) = (self.origin, self.relative_to);
        let word = super::JUDGE_WORDS.iter().any(|w| path.as_os_str() == *w);
        if word || path.is_dir() || path.is_file() || !self.plugins_on_disk {
            return Ok(());
        }
        bail!(
            "{origin}: `{key}`: {} is neither \"policy\" (the model being trained), \"initial\" (the model the run \
             started from, frozen) nor a model's directory or GGUF file (relative paths are from {relative_to})",
            path.display()
        )
    }

    /// A reward model's directory (what is in it, loading checks: the config, the weights).
    fn model_dir(&self, key: &str, path: &Path) -> crate::error::Result<()> {
        let (origin, relative_to) = (self.origin, self.relative_to);
        if path.is_dir() || !self.plugins_on_disk {
            return Ok(());
        }
        bail!(
            "{origin}: `{key}`: {} is not a directory: a reward model is a sequence classifier's directory as \
             transformers saves it (config.json, model.safetensors, tokenizer.json; relative paths are from \
             {relative_to})",
            path.display()
        )
    }
}

/// ` of `tasks[1].name` = "…"` for a `[[tasks]]` entry; empty for the single-source keys.
fn where_of(view: &TaskView<'_>) -> String {
    let key = &view.key;
    if key.is_empty() { String::new() } else { format!(" of `{key}name` = {:?}", view.name) }
}

/// A `[[tasks]]` entry's name: 1 to 64 safe characters, unique.
fn check_task_name(origin: &str, view: &TaskView<'_>, names: &mut BTreeSet<String>) -> crate::error::Result<()> {
    let key = &view.key;
    if key.is_empty() {
        return Ok(());
    }
    let fine = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if view.name.is_empty() || view.name.len() > 64 || !view.name.chars().all(fine) {
        bail!("{origin}: `{key}name` = {:?}: a task's name is 1 to 64 letters, digits, `-`, `_` or `.`", view.name);
    }
    if !names.insert(view.name.clone()) {
        bail!("{origin}: `{key}name`: two tasks are named {:?}; names must be unique", view.name);
    }
    Ok(())
}

/// A task served by another `wirl serve`: its only source, scored there, single-turn.
fn check_remote_task(origin: &str, view: &TaskView<'_>, remote: &RemoteSection) -> crate::error::Result<()> {
    let key = &view.key;
    if view.agent.is_some() || view.environment.is_some() || view.dataset.is_some() || view.openenv.is_some() {
        bail!(
            "{origin}: give one of [{key}environment], [{key}dataset], [{key}agent], [{key}remote] or \
             [{key}openenv], not several"
        );
    }
    if view.own_rewards {
        bail!("{origin}: `{key}rewards`: a remote task is scored by its server; remove its [[{key}rewards]]");
    }
    if view.max_turns > 1 {
        bail!("{origin}: `{key}max_turns`: remote tasks are single-turn (max_turns = 1)");
    }
    check_server(origin, &format!("{key}remote"), &remote.url, remote.timeout_s, remote.retries)
}

/// A server's URL (`http://HOST:PORT`), its timeout and retries, named by `section`.
fn check_server(origin: &str, section: &str, url: &str, timeout_s: f64, retries: u32) -> crate::error::Result<()> {
    let host = url.trim_end_matches('/').strip_prefix("http://").unwrap_or_default();
    if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
        bail!("{origin}: `{section}.url` = {url:?}: give the server as http://HOST:PORT (as `wirl serve` prints it)");
    }
    if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= 3600.0) {
        bail!("{origin}: `{section}.timeout_s` must be a number of seconds above 0, at most 3600");
    }
    if retries > 10 {
        bail!("{origin}: `{section}.retries` must be at most 10");
    }
    Ok(())
}

/// An OpenEnv task: its only source, scored by its environment's rewards.
fn check_openenv_task(origin: &str, view: &TaskView<'_>, openenv: &OpenEnvSection) -> crate::error::Result<()> {
    let key = &view.key;
    if view.agent.is_some() || view.environment.is_some() || view.dataset.is_some() {
        bail!("{origin}: give one of [{key}environment], [{key}dataset], [{key}agent] or [{key}openenv], not several");
    }
    if view.own_rewards {
        bail!(
            "{origin}: `{key}rewards`: an OpenEnv task is scored by its environment's rewards; remove its \
             [[{key}rewards]]"
        );
    }
    if openenv.action_field.trim().is_empty() {
        bail!("{origin}: `{key}openenv.action_field` is empty: name the action's field that carries the reply");
    }
    if openenv.observation_field.as_deref().is_some_and(|f| f.trim().is_empty()) {
        bail!("{origin}: `{key}openenv.observation_field` is empty: name a field, or leave it out for all of it");
    }
    check_server(origin, &format!("{key}openenv"), &openenv.url, openenv.timeout_s, openenv.retries)
}

/// An agent task: its plugin, and nothing it does itself (scoring, turns).
fn check_agent_task(files: &Files<'_>, view: &TaskView<'_>, agent: &AgentSection) -> crate::error::Result<()> {
    let (origin, key) = (files.origin, &view.key);
    if view.environment.is_some() || view.dataset.is_some() {
        let where_ = where_of(view);
        bail!("{origin}: give one of [{key}environment], [{key}dataset] or [{key}agent]{where_}, not several");
    }
    files.plugin(&format!("{key}agent.plugin"), &agent.plugin)?;
    if view.own_rewards {
        bail!("{origin}: `{key}rewards`: an agent scores its own rollouts; remove its [[{key}rewards]]");
    }
    if view.max_turns > 1 {
        bail!("{origin}: `{key}max_turns`: an agent decides its turns itself; leave max_turns out");
    }
    for (name, value) in [("max_generate_calls", agent.max_generate_calls), ("max_tokens", agent.max_tokens)] {
        if value == 0 {
            bail!("{origin}: `{key}agent.{name}` must be at least 1");
        }
    }
    Ok(())
}

/// An environment's plugin or a dataset's files: exactly one of the two.
fn check_task_source(files: &Files<'_>, view: &TaskView<'_>) -> crate::error::Result<()> {
    let (origin, relative_to, key) = (files.origin, files.relative_to, &view.key);
    let where_ = where_of(view);
    match (view.environment, view.dataset) {
        (Some(environment), None) => files.plugin(&format!("{key}environment.plugin"), &environment.plugin),
        (None, Some(dataset)) => {
            if dataset.train.is_none() && dataset.eval.is_none() {
                bail!("{origin}: [{key}dataset] names no file: set `train` (to train) and/or `eval` (held-out tasks)");
            }
            if dataset.train.is_none() && !view.eval_only && view.weight > 0.0 && !key.is_empty() {
                bail!(
                    "{origin}: `{key}dataset` has no `train` file but the task trains (weight {}): name one, or set \
                     `{key}eval_only = true`",
                    view.weight
                );
            }
            let named = dataset.train.iter().map(|p| ("train", p)).chain(dataset.eval.iter().map(|p| ("eval", p)));
            for (name, path) in named {
                if !path.exists() {
                    bail!(
                        "{origin}: `{key}dataset.{name}`: {} does not exist (relative paths are from {relative_to})",
                        path.display()
                    );
                }
            }
            Ok(())
        }
        (Some(_), Some(_)) => bail!("{origin}: give either [{key}environment] or [{key}dataset]{where_}, not both"),
        (None, None) if key.is_empty() => bail!(
            "{origin}: no task source: add an [environment] table (a plugin) or a [dataset] table (JSONL), or \
             [[tasks]]"
        ),
        (None, None) => bail!(
            "{origin}: `{key}`: the task {:?} has no source: add [{key}environment], [{key}dataset] or [{key}agent]",
            view.name
        ),
    }
}

/// How the task is scored: a multi-turn task by its environment's episodes, a single-turn
/// one by at least one reward plugin.
fn check_task_scoring(files: &Files<'_>, view: &TaskView<'_>) -> crate::error::Result<()> {
    let (origin, key) = (files.origin, &view.key);
    if view.max_turns > 1 {
        if view.environment.is_none() {
            bail!(
                "{origin}: `{key}max_turns` = {}: episodes come from an environment plugin; a dataset task is \
                 single-turn (max_turns = 1)",
                view.max_turns
            );
        }
        if view.own_rewards && !key.is_empty() {
            bail!(
                "{origin}: `{key}rewards`: a multi-turn task (max_turns = {}) is scored by its environment's \
                 episodes; remove its [[{key}rewards]] or set max_turns = 1",
                view.max_turns
            );
        }
        return Ok(());
    }
    if view.rewards.is_empty() {
        bail!(
            "{origin}: `{}`: at least one reward plugin is needed{} (a [[rewards]] table{})",
            view.rewards_key,
            where_of(view),
            if key.is_empty() { String::new() } else { format!(", shared, or [[{key}rewards]]") }
        );
    }
    for (i, reward) in view.rewards.iter().enumerate() {
        let rkey = &view.rewards_key;
        check_reward_kind(origin, &format!("{rkey}[{i}]"), reward)?;
        match (&reward.plugin, &reward.model) {
            (Some(plugin), _) => files.plugin(&format!("{rkey}[{i}].plugin"), plugin)?,
            (None, Some(model)) => files.model_dir(&format!("{rkey}[{i}].model"), model)?,
            (None, None) => unreachable!("check_reward_kind refuses a reward with neither"),
        }
        if let Some(runner) = &reward.code_runner {
            files.plugin(&format!("{rkey}[{i}].code_runner.plugin"), &runner.plugin)?;
        }
        if let Some(judge) = &reward.judge_model {
            files.judge_model(&format!("{rkey}[{i}].judge_model"), judge)?;
        }
    }
    Ok(())
}

/// A reward is a plugin or a model, and a model's reward takes none of a plugin's keys.
fn check_reward_kind(origin: &str, key: &str, reward: &RewardSection) -> crate::error::Result<()> {
    match (&reward.plugin, &reward.model) {
        (Some(_), Some(_)) => bail!(
            "{origin}: `{key}` names both a `plugin` and a `model`: a reward is one or the other (two rewards are \
             two [[rewards]] tables)"
        ),
        (None, None) => bail!(
            "{origin}: `{key}` names no `plugin` and no `model`: give a reward plugin (`plugin = \"builtin:NAME\"` \
             or a .wasm file) or a reward model's directory (`model = \"DIR\"`)"
        ),
        (Some(_), None) if reward.label.is_some() => {
            bail!("{origin}: `{key}.label` picks a reward model's score: a plugin has none (remove it)")
        }
        (None, Some(_)) => {
            let plugin_keys = [
                ("config", !reward.config.is_empty()),
                ("deadline_ms", reward.deadline_ms.is_some()),
                ("memory_mib", reward.memory_mib.is_some()),
                ("code_runner", reward.code_runner.is_some()),
                ("inference_calls", reward.inference_calls.is_some()),
                ("inference_tokens", reward.inference_tokens.is_some()),
                ("judge_model", reward.judge_model.is_some()),
            ];
            if let Some((name, _)) = plugin_keys.iter().find(|(_, given)| *given) {
                bail!(
                    "{origin}: `{key}.{name}` is a plugin's setting, and this reward is a model (`model`): remove it"
                );
            }
            Ok(())
        }
        (Some(_), None) => Ok(()),
    }
}

/// A reward's `generate` calls per scoring call: a group's completions judged one by one,
/// several times over.
const MAX_INFERENCE_CALLS: u64 = 1 << 12;
/// A reward's tokens per scoring call: a long judgement of each of a large group.
const MAX_INFERENCE_TOKENS: u64 = 1 << 22;

/// Completions per held-out task for pass@k: far past any k reported.
const MAX_EVAL_SAMPLES: usize = 1024;
/// Held-out tasks of one evaluation.
const MAX_EVAL_TASKS: usize = 1 << 20;

/// The largest magnitude of a reward weight, a failure reward or an overlong penalty: rewards
/// are f32, and `-1e38` times a reward of 2 was −inf, every group "without signal".
const MAX_REWARD_SCALE: f64 = 1e6;

/// One task's numbers: its pass reward, turns, sampling, weight, reward weights, workers and
/// plugin memories.
///
/// Over ~80 lines on purpose: a list of rules, one per number a task carries, each naming
/// its key; a list reads best whole.
fn check_task_numbers(origin: &str, view: &TaskView<'_>) -> crate::error::Result<()> {
    let key = &view.key;
    if let Some(pass) = view.pass_reward
        && !pass.is_finite()
    {
        bail!("{origin}: `{key}pass_reward` = {pass}: it must be a finite number");
    }
    if !(1..=MAX_TURNS).contains(&view.max_turns) {
        bail!("{origin}: `{key}max_turns` = {}: it must be between 1 and {MAX_TURNS}", view.max_turns);
    }
    if !key.is_empty() {
        check_sampling(origin, &format!("{key}sampling."), view.sampling)?;
        if !(view.weight.is_finite() && view.weight >= 0.0) {
            bail!("{origin}: `{key}weight` = {}: it must be a finite number >= 0", view.weight);
        }
    }
    for (i, reward) in view.rewards.iter().enumerate() {
        if !(reward.weight.is_finite() && f64::from(reward.weight.abs()) <= MAX_REWARD_SCALE) {
            bail!(
                "{origin}: `{}[{i}].weight` = {}: it must be a number from -1e6 to 1e6 (a larger weight turns \
                 rewards into infinities)",
                view.rewards_key,
                reward.weight
            );
        }
        for (name, value, max) in [
            ("inference_calls", reward.inference_calls, MAX_INFERENCE_CALLS),
            ("inference_tokens", reward.inference_tokens, MAX_INFERENCE_TOKENS),
        ] {
            if let Some(value) = value
                && !(1..=max).contains(&value)
            {
                bail!(
                    "{origin}: `{}[{i}].{name}` = {value}: it must be between 1 and {max} (what one scoring call of \
                     the reward may ask of the model)",
                    view.rewards_key
                );
            }
        }
        if let Some(runner) = &reward.code_runner
            && runner.workers > wirl_sandbox::MAX_WORKERS
        {
            bail!(
                "{origin}: `{}[{i}].code_runner.workers` = {}: it must be between 0 (programs run in \
                 process) and {}",
                view.rewards_key,
                runner.workers,
                wirl_sandbox::MAX_WORKERS
            );
        }
    }
    // Each plugin's limits by the key they sit under: (key, memory_mib, deadline_ms).
    let mut plugins: Vec<(String, Option<u64>, Option<u64>)> = Vec::new();
    if let Some(environment) = view.environment {
        plugins.push((format!("{key}environment"), environment.memory_mib, environment.deadline_ms));
    }
    if let Some(agent) = view.agent {
        plugins.push((format!("{key}agent"), agent.memory_mib, agent.deadline_ms));
    }
    for (i, reward) in view.rewards.iter().enumerate() {
        let rkey = &view.rewards_key;
        plugins.push((format!("{rkey}[{i}]"), reward.memory_mib, reward.deadline_ms));
        if let Some(runner) = &reward.code_runner {
            plugins.push((format!("{rkey}[{i}].code_runner"), runner.memory_mib, runner.deadline_ms));
        }
    }
    for (key, mib, ms) in plugins {
        // Memory in MiB becomes bytes: a value that cannot is refused, not wrapped.
        if let Some(mib) = mib
            && !(1..=MAX_MEMORY_MIB).contains(&mib)
        {
            bail!(
                "{origin}: `{key}.memory_mib` = {mib}: it must be between 1 and {MAX_MEMORY_MIB} (the sandbox's maximum)"
            );
        }
        // A deadline of 0 ended every call at once or not, by the clock's tick; one past an
        // hour is a typo for "never".
        if let Some(ms) = ms
            && !(1..=wirl_sandbox::MAX_DEADLINE_MS).contains(&ms)
        {
            bail!(
                "{origin}: `{key}.deadline_ms` = {ms}: it must be between 1 and {} (an hour), in milliseconds",
                wirl_sandbox::MAX_DEADLINE_MS
            );
        }
    }
    Ok(())
}

impl From<SamplingSection> for SamplingOverrides {
    fn from(s: SamplingSection) -> Self {
        SamplingOverrides {
            max_tokens: Some(s.max_tokens),
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: Some(s.top_k),
        }
    }
}

/// The sampling keys under `prefix` that are set: in the engine's ranges
/// (`wirl_engine::sampling::rules`, as for the HTTP API), named on error; and a temperature
/// above 0, which training needs.
fn check_sampling(origin: &str, prefix: &str, sampling: &SamplingOverrides) -> crate::error::Result<()> {
    use wirl_engine::sampling::rules;
    if let Some(max_tokens) = sampling.max_tokens {
        rules::max_tokens(i64::try_from(max_tokens).unwrap_or(i64::MAX), usize::MAX)
            .map_err(|_| crate::error::invalid!("{origin}: `{prefix}max_tokens` must be at least 1"))?;
    }
    if let Some(top_p) = sampling.top_p {
        rules::top_p(top_p.into())
            .map_err(|range| crate::error::invalid!("{origin}: `{prefix}top_p` = {top_p}: it {range}"))?;
    }
    if let Some(temperature) = sampling.temperature {
        rules::temperature(temperature.into())
            .map_err(|range| crate::error::invalid!("{origin}: `{prefix}temperature` = {temperature}: it {range}"))?;
        if temperature == 0.0 {
            bail!(
                "{origin}: `{prefix}temperature` = {temperature}: training needs a positive temperature (at 0 every \
                 sample of a group is the same, so no group carries a signal)"
            );
        }
    }
    Ok(())
}

/// The objective's real numbers, each with its key as the tables spell it, what it must be
/// and the test of that: the clips, SAPO's temperatures (positive, at most 50: the gate's
/// sigmoid then stays within f32 at any ratio), β (a KL term needs one above 0), the
/// adaptive β's target, the overlong penalty, the correction's bounds and cap.
fn objective_numbers(g: &GrpoSection) -> Vec<FloatRule> {
    let mut floats: Vec<FloatRule> = Vec::new();
    match g.loss {
        LossSpec::Grpo { clip_low, clip_high } | LossSpec::Gspo { clip_low, clip_high } => {
            floats.push(("grpo.loss.clip_low", clip_low, "in [0, 1)", |x| (0.0..1.0).contains(&x)));
            floats.push(("grpo.loss.clip_high", clip_high, "a number >= 0", |x| x >= 0.0));
        }
        LossSpec::Cispo { clip_high } => {
            floats.push(("grpo.loss.clip_high", clip_high, "a number >= 0", |x| x >= 0.0));
        }
        LossSpec::Sapo { temperature_pos, temperature_neg } => {
            let temperature: fn(f64) -> bool = |x| x > 0.0 && x <= 50.0;
            floats.push(("grpo.loss.temperature_pos", temperature_pos, "a number above 0 and at most 50", temperature));
            floats.push(("grpo.loss.temperature_neg", temperature_neg, "a number above 0 and at most 50", temperature));
        }
    }
    if let KlSpec::Loss { beta, .. } | KlSpec::Reward { beta, .. } = g.kl {
        floats.push(("grpo.kl.beta", beta, "a number above 0 (for no KL term: kl = { where = \"off\" })", |x| x > 0.0));
    }
    if let KlSpec::Reward { target: Some(target), .. } = g.kl {
        floats.push(("grpo.kl.target", target, "a positive number (a mean KL per token)", |x| x > 0.0));
    }
    if let Some(overlong) = &g.overlong {
        floats.push(("grpo.overlong.penalty", overlong.penalty, "a number from 0 to 1e6", |x| {
            (0.0..=MAX_REWARD_SCALE).contains(&x)
        }));
    }
    match g.correction {
        CorrectionSpec::Off { tis_cap } => {
            floats.push(("grpo.correction.tis_cap", tis_cap, "a number >= 1", |x| x >= 1.0))
        }
        _ => {
            let (max, min) = g.correction.bounds().expect("a correction that is on");
            floats.push(("grpo.correction.max", max, "a number >= 1", |x| x >= 1.0));
            if let Some(min) = min {
                let between: fn(f64) -> bool = |x| (0.0..=1.0).contains(&x);
                floats.push((
                    "grpo.correction.min",
                    min,
                    "a number from 0 to 1 (leave it out for no lower bound)",
                    between,
                ));
            }
        }
    }
    floats
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default config with its `[sampling]` keys replaced.
    fn with_sampling(keys: &str) -> crate::error::Result<TrainConfig> {
        let default = "[sampling]\nmax_tokens = 64\ntemperature = 1.0\n";
        assert!(DEFAULT_TOML.contains(default), "the default config's [sampling] changed: update this test");
        let text = DEFAULT_TOML.replace(default, &format!("[sampling]\n{keys}\n"));
        TrainConfig::parse(&text, "test.toml", Path::new("."))
    }

    #[test]
    fn sampling_keys_follow_the_engines_rules_and_training_needs_a_temperature() {
        with_sampling("max_tokens = 64\ntemperature = 2.0\ntop_p = 1.0").unwrap();
        for (keys, says) in [
            ("temperature = 2.5", "`sampling.temperature` = 2.5: it must be from 0 to 2"),
            ("temperature = nan", "`sampling.temperature` = NaN: it must be from 0 to 2"),
            ("temperature = inf", "`sampling.temperature` = inf: it must be from 0 to 2"),
            ("temperature = -1.0", "it must be from 0 to 2"),
            ("temperature = 0.0", "training needs a positive temperature"),
            ("top_p = 0.0", "`sampling.top_p` = 0: it must be in (0, 1]"),
            ("top_p = 1.5", "`sampling.top_p` = 1.5: it must be in (0, 1]"),
            ("max_tokens = 0", "`sampling.max_tokens` must be at least 1"),
        ] {
            let error = wirl_engine::error_chain(&with_sampling(keys).unwrap_err());
            assert!(error.contains(says) && error.contains("test.toml"), "{keys}: {error}");
        }
    }

    /// A config of `[[tasks]]` (built-in plugins, so no file is needed) with `extra` after
    /// them; the error, if any, in full.
    fn tasks_config(tasks: &str, extra: &str) -> Result<TrainConfig, String> {
        let text =
            format!("[model]\npath = \"m\"\n\n[[rewards]]\nplugin = \"builtin:math-answer\"\n\n{tasks}\n{extra}");
        TrainConfig::parse(&text, "t.toml", Path::new(".")).map_err(|e| wirl_engine::error_chain(&e))
    }

    const ARITHMETIC: &str = "[[tasks]]\nname = \"a\"\nenvironment = { plugin = \"builtin:arithmetic\" }\n";

    fn refused(tasks: &str, extra: &str, says: &str) {
        let error = tasks_config(tasks, extra).map(|_| ()).expect_err(says);
        assert!(error.contains(says) && error.contains("t.toml"), "wanted {says:?}, got: {error}");
    }

    /// `model.prefix_cache_mib`: absent, 256 MiB for multi-turn tasks and agents and none
    /// for single-turn ones; what the config says otherwise; a typo-sized or negative
    /// budget refused naming the key.
    #[test]
    fn the_prefix_cache_follows_the_tasks_unless_the_config_says() {
        let bytes =
            |tasks: &str, extra: &str| tasks_config(tasks, extra).unwrap().run_config().unwrap().prefix_cache_bytes;
        let multi_turn = ARITHMETIC.replace("name = \"a\"", "name = \"a\"\nmax_turns = 3");
        assert_eq!(bytes(ARITHMETIC, ""), 0);
        assert_eq!(bytes(&multi_turn, ""), 256 << 20);
        let model = |mib: &str| format!("[model]\npath = \"m\"\nprefix_cache_mib = {mib}\n");
        let with = |mib: &str, tasks: &str| {
            let text = format!("{}\n[[rewards]]\nplugin = \"builtin:math-answer\"\n\n{tasks}", model(mib));
            TrainConfig::parse(&text, "t.toml", Path::new(".")).map_err(|e| wirl_engine::error_chain(&e))
        };
        assert_eq!(with("0", &multi_turn).unwrap().run_config().unwrap().prefix_cache_bytes, 0);
        assert_eq!(with("64", ARITHMETIC).unwrap().run_config().unwrap().prefix_cache_bytes, 64 << 20);
        for (mib, says) in [
            ("2000000", "`model.prefix_cache_mib` = 2000000: at most"),
            ("-1", "prefix_cache_mib"),
            ("1.5", "prefix_cache_mib"),
        ] {
            let error = with(mib, ARITHMETIC).map(|_| ()).unwrap_err();
            assert!(error.contains(says) && error.contains("t.toml"), "{mib}: {error}");
        }
    }

    #[test]
    fn a_good_multitask_config_passes() {
        let two = format!("{ARITHMETIC}\n{}", ARITHMETIC.replace("\"a\"", "\"b\""));
        tasks_config(&two, "").unwrap();
    }

    #[test]
    fn task_names_are_safe_and_unique() {
        refused(&ARITHMETIC.replace("\"a\"", "\"a b\""), "", "`tasks[0].name` = \"a b\": a task's name is 1 to 64");
        refused(&ARITHMETIC.replace("\"a\"", "\"\""), "", "a task's name is 1 to 64");
        refused(&format!("{ARITHMETIC}{ARITHMETIC}"), "", "`tasks[1].name`: two tasks are named \"a\"");
    }

    #[test]
    fn a_task_has_exactly_one_source_and_is_scored_one_way() {
        let both = "[[tasks]]\nname = \"x\"\nenvironment = { plugin = \"builtin:arithmetic\" }\n\
                    agent = { plugin = \"builtin:arithmetic\" }\n";
        refused(both, "", "give one of [tasks[0].environment], [tasks[0].dataset] or [tasks[0].agent]");
        refused("[[tasks]]\nname = \"x\"\n", "", "`tasks[0].`: the task \"x\" has no source");
        let remote =
            "[[tasks]]\nname = \"r\"\nremote = { url = \"http://127.0.0.1:1\", task = \"t\" }\nmax_turns = 2\n";
        refused(remote, "", "`tasks[0].max_turns`: remote tasks are single-turn");
        let url = "[[tasks]]\nname = \"r\"\nremote = { url = \"ftp://h/x\", task = \"t\" }\n";
        refused(url, "", "`tasks[0].remote.url` = \"ftp://h/x\": give the server as http://HOST:PORT");
        let slow = "[[tasks]]\nname = \"r\"\nremote = { url = \"http://h:1\", task = \"t\", timeout_s = nan }\n";
        refused(slow, "", "`tasks[0].remote.timeout_s` must be a number of seconds above 0");
        let agent = "[[tasks]]\nname = \"g\"\nagent = { plugin = \"builtin:arithmetic\", max_tokens = 0 }\n";
        refused(agent, "", "`tasks[0].agent.max_tokens` must be at least 1");
        let episodes = ARITHMETIC.to_string() + "max_turns = 3\n[[tasks.rewards]]\nplugin = \"builtin:math-answer\"\n";
        refused(&episodes, "", "`tasks[0].rewards`: a multi-turn task (max_turns = 3) is scored by its environment");
        let dataset = "[[tasks]]\nname = \"d\"\ndataset = {}\n";
        refused(dataset, "", "[tasks[0].dataset] names no file");
        let missing = "[[tasks]]\nname = \"d\"\ndataset = { train = \"no-such-file.jsonl\" }\n";
        refused(missing, "", "`tasks[0].dataset.train`: ");
        let plugin = "[[tasks]]\nname = \"p\"\nenvironment = { plugin = \"no-such-plugin.wasm\" }\n";
        refused(plugin, "", "`tasks[0].environment.plugin`: plugin file");
    }

    #[test]
    fn every_number_is_finite_and_in_range_and_named() {
        for (extra, says) in [
            ("[grpo]\ngroup_size = 1", "`grpo.group_size` must be at least 2"),
            ("[grpo]\nsteps = 0", "`grpo.steps` must be at least 1"),
            ("[grpo]\nlearning_rate = nan", "`grpo.learning_rate` = NaN: it must be a positive number"),
            ("[grpo]\nclip_low = 1.0", "`grpo.loss.clip_low` = 1: it must be in [0, 1)"),
            ("[grpo]\nloss = { kind = \"gspo\", clip_high = -1 }", "`grpo.loss.clip_high` = -1: it must be"),
            ("[grpo]\nkl = { where = \"loss\", beta = 0.0 }", "`grpo.kl.beta` = 0: it must be a number above 0"),
            ("[grpo]\nkl = { where = \"reward\", beta = 0.1, target = 0 }", "`grpo.kl.target` = 0: it must be"),
            ("[grpo]\noverlong = { buffer = 64 }", "`grpo.overlong.buffer` = 64: it must be less than"),
            ("[grpo]\noverlong = { buffer = 4, penalty = inf }", "`grpo.overlong.penalty` = inf: it must be"),
            ("[grpo]\ntis_cap = 0.5", "`grpo.correction.tis_cap` = 0.5: it must be a number >= 1"),
            ("[grpo]\nmax_grad_norm = -1.0", "`grpo.max_grad_norm` = -1: it must be a positive number"),
            ("[grpo]\ngeneration_lag = 2", "`grpo.generation_lag` = 2: it must be 0"),
            ("[grpo]\nfailure_reward = -1.0", "`grpo.failure_reward` = -1 is used only where failures are rewarded"),
            ("[grpo]\nsteps = 1099511627776", "`grpo.steps` x `grpo.prompts_per_step` is too large"),
            ("[grpo]\nloss = \"sapo\"\nsapo_temperature_neg = 0.0", "`grpo.loss.temperature_neg` = 0: it must be"),
            ("[grpo]\nloss = \"sapo\"\nsapo_temperature_pos = 51.0", "`grpo.loss.temperature_pos` = 51: it must be"),
            ("[grpo]\nloss = \"sapo\"\nsapo_temperature_pos = nan", "`grpo.loss.temperature_pos` = NaN: it must be"),
            ("[swap]\nmax_failure_rate = 2.0", "`swap.max_failure_rate` = 2: it must be in [0, 1]"),
            ("[swap]\nrollback_window = 0", "`swap.rollback_window` must be at least 1"),
            ("[eval]\nsamples = 2\nk = [3]", "`eval.k` = 3: each k must be between 1 and `eval.samples` (2)"),
            ("[eval]\nbatch_tasks = 0", "`eval.batch_tasks` must be at least 1"),
            ("[eval]\nsamples = 100000000", "`eval.samples` = 100000000: at most 1024"),
            ("[eval]\ntasks = 100000000", "`eval.tasks` = 100000000: at most 1048576"),
            ("[grpo]\nfailure_reward = -1e30", "`grpo.failure_reward` = -1"),
            ("[eval]\nfirst_index = 3", "`eval.first_index` overlaps the training tasks"),
        ] {
            refused(ARITHMETIC, extra, says);
        }
    }

    /// The adaptive β's keys: a horizon as large as TOML allows is taken (β then barely
    /// moves), not overflowed into a refusal.
    #[test]
    fn the_kl_horizon_takes_any_size_above_a_fifth_of_a_step() {
        let kl = "[grpo]\nbeta = 0.1\nkl_in_reward = true\nkl_target = 0.1\nkl_horizon = ";
        let config = tasks_config(ARITHMETIC, &format!("{kl}{}", i64::MAX)).unwrap().run_config().unwrap();
        let horizon = match config.grpo.kl {
            crate::config::KlSpec::Reward { horizon, .. } => horizon,
            other => panic!("{other:?}"),
        };
        assert_eq!(horizon, Some(i64::MAX as usize));
        // The default step: 4 prompts × 8 completions.
        refused(ARITHMETIC, &format!("{kl}6"), "prompts_per_step × group_size = 32");
        assert!(tasks_config(ARITHMETIC, &format!("{kl}7")).is_ok());
    }

    /// A key the objective would not read is refused where it differs from its default, naming
    /// what reads it; the same keys where they are read, and the presets, are taken.
    #[test]
    fn keys_the_objective_does_not_read_are_refused() {
        for (extra, says) in [
            ("[grpo]\nmax_draws = 3", "`grpo.max_draws` = 3 is read only with grpo.dynamic_sampling = true"),
            ("[grpo]\noverlong_penalty = 0.5", "`grpo.overlong_penalty` = 0.5 is the penalty at the end of"),
            (
                "[grpo]\nloss = \"cispo\"\nclip_low = 0.1",
                "`grpo.clip_low` = 0.1 is not read under grpo.loss = \"cispo\"",
            ),
            ("[grpo]\nloss = \"sapo\"\nclip_low = 0.1", "`grpo.clip_low` = 0.1 is not read under grpo.loss = \"sapo\""),
            (
                "[grpo]\nloss = \"sapo\"\nclip_high = 0.28",
                "`grpo.clip_high` = 0.28 is not read under grpo.loss = \"sapo\"",
            ),
            (
                "[grpo]\ntis_cap = 3.0",
                "`grpo.correction.tis_cap` = 3 caps the importance weight of groups sampled a step behind",
            ),
            (
                "[grpo]\nrollout_correction_max = 2.0",
                "`grpo.rollout_correction_max` = 2 bounds grpo.rollout_correction",
            ),
            (
                "[grpo]\nrollout_correction_min = 0.5",
                "`grpo.rollout_correction_min` = 0.5 bounds grpo.rollout_correction",
            ),
            (
                "[grpo]\nrollout_correction = \"token_mask\"\ngeneration_lag = 1\ntis_cap = 3.0",
                "`grpo.tis_cap` = 3 is not read under grpo.rollout_correction",
            ),
            (
                "[grpo]\nrollout_correction = \"sequence_mask\"\nrollout_correction_max = nan",
                "`grpo.correction.max` = NaN: it must be a number >= 1",
            ),
            (
                "[grpo]\nrollout_correction = \"sequence_mask\"\nrollout_correction_min = 1.5",
                "`grpo.correction.min` = 1.5: it must be a number from 0 to 1",
            ),
            ("[grpo]\nrollout_correction = \"tis\"", "rollout_correction"),
        ] {
            refused(ARITHMETIC, extra, says);
        }
        for extra in [
            "[grpo]\ndynamic_sampling = true\nmax_draws = 3",
            "[grpo]\noverlong_buffer = 4\noverlong_penalty = 0.5",
            "[grpo]\nloss = \"cispo\"\nclip_high = 4.0",
            "[grpo]\nloss = \"sapo\"\nclip_low = 0.2\nclip_high = 0.2",
            "[grpo]\ngeneration_lag = 1\ntis_cap = 3.0",
            "[grpo]\nrollout_correction = \"sequence_mask\"\nrollout_correction_min = 0.5",
            "[grpo]\nrollout_correction = \"token_truncate\"\nrollout_correction_max = 2.0\ngeneration_lag = 1",
            "[grpo]\npreset = \"dapo\"",
            "[grpo]\npreset = \"dr_grpo\"\nloss = \"sapo\"",
        ] {
            assert!(tasks_config(ARITHMETIC, extra).is_ok(), "{extra}: {:?}", tasks_config(ARITHMETIC, extra).err());
        }
    }

    #[test]
    fn a_tasks_own_numbers_are_checked_by_its_key() {
        for (lines, says) in [
            ("weight = -1.0", "`tasks[0].weight` = -1: it must be a finite number >= 0"),
            ("weight = 0.0", "no task is trained on"),
            ("max_turns = 0", "`tasks[0].max_turns` = 0: it must be between 1 and 64"),
            ("max_turns = 65", "`tasks[0].max_turns` = 65: it must be between 1 and 64"),
            ("pass_reward = inf", "`tasks[0].pass_reward` = inf: it must be a finite number"),
            ("sampling = { temperature = 3.0 }", "`tasks[0].sampling.temperature` = 3: it must be from 0 to 2"),
        ] {
            refused(&format!("{ARITHMETIC}{lines}\n"), "", says);
        }
        let deadline = ARITHMETIC.replace("builtin:arithmetic\"", "builtin:arithmetic\", deadline_ms = 0");
        refused(&deadline, "", "`tasks[0].environment.deadline_ms` = 0: it must be between 1 and 3600000");
        let memory = ARITHMETIC.replace("builtin:arithmetic\"", "builtin:arithmetic\", memory_mib = 999999");
        refused(&memory, "", "`tasks[0].environment.memory_mib` = 999999: it must be between 1 and 4096");
        let lagged = ARITHMETIC.to_string() + "max_turns = 2\n";
        refused(&lagged, "[grpo]\ngeneration_lag = 1", "`grpo.generation_lag` = 1 samples single-turn tasks only");
    }
}
