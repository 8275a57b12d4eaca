//! Hot swap: a new task set is checked beside training — the config as a whole, every plugin
//! loaded (the right world and WIT version, no capability its version in force lacked), an
//! environment asked for tasks, a new reward re-scoring the last steps' rollouts — and
//! staged; the trainer switches to it at the next step boundary, so a group never mixes
//! versions. The set it replaced stays loaded: a new version whose first trajectories fail
//! too often is rolled back, and its bytes wait out a growing back-off before they may be
//! applied again. Every apply, refusal and rollback is a line of `events.jsonl`.

use crate::config::{RunConfig, TaskSet, TrainConfig};
use crate::manifest::{Manifest, PluginStore};
use crate::tasks::{LoadedTask, load_tasks};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wirl_engine::Tokenizer;
use wirl_rollout::TaskSource;
use wirl_sandbox::{Sandbox, Task};

/// How to apply a task set.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ApplyOptions {
    /// Check and report, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Let replaced plugins import interfaces their versions in force did not.
    #[serde(default)]
    pub allow_new_capabilities: bool,
    /// Where the task set came from (a file), for messages.
    #[serde(default)]
    pub origin: String,
    /// `apply` or `watch` (the plugin files changed on disk).
    #[serde(default)]
    pub reason: String,
}

/// What a new task set changes, and how its checks went.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// The generation it would become.
    pub generation: u64,
    /// One line per change: task added or removed, weight changed, plugin replaced, settings
    /// changed.
    pub changes: Vec<String>,
    /// Per task whose plugins are new: what was checked.
    pub checks: Vec<Check>,
    /// Failed calls over all calls of the checks.
    pub failure_rate: f64,
    pub dry_run: bool,
}

/// The checks of one task.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Check {
    pub task: String,
    /// `tasks` (an environment asked for the next tasks) or `rescore` (recent rollouts
    /// re-scored by the new rewards).
    pub kind: String,
    pub calls: usize,
    pub failed: usize,
    /// Failures by kind (`trap`, `deadline`, …).
    pub failures: BTreeMap<String, usize>,
    /// `rescore`: the recorded rewards' mean and the new ones' (over the calls that did not
    /// fail), and how many completions went from pass to fail and back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward_mean_old: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward_mean_new: Option<f32>,
    pub flips_to_pass: usize,
    pub flips_to_fail: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A refused swap: why, and the report when it got as far as the checks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Refusal {
    pub message: String,
    pub report: Option<Report>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A line of `events.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SwapEvent {
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// Steps done when it happened.
    pub step: usize,
    /// `staged`, `applied`, `refused`, `discarded`, `rolled-back`, `paused`, `resumed`, `stop`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
    /// How long the switch held the trainer, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch_ms: Option<f64>,
}

impl SwapEvent {
    pub fn new(step: usize, kind: &str) -> Self {
        let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        SwapEvent {
            time,
            step,
            kind: kind.to_string(),
            generation: None,
            reason: None,
            changes: Vec::new(),
            report: None,
            switch_ms: None,
        }
    }
}

/// Read `events.jsonl` (none: empty).
pub fn read_events(run_dir: &Path) -> crate::error::Result<Vec<SwapEvent>> {
    let path = run_dir.join("events.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| crate::error::invalid!("{} line {}: not an event ({e})", path.display(), i + 1))
        })
        .collect()
}

/// A task set ready to replace the running one.
pub(crate) struct Staged {
    pub manifest: Manifest,
    pub run: RunConfig,
    pub tasks: Vec<LoadedTask>,
    pub allocation: Vec<usize>,
    pub changes: Vec<String>,
    /// The tasks that are new or whose plugins, source or settings changed: on probation.
    pub changed_tasks: BTreeSet<String>,
    pub report: Option<Report>,
}

/// A group of a recent step, kept for a new reward to re-score.
pub(crate) struct RecentGroup {
    pub step: usize,
    pub task: Task,
    pub completions: Vec<String>,
    /// The recorded rewards, `None` where scoring failed.
    pub rewards: Vec<Option<f32>>,
}

/// A version on probation: its first trajectories decide whether it stays.
struct Probation {
    generation: u64,
    /// The tasks whose plugins changed.
    tasks: BTreeSet<String>,
    /// Its new plugins' sha256, which a rollback puts on back-off.
    new_plugins: Vec<String>,
    seen: usize,
    failed: usize,
    failures: BTreeMap<String, usize>,
}

/// Bytes that were rolled back: when they may come again.
struct Backoff {
    until: Instant,
    rollbacks: u32,
}

/// What a swap needs to know of the run, shared by the trainer and the callers of
/// [`crate::Control`].
pub(crate) struct Swapper {
    pub base: TrainConfig,
    pub run_dir: PathBuf,
    pub store: PluginStore,
    sandbox: Sandbox,
    tokenizer: Arc<Tokenizer>,
    state: Mutex<SwapState>,
    events: Mutex<()>,
    /// Held while an apply is checked: applies are answered one at a time, so two cannot
    /// both be told "staged" when only one can be.
    applying: Mutex<()>,
}

pub(crate) struct SwapState {
    pub current: Manifest,
    /// The manifest a rollback goes back to.
    pub previous: Option<Manifest>,
    next_generation: u64,
    /// Imports of every plugin version loaded in this run, by sha256.
    imports: BTreeMap<String, Vec<String>>,
    pub staged: Option<Staged>,
    pub rollback: Option<String>,
    backoff: BTreeMap<String, Backoff>,
    probation: Option<Probation>,
    recent: BTreeMap<String, VecDeque<RecentGroup>>,
    /// A resumed run replaying the swaps recorded after its checkpoint, until this step.
    pub replaying_until: Option<usize>,
    /// The generation being switched in: taken off `staged`, not yet in `current`. An apply
    /// then would be checked against the set going out and given its generation number. Set
    /// and cleared by the step boundary only.
    pub switching: Option<u64>,
    pub status: RunStatus,
}

/// Where a run stands, as `wirl ctl status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunStatus {
    pub run_dir: PathBuf,
    /// Steps done, of `steps`.
    pub step: usize,
    pub steps: usize,
    pub paused: bool,
    /// Paused and waiting between steps now (no step in progress).
    pub held: bool,
    pub stopping: bool,
    /// The manifest in force.
    pub manifest: Option<Manifest>,
    /// The changes of a task set staged for the next step boundary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub staged: Vec<String>,
    /// Whether a rollback target is kept warm.
    pub can_roll_back: bool,
    /// The last step's figures per task.
    pub tasks: BTreeMap<String, crate::metrics::TaskMetrics>,
    pub reward_mean: f32,
    pub pass_rate: f32,
    /// Bytes on back-off after a rollback: sha256 → seconds left.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backoff_s: BTreeMap<String, f64>,
}

impl Swapper {
    pub fn new(
        base: TrainConfig,
        run_dir: &Path,
        sandbox: Sandbox,
        tokenizer: Arc<Tokenizer>,
        current: Manifest,
        next_generation: u64,
        loaded: &[LoadedTask],
    ) -> Self {
        let mut imports = BTreeMap::new();
        for plugin in loaded.iter().flat_map(LoadedTask::plugins) {
            imports.insert(plugin.sha256().to_string(), plugin.imports().to_vec());
        }
        let status = RunStatus {
            run_dir: run_dir.to_path_buf(),
            steps: base.grpo.steps,
            manifest: Some(current.clone()),
            ..Default::default()
        };
        Swapper {
            store: PluginStore::new(run_dir),
            run_dir: run_dir.to_path_buf(),
            base,
            sandbox,
            tokenizer,
            state: Mutex::new(SwapState {
                current,
                previous: None,
                next_generation,
                imports,
                staged: None,
                rollback: None,
                backoff: BTreeMap::new(),
                probation: None,
                recent: BTreeMap::new(),
                replaying_until: None,
                switching: None,
                status,
            }),
            events: Mutex::new(()),
            applying: Mutex::new(()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, SwapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append an event to `events.jsonl`.
    pub fn record(&self, event: &SwapEvent) {
        let _serial = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.run_dir.join("events.jsonl"))
            .and_then(|mut file| writeln!(file, "{}", serde_json::to_string(event).unwrap_or_default()));
        if let Err(error) = written {
            tracing::warn!("cannot write {}: {error}", self.run_dir.join("events.jsonl").display());
        }
    }

    /// Where the run stands.
    pub fn status(&self) -> RunStatus {
        let state = self.state();
        let mut status = state.status.clone();
        status.manifest = Some(state.current.clone());
        status.staged = state.staged.as_ref().map(|s| s.changes.clone()).unwrap_or_default();
        status.can_roll_back = state.previous.is_some();
        let now = Instant::now();
        status.backoff_s = state
            .backoff
            .iter()
            .filter(|(_, b)| b.until > now)
            .map(|(sha, b)| (sha.clone(), (b.until - now).as_secs_f64()))
            .collect();
        status
    }

    /// Check `set` and stage it for the next step boundary (or, dry, only report).
    pub fn apply(&self, set: TaskSet, options: &ApplyOptions) -> Result<Report, Refusal> {
        let step = self.state().status.step;
        let Ok(_one_at_a_time) = self.applying.try_lock() else {
            return Err(Refusal {
                message: "another apply is being checked now: try again once it has been answered \
                          (`wirl ctl RUN_DIR status` shows what is staged)"
                    .into(),
                report: None,
            });
        };
        let result = self.check_and_stage(set, options);
        if let Err(refusal) = &result
            && !options.dry_run
        {
            let mut event = SwapEvent::new(step, "refused");
            event.reason = Some(refusal.message.clone());
            event.report = refusal.report.clone();
            self.record(&event);
        }
        result
    }

    /// Check a task set against the one in force, load it, check what it calls, and (not
    /// for a dry run) stage it: its report, or why it is refused.
    fn check_and_stage(&self, set: TaskSet, options: &ApplyOptions) -> Result<Report, Refusal> {
        let origin = if options.origin.is_empty() { "the task set".to_string() } else { options.origin.clone() };
        let config =
            self.base.with_task_set(set, &origin, Path::new("/")).map_err(|e| refuse(wirl_engine::error_chain(&e)))?;
        let set = config.task_set();
        let now = self.read_plugins(&set, options, &origin)?;
        let Against { changes, changed_tasks, changed_sources, current, generation } =
            self.against_current(&set, &now, options, &origin)?;

        // Load: from the files for a dry run, from kept bytes otherwise (the run then never
        // depends on the files again).
        let mut run = config.run_config().map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?;
        let allocation =
            run.allocation().map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?.groups;
        let manifest = if options.dry_run {
            None
        } else {
            let manifest = Manifest {
                generation,
                from_step: 0,
                reason: options.reason.clone(),
                tasks: set.clone(),
                plugins: now.clone(),
                datasets: crate::manifest::fingerprint_datasets(&set)
                    .map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?,
                models: crate::manifest::fingerprint_models(&set)
                    .map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?,
            };
            manifest.pin(&mut run, &self.store).map_err(|e| refuse(wirl_engine::error_chain(&e)))?;
            Some(manifest)
        };
        let mut tasks = load_tasks(&self.sandbox, &run, &allocation, &self.tokenizer)
            .map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?;
        if !(options.allow_new_capabilities || self.base.swap.allow_new_capabilities) {
            self.no_new_capabilities(&tasks, &current)?;
        }

        let mut report =
            self.run_checks(&mut tasks, &changed_tasks, &changed_sources, &allocation, generation, options.dry_run);
        report.changes = changes.clone();
        if report.failure_rate > self.base.swap.max_failure_rate {
            return Err(self.failed_validation(&origin, report));
        }
        if let Some(manifest) = manifest {
            let mut state = self.state();
            // What was checked against must still be in force: a rollback (or a switch) while
            // this apply was checked takes that generation number and changes the set.
            if state.current.generation != current.generation || state.next_generation != generation {
                return Err(refuse(format!(
                    "{origin}: the task set in force changed while it was checked (now generation {}): apply it \
                     again to check it against that one",
                    state.current.generation
                )));
            }
            for plugin in tasks.iter().flat_map(LoadedTask::plugins) {
                state.imports.insert(plugin.sha256().to_string(), plugin.imports().to_vec());
            }
            let report = Some(report.clone());
            let mut event = SwapEvent::new(state.status.step, "staged");
            (event.generation, event.changes) = (Some(manifest.generation), changes.clone());
            state.staged = Some(Staged { manifest, run, tasks, allocation, changes, changed_tasks, report });
            drop(state);
            // Recorded, so that a run killed before the switch can say on resume what it lost.
            self.record(&event);
        }
        Ok(report)
    }

    /// The set's plugin bytes as they are now, by reference, read once: hashed, and (not for
    /// a dry run) kept, so that what is checked and switched in is exactly what was read.
    fn read_plugins(
        &self,
        set: &TaskSet,
        options: &ApplyOptions,
        origin: &str,
    ) -> Result<BTreeMap<String, String>, Refusal> {
        let mut now = BTreeMap::new();
        for reference in crate::manifest::references(set) {
            let bytes = PluginStore::read(&reference)
                .map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?;
            let sha256 = if options.dry_run {
                hex::encode(Sha256::digest(&bytes))
            } else {
                self.store.put(&bytes).map_err(|e| refuse(format!("{origin}: {}", wirl_engine::error_chain(&e))))?
            };
            now.insert(reference.display().to_string(), sha256);
        }
        Ok(now)
    }

    /// The set against the one in force: refused while another change is staged or switching
    /// in, while a resumed run replays, when nothing changes, or when a plugin version rolled
    /// back is still backing off.
    fn against_current(
        &self,
        set: &TaskSet,
        now: &BTreeMap<String, String>,
        options: &ApplyOptions,
        origin: &str,
    ) -> Result<Against, Refusal> {
        let state = self.state();
        if let (Some(staged), false) = (&state.staged, options.dry_run) {
            return Err(refuse(format!(
                "generation {} is staged and switches in at the next step boundary; one change is staged at a \
                 time: apply {origin} after that boundary (`wirl ctl RUN_DIR status` shows it), or roll back",
                staged.manifest.generation
            )));
        }
        if let (Some(switching), false) = (state.switching, options.dry_run) {
            return Err(refuse(format!(
                "generation {switching} is being switched in at this step boundary: apply {origin} again in a moment"
            )));
        }
        if let Some(until) = state.replaying_until {
            return Err(refuse(format!(
                "the resumed run is replaying the task set changes recorded after its checkpoint (until step \
                 {until}); apply after that step"
            )));
        }
        let changes = describe_changes(&state.current, set, now);
        if changes.is_empty() {
            return Err(refuse(format!(
                "{origin}: nothing to change: the tasks and every plugin's bytes are those in force (generation {})",
                state.current.generation
            )));
        }
        let instant = Instant::now();
        for (reference, sha256) in now {
            if state.current.plugins.get(reference) == Some(sha256) {
                continue;
            }
            if let Some(backoff) = state.backoff.get(sha256).filter(|b| b.until > instant) {
                return Err(refuse(format!(
                    "{reference} (sha256 {}) was rolled back {} time(s); it may be applied again in {:.0} s",
                    &sha256[..12],
                    backoff.rollbacks,
                    (backoff.until - instant).as_secs_f64().ceil()
                )));
            }
        }
        Ok(Against {
            changes,
            changed_tasks: changed_tasks(&state.current, set, now),
            changed_sources: sources_changed(&state.current, set, now),
            current: state.current.clone(),
            generation: state.next_generation,
        })
    }

    /// No capability beyond the version in force (by reference): a plugin whose new version
    /// imports more is refused.
    fn no_new_capabilities(&self, tasks: &[LoadedTask], current: &Manifest) -> Result<(), Refusal> {
        let state = self.state();
        for task in tasks {
            for plugin in task.plugins() {
                // A loaded plugin is shown by its reference (the path as written).
                let reference = plugin.path().display().to_string();
                let Some(old_sha) = current.plugins.get(&reference) else { continue };
                let Some(old_imports) = state.imports.get(old_sha) else { continue };
                let new: Vec<&String> = plugin.imports().iter().filter(|i| !old_imports.contains(i)).collect();
                if !new.is_empty() {
                    return Err(refuse(format!(
                        "{reference}: the new version (sha256 {}) imports {} that the version in force (sha256 {}) \
                         does not; allow it with `--allow-capabilities` (or swap.allow_new_capabilities) if it \
                         should",
                        &plugin.sha256()[..12],
                        new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                        &old_sha[..12]
                    )));
                }
            }
        }
        Ok(())
    }

    /// A report over `swap.max_failure_rate`, refused with its failing checks named.
    fn failed_validation(&self, origin: &str, report: Report) -> Refusal {
        let worst = report
            .checks
            .iter()
            .filter(|c| c.failed > 0)
            .map(|c| {
                let kinds: Vec<String> = c.failures.iter().map(|(k, n)| format!("{n} {k}")).collect();
                format!("task `{}` {}: {} of {} calls failed ({})", c.task, c.kind, c.failed, c.calls, kinds.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ");
        Refusal {
            message: format!(
                "{origin}: validation failed: {:.0}% of its checks failed, over swap.max_failure_rate = {:.0}%: \
                 {worst}",
                report.failure_rate * 100.0,
                self.base.swap.max_failure_rate * 100.0
            ),
            report: Some(report),
        }
    }

    /// The run ends before its next step boundary: a staged change that will never be in
    /// force is recorded as discarded (`events.jsonl`), so that no "staged" goes unanswered.
    pub fn discard_staged(&self, step: usize, why: &str) {
        let staged = self.state().staged.take();
        if let Some(staged) = staged {
            let mut event = SwapEvent::new(step, "discarded");
            event.generation = Some(staged.manifest.generation);
            event.reason = Some(format!("generation {} was staged, but {why}", staged.manifest.generation));
            self.record(&event);
        }
    }

    /// On resume: a generation the run staged but neither switched in nor discarded (it was
    /// killed before its next step boundary) is not in force; recorded as discarded, and
    /// said, so that a "staged" answer is never silently lost. Its generation number, if any.
    pub fn discard_lost(&self, step: usize) -> crate::error::Result<Option<u64>> {
        // A kill can cut the file's last line: that must not stop the resume.
        let events = match read_events(&self.run_dir) {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!("{error}: a task set staged before the stop cannot be looked for there");
                return Ok(None);
            }
        };
        let answered = |generation: u64, after: usize| {
            events[after..]
                .iter()
                .any(|e| e.generation == Some(generation) && (e.kind == "applied" || e.kind == "discarded"))
        };
        let lost = events
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| e.kind == "staged")
            .and_then(|(i, e)| e.generation.filter(|&g| !answered(g, i + 1)));
        if let Some(generation) = lost {
            let mut event = SwapEvent::new(step, "discarded");
            event.generation = Some(generation);
            event.reason = Some(format!(
                "generation {generation} was staged, but the run ended (killed) before its next step boundary: it is \
                 not in force; apply it again"
            ));
            self.record(&event);
        }
        Ok(lost)
    }

    /// Ask new environments for tasks and let new rewards re-score the recent rollouts.
    fn run_checks(
        &self,
        tasks: &mut [LoadedTask],
        changed: &BTreeSet<String>,
        sources: &BTreeSet<String>,
        allocation: &[usize],
        generation: u64,
        dry_run: bool,
    ) -> Report {
        let mut checks = Vec::new();
        let step = self.state().status.step;
        for (t, task) in tasks.iter_mut().enumerate() {
            if !changed.contains(&task.spec.name) {
                continue;
            }
            let name = task.spec.name.clone();
            if let (true, TaskSource::Environment { plugin, seed }) = (sources.contains(&name), &mut task.source) {
                // The tasks it would give next (at least 4).
                let groups = allocation[t].max(1) as u64;
                let first = (step as u64 + 1) * groups;
                checks.push(ask_for_tasks(&name, plugin, *seed, first..first + groups.max(4)));
            }
            if task.spec.max_turns > 1 || task.spec.rewards.is_empty() {
                continue;
            }
            checks.push(self.rescore(task));
        }
        let calls: usize = checks.iter().map(|c| c.calls).sum();
        let failed: usize = checks.iter().map(|c| c.failed).sum();
        Report {
            generation,
            changes: Vec::new(),
            checks,
            failure_rate: if calls == 0 { 0.0 } else { failed as f64 / calls as f64 },
            dry_run,
        }
    }

    /// Re-score the task's recent rollouts with its new rewards: failures, and how the
    /// verdicts move against those recorded.
    fn rescore(&self, task: &mut LoadedTask) -> Check {
        let name = task.spec.name.clone();
        let recent: Vec<(Task, Vec<String>, Vec<Option<f32>>)> = self
            .state()
            .recent
            .get(&name)
            .map(|groups| groups.iter().map(|g| (g.task.clone(), g.completions.clone(), g.rewards.clone())).collect())
            .unwrap_or_default();
        let mut check = Check { task: name, kind: "rescore".into(), ..Default::default() };
        if recent.is_empty() {
            check.note = Some("no recent rollouts of this task to re-score".into());
        }
        let (mut old_sum, mut new_sum, mut both) = (0f32, 0f32, 0usize);
        let pass = task.spec.pass_reward;
        for (problem, completions, old) in recent {
            // A trial of the staged set, not a training step's scoring.
            let progress = wirl_sandbox::Progress::OUTSIDE_TRAINING;
            let scored = task.scorers.score_group(&problem, &completions, task.spec.failures, progress);
            for (new, old) in scored.iter().zip(old) {
                check.calls += 1;
                if !new.failures.is_empty() {
                    check.failed += 1;
                    for kind in &new.failures {
                        *check.failures.entry(kind.clone()).or_default() += 1;
                    }
                    continue;
                }
                let Some(old) = old else { continue };
                old_sum += old;
                new_sum += new.reward;
                both += 1;
                match (old >= pass, new.reward >= pass) {
                    (false, true) => check.flips_to_pass += 1,
                    (true, false) => check.flips_to_fail += 1,
                    _ => {}
                }
            }
        }
        if both > 0 {
            check.reward_mean_old = Some(old_sum / both as f32);
            check.reward_mean_new = Some(new_sum / both as f32);
        }
        check
    }

    /// Keep a step's groups for re-scoring (the last `swap.rescore_steps` steps of each task).
    pub fn remember(&self, step: usize, groups: Vec<(String, RecentGroup)>) {
        let keep = self.base.swap.rescore_steps;
        let mut state = self.state();
        for (task, group) in groups {
            let recent = state.recent.entry(task).or_default();
            recent.push_back(group);
            while recent.front().is_some_and(|g| g.step + keep <= step) {
                recent.pop_front();
            }
        }
    }

    /// A switch to `manifest` happened: it is in force, `previous` is the rollback target.
    pub fn switched(
        &self,
        manifest: &Manifest,
        previous: Option<Manifest>,
        probation: Option<(BTreeSet<String>, Vec<String>)>,
    ) {
        let mut state = self.state();
        state.next_generation = state.next_generation.max(manifest.generation + 1);
        state.current = manifest.clone();
        state.previous = previous;
        state.probation = probation.map(|(tasks, new_plugins)| Probation {
            generation: manifest.generation,
            tasks,
            new_plugins,
            seen: 0,
            failed: 0,
            failures: BTreeMap::new(),
        });
        // Other tasks' recent groups stay; a changed task's were scored by the old version.
        let changed: Vec<String> =
            state.probation.as_ref().map(|p| p.tasks.iter().cloned().collect()).unwrap_or_default();
        for task in changed {
            state.recent.remove(&task);
        }
    }

    /// A new generation number, for a rollback.
    pub fn take_generation(&self) -> u64 {
        let mut state = self.state();
        let generation = state.next_generation;
        state.next_generation += 1;
        generation
    }

    /// After a step: count a version on probation's trajectories; the reason to roll it
    /// back, when its failures cross `swap.rollback_failure_rate` over its first
    /// `swap.rollback_window` trajectories.
    pub fn watch_probation(&self, outcomes: &[(String, bool, Vec<String>)]) -> Option<String> {
        let window = self.base.swap.rollback_window;
        let threshold = self.base.swap.rollback_failure_rate;
        let mut state = self.state();
        let probation = state.probation.as_mut()?;
        for (task, failed, kinds) in outcomes {
            if !probation.tasks.contains(task) || probation.seen >= window {
                continue;
            }
            probation.seen += 1;
            if *failed {
                probation.failed += 1;
                for kind in kinds {
                    *probation.failures.entry(kind.clone()).or_default() += 1;
                }
            }
        }
        let over = probation.failed as f64 > threshold * window as f64;
        if !over && probation.seen < window {
            return None;
        }
        let probation = state.probation.take().expect("on probation");
        if !over {
            return None;
        }
        let kinds: Vec<String> = probation.failures.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let reason = format!(
            "auto-rollback: generation {} failed {} of its first {} trajectories ({}), over \
             swap.rollback_failure_rate = {:.0}%",
            probation.generation,
            probation.failed,
            probation.seen,
            kinds.join(", "),
            threshold * 100.0
        );
        let backoff_s = self.base.swap.backoff_s;
        let until = Instant::now();
        for sha in probation.new_plugins {
            let entry = state.backoff.entry(sha).or_insert(Backoff { until, rollbacks: 0 });
            entry.rollbacks += 1;
            let seconds = backoff_s * f64::from(1u32 << (entry.rollbacks - 1).min(16));
            entry.until = until + Duration::from_secs_f64(seconds);
        }
        Some(reason)
    }
}

/// Tasks whose plugins (by bytes), source or scoring differ from those in force, or that are
/// new: the ones a new version's checks and probation cover.
fn changed_tasks(current: &Manifest, set: &TaskSet, now: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut changed = BTreeSet::new();
    let single = |task: &crate::config::TaskSection, tasks: &TaskSet| TaskSet {
        tasks: vec![crate::config::TaskSection { weight: 1.0, ..task.clone() }],
        rewards: if task.rewards.is_empty() { tasks.rewards.clone() } else { Vec::new() },
    };
    for task in &set.tasks {
        let Some(old) = current.tasks.tasks.iter().find(|t| t.name == task.name) else {
            changed.insert(task.name.clone());
            continue;
        };
        let (old_set, new_set) = (single(old, &current.tasks), single(task, set));
        let bytes_changed = crate::manifest::references(&new_set).iter().any(|r| {
            let key = r.display().to_string();
            now.get(&key) != current.plugins.get(&key)
        });
        if old_set != new_set || bytes_changed {
            changed.insert(task.name.clone());
        }
    }
    changed
}

/// Tasks that are new or whose source (environment, dataset or agent: section or bytes)
/// changed: the ones whose environment is asked for tasks.
fn sources_changed(current: &Manifest, set: &TaskSet, now: &BTreeMap<String, String>) -> BTreeSet<String> {
    let plugin_bytes = |task: &crate::config::TaskSection, plugins: &BTreeMap<String, String>| {
        let reference = task.environment.as_ref().map(|e| &e.plugin).or(task.agent.as_ref().map(|a| &a.plugin));
        reference.and_then(|r| plugins.get(&r.display().to_string()).cloned())
    };
    set.tasks
        .iter()
        .filter(|task| match current.tasks.tasks.iter().find(|t| t.name == task.name) {
            None => true,
            Some(old) => {
                old.environment != task.environment
                    || old.dataset != task.dataset
                    || old.agent != task.agent
                    || plugin_bytes(old, &current.plugins) != plugin_bytes(task, now)
            }
        })
        .map(|task| task.name.clone())
        .collect()
}

/// One line per change from `current` to `set` (plugins compared by bytes).
fn describe_changes(current: &Manifest, set: &TaskSet, now: &BTreeMap<String, String>) -> Vec<String> {
    let mut lines = Vec::new();
    let old_names: Vec<&str> = current.tasks.tasks.iter().map(|t| t.name.as_str()).collect();
    let new_names: Vec<&str> = set.tasks.iter().map(|t| t.name.as_str()).collect();
    for task in &set.tasks {
        let Some(old) = current.tasks.tasks.iter().find(|t| t.name == task.name) else {
            lines.push(format!("task `{}` added (weight {})", task.name, task.weight));
            continue;
        };
        if old.weight != task.weight || old.eval_only != task.eval_only {
            lines.push(format!(
                "task `{}`: weight {}{} -> {}{}",
                task.name,
                old.weight,
                if old.eval_only { " (eval only)" } else { "" },
                task.weight,
                if task.eval_only { " (eval only)" } else { "" }
            ));
        }
        let rest =
            |t: &crate::config::TaskSection| crate::config::TaskSection { weight: 0.0, eval_only: false, ..t.clone() };
        if rest(old) != rest(task) {
            lines.push(format!("task `{}`: its source, rewards or settings changed", task.name));
        }
    }
    for name in old_names.iter().filter(|n| !new_names.contains(n)) {
        lines.push(format!("task `{name}` removed"));
    }
    if current.tasks.rewards != set.rewards {
        lines.push("the shared [[rewards]] changed".into());
    }
    for (reference, sha256) in now {
        match current.plugins.get(reference) {
            Some(old) if old != sha256 => {
                lines.push(format!("{reference}: replaced (sha256 {} -> {})", &old[..12], &sha256[..12]))
            }
            None => lines.push(format!("{reference}: new plugin (sha256 {})", &sha256[..12])),
            _ => {}
        }
    }
    lines
}

/// A refusal with no report.
fn refuse(message: String) -> Refusal {
    Refusal { message, report: None }
}

/// An apply's task set against the one in force: what changes, which tasks (and which of
/// their sources) changed, the set it was checked against and the generation it would be.
struct Against {
    changes: Vec<String>,
    changed_tasks: BTreeSet<String>,
    changed_sources: BTreeSet<String>,
    current: Manifest,
    generation: u64,
}

/// Ask a new environment for the tasks it would give next.
fn ask_for_tasks(
    task: &str,
    plugin: &mut wirl_sandbox::EnvironmentPlugin,
    seed: u64,
    indices: std::ops::Range<u64>,
) -> Check {
    let mut check = Check { task: task.to_string(), kind: "tasks".into(), ..Default::default() };
    for index in indices {
        check.calls += 1;
        if let Err(failure) = plugin.task_at(seed, index) {
            check.failed += 1;
            *check.failures.entry(failure.kind.name().to_string()).or_default() += 1;
            check.note.get_or_insert_with(|| format!("task {index}: {failure}"));
        }
    }
    check
}
