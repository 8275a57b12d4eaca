//! Hot swap at the step boundary, as the task set in force (`LiveTasks`) takes it: the
//! trainer says where a boundary is (`Trainer::at_boundary`) and hands over each step's
//! groups (`after_step`); what is staged, rolled back, replayed on resume or followed from
//! rank 0 is switched in here, between steps, and a set on probation is judged here.

use super::{LiveTasks, Previous};
use crate::config::TaskSpec;
use crate::control::Control;
use crate::error::{Context, bail};
use crate::manifest::Manifest;
use crate::observer::{Event, Observer};
use crate::swap::{RecentGroup, Staged, SwapEvent};
use crate::tasks::load_tasks;
use std::path::Path;
use std::time::Instant;
use wirl_engine::{Comm, Tokenizer};
use wirl_rollout::RolloutGroup;

/// What a switch at the boundary reads and writes outside the task set: the run's task specs
/// (swapped with the tasks), where manifests go, whether this rank writes the run's files,
/// the tokenizer tasks load with, and the observer told of each switch.
pub(super) struct AtBoundary<'a> {
    pub specs: &'a mut Vec<TaskSpec>,
    pub run_dir: &'a Path,
    pub writes: bool,
    pub tokenizer: &'a Tokenizer,
    pub observer: &'a mut dyn Observer,
}

impl LiveTasks {
    /// `(name, sha256)` of every task's environment and reward plugins, each once.
    pub(super) fn plugin_hashes(&self) -> Vec<(String, String)> {
        let mut hashes: Vec<(String, String)> = Vec::new();
        for hash in self.tasks.iter().flat_map(crate::tasks::plugin_hashes) {
            let pair = (hash.name, hash.sha256);
            if !hashes.contains(&pair) {
                hashes.push(pair);
            }
        }
        hashes
    }

    /// With ranks, at each step boundary: rank 0's task set in force on every rank — a
    /// manifest that rank 0 switched to (a swap, a rollback) loaded and switched in by the
    /// others at the same boundary, from the plugin bytes rank 0 keeps in the run directory;
    /// then every rank's plugins checked against rank 0's.
    pub(super) fn follow(
        &mut self,
        step: usize,
        ranks: &dyn Comm,
        at: &mut AtBoundary<'_>,
    ) -> crate::error::Result<()> {
        if ranks.size() == 1 {
            return Ok(());
        }
        let mine = if at.writes { serde_json::to_vec(&(&self.manifest, self.plugin_hashes()))? } else { Vec::new() };
        let all = wirl_engine::all_gather_bytes(ranks, &mine)?;
        if at.writes {
            return Ok(());
        }
        let (manifest, plugins): (Manifest, Vec<(String, String)>) = serde_json::from_slice(&all[0])?;
        if manifest.generation != self.manifest.generation {
            let generation = manifest.generation;
            let staged = self.stage(manifest, at.tokenizer).with_context(|| format!("rank {}", ranks.rank()))?;
            self.switch(step, staged, false, at)?;
            tracing::debug!("rank {} switched to manifest generation {generation} at step {}", ranks.rank(), step + 1);
        }
        if self.plugin_hashes() != plugins {
            bail!(
                "rank {} runs other plugins than rank 0 at step {} (by sha256: {:?} against {plugins:?})",
                ranks.rank(),
                step + 1,
                self.plugin_hashes()
            );
        }
        Ok(())
    }

    /// Between steps: switch in a resumed run's later generations at their steps, a staged
    /// task set or a rollback; wait while paused. Whether the run was stopped meanwhile.
    pub(super) fn boundary(
        &mut self,
        step: usize,
        control: &Control,
        at: &mut AtBoundary<'_>,
    ) -> crate::error::Result<bool> {
        loop {
            while self.scheduled.front().is_some_and(|m| m.from_step <= step) {
                let manifest = self.scheduled.pop_front().expect("just looked");
                let staged = self.stage(manifest, at.tokenizer)?;
                self.switch(step, staged, false, at)?;
            }
            // A rollback first; a set staged meanwhile waits for the next boundary.
            let rollback = self.swapper.state().rollback.take();
            if let Some(reason) = rollback {
                self.roll_back(step, &reason, at)?;
            } else {
                // Taken and marked as switching in one hold of the lock: no apply sees it
                // neither staged nor in force.
                let staged = {
                    let mut state = self.swapper.state();
                    let staged = state.staged.take();
                    state.switching = staged.as_ref().map(|s| s.manifest.generation);
                    staged
                };
                if let Some(staged) = staged {
                    let switched = self.switch(step, staged, true, at);
                    self.swapper.state().switching = None;
                    switched?;
                }
            }
            self.swapper.state().replaying_until = self.scheduled.back().map(|m| m.from_step);
            let (stopped, paused) = (control.is_stopped(), control.is_paused());
            self.swapper.state().status.held = paused && !stopped;
            if stopped {
                return Ok(true);
            }
            if !paused {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A manifest of this run, loaded from its kept bytes.
    fn stage(&self, manifest: Manifest, tokenizer: &Tokenizer) -> crate::error::Result<Staged> {
        let mut run = self.swapper.base.with_manifest_tasks(&manifest.tasks)?.run_config()?;
        manifest.pin(&mut run, &self.swapper.store)?;
        manifest.check_inputs()?;
        let allocation = run.allocation()?.groups;
        let tasks = load_tasks(&self.sandbox, &run, &allocation, tokenizer)
            .with_context(|| format!("manifest generation {}", manifest.generation))?;
        Ok(Staged {
            manifest,
            run,
            tasks,
            allocation,
            changes: Vec::new(),
            changed_tasks: Default::default(),
            report: None,
        })
    }

    /// Put `staged` in force from step `step + 1`; the set it replaces stays loaded. A new
    /// version goes on probation (`on_probation`; not for a resumed run's replays, whose
    /// rollbacks are generations of their own).
    fn switch(
        &mut self,
        step: usize,
        staged: Staged,
        on_probation: bool,
        at: &mut AtBoundary<'_>,
    ) -> crate::error::Result<()> {
        let started = Instant::now();
        let Staged { mut manifest, run, tasks, allocation, changes, changed_tasks: changed, report } = staged;
        manifest.from_step = step;
        let old_tasks = std::mem::replace(&mut self.tasks, tasks);
        let old_allocation = std::mem::replace(&mut self.allocation, allocation);
        let old_specs = std::mem::replace(at.specs, run.tasks);
        let old_manifest = std::mem::replace(&mut self.manifest, manifest.clone());
        let switch_ms = started.elapsed().as_secs_f64() * 1e3;
        // On probation: the changed tasks, and the new bytes, which a rollback puts on back-off.
        let old_shas: std::collections::BTreeSet<&String> = old_manifest.plugins.values().collect();
        let new_plugins: Vec<String> =
            manifest.plugins.values().filter(|sha| !old_shas.contains(sha)).cloned().collect();
        let probation = (on_probation && !changed.is_empty()).then_some((changed, new_plugins));
        // The status says the new set is in force before the manifest is written: taken off
        // `staged` already, it would otherwise be neither staged nor in force for a write's
        // time (a client reading the status then saw the swap vanish).
        self.swapper.switched(&manifest, Some(old_manifest.clone()), probation);
        if at.writes {
            manifest.write(at.run_dir)?;
        }
        self.previous =
            Some(Previous { manifest: old_manifest, specs: old_specs, tasks: old_tasks, allocation: old_allocation });
        let mut event = SwapEvent::new(step, "applied");
        event.generation = Some(manifest.generation);
        event.reason = Some(if on_probation {
            manifest.reason.clone()
        } else {
            format!("{} (replayed on resume)", manifest.reason)
        });
        event.changes = changes;
        event.report = report;
        event.switch_ms = Some(switch_ms);
        self.announce(&event, at);
        Ok(())
    }

    /// Record a switch in `events.jsonl` and tell the observer.
    fn announce(&self, event: &SwapEvent, at: &mut AtBoundary<'_>) {
        if !at.writes {
            return;
        }
        self.swapper.record(event);
        at.observer.event(Event::Swap {
            step: event.step,
            kind: &event.kind,
            generation: event.generation.unwrap_or_default(),
            changes: &event.changes,
            reason: event.reason.as_deref(),
            switch_ms: event.switch_ms.unwrap_or_default(),
        });
    }

    /// Put the task set before the last switch back in force (a new generation), from its
    /// loaded plugins.
    fn roll_back(&mut self, step: usize, reason: &str, at: &mut AtBoundary<'_>) -> crate::error::Result<()> {
        let Some(previous) = self.previous.take() else {
            tracing::warn!("a rollback was asked for, but no earlier task set is kept; nothing changed");
            return Ok(());
        };
        let started = Instant::now();
        let generation = self.swapper.take_generation();
        let kind = if reason.starts_with("auto-rollback") { "auto-rollback" } else { "rollback" };
        let manifest = Manifest { generation, from_step: step, reason: kind.to_string(), ..previous.manifest.clone() };
        let left = std::mem::replace(&mut self.manifest, manifest.clone());
        let failed = std::mem::replace(&mut self.tasks, previous.tasks);
        self.allocation = previous.allocation;
        *at.specs = previous.specs;
        let switch_ms = started.elapsed().as_secs_f64() * 1e3;
        // Unloading the failed set's plugins is not part of the switch.
        drop(failed);
        manifest.write(at.run_dir)?;
        self.swapper.switched(&manifest, None, None);
        let changes = vec![format!(
            "generation {} (as generation {}) replaces generation {}",
            generation, previous.manifest.generation, left.generation
        )];
        let mut event = SwapEvent::new(step, "rolled-back");
        event.generation = Some(generation);
        event.reason = Some(reason.to_string());
        event.changes = changes;
        event.switch_ms = Some(switch_ms);
        self.announce(&event, at);
        Ok(())
    }

    /// After a step, probation: a task set on probation is judged by its first trajectories; the groups
    /// are kept for a later swap's rewards to re-score.
    pub(super) fn after_step(&mut self, step: usize, groups: &[RolloutGroup]) {
        let outcomes: Vec<(String, bool, Vec<String>)> = groups
            .iter()
            .flat_map(|g| {
                g.scores.iter().map(move |s| (g.task_name.clone(), !s.failures.is_empty(), s.failures.clone()))
            })
            .collect();
        if self.scheduled.is_empty()
            && let Some(reason) = self.swapper.watch_probation(&outcomes)
        {
            self.swapper.state().rollback = Some(reason);
        }
        let recent = groups
            .iter()
            .filter(|g| g.trajectories.iter().all(|t| t.turns <= 1))
            .map(|g| {
                let group = RecentGroup {
                    step: step + 1,
                    task: g.task.clone(),
                    completions: g.trajectories.iter().map(|t| t.text.clone()).collect(),
                    rewards: g.scores.iter().map(|s| s.failures.is_empty().then_some(s.reward)).collect(),
                };
                (g.task_name.clone(), group)
            })
            .collect();
        self.swapper.remember(step + 1, recent);
    }
}
