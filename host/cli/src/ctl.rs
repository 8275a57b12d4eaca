//! `wirl ctl RUN_DIR …`: a running training's control, through its socket
//! (`wirl_app::control_socket`): the request from the command line, the reply printed.

use std::path::PathBuf;
use std::process::ExitCode;
use wirl_app::control_socket::{Request, call};
use wirl_trainer::{ApplyOptions, Report, RunStatus, TrainConfig};

#[derive(clap::Args)]
pub struct Args {
    /// The run directory of a running `wirl train`.
    run_dir: PathBuf,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(clap::Subcommand)]
enum CtlCommand {
    /// The step, the manifest in force (tasks, weights, plugins by sha256), staged changes,
    /// the last step's figures per task.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Replace the run's tasks with those of a file (`[[tasks]]` and shared `[[rewards]]`,
    /// paths relative to it): checked beside training, switched in at the next step boundary.
    Apply {
        tasks: PathBuf,
        /// Print what would change and how the checks went; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Let a replaced plugin import interfaces its version in force did not.
        #[arg(long)]
        allow_capabilities: bool,
        #[arg(long)]
        json: bool,
    },
    /// Go back to the task set before the last switch (kept loaded), at the next step boundary.
    Rollback,
    /// Hold the run after its current step.
    Pause,
    /// Let a paused run go on.
    Resume,
    /// Stop the run as Ctrl-C does (checkpointed; `wirl train --resume` continues it).
    Stop,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (request, json) = match args.command {
        CtlCommand::Status { json } => (Request::Status, json),
        CtlCommand::Apply { tasks, dry_run, allow_capabilities, json } => {
            let set = TrainConfig::read_task_set(&tasks)?;
            let options = ApplyOptions {
                dry_run,
                allow_new_capabilities: allow_capabilities,
                origin: tasks.display().to_string(),
                reason: "apply".into(),
            };
            (Request::Apply { tasks: set, options }, json)
        }
        CtlCommand::Rollback => (Request::Rollback, false),
        CtlCommand::Pause => (Request::Pause, false),
        CtlCommand::Resume => (Request::Resume, false),
        CtlCommand::Stop => (Request::Stop, false),
    };
    let dry_run = matches!(&request, Request::Apply { options, .. } if options.dry_run);
    let reply = call(&args.run_dir, &request)?;
    if json {
        println!("{}", serde_json::to_string(&reply)?);
    } else {
        if let Some(status) = &reply.status {
            print_status(status);
        }
        if let Some(report) = &reply.report {
            print_report(report);
        }
        if let Some(message) = &reply.message {
            if reply.ok { println!("{message}") } else { say!("error: {message}") }
        }
        if reply.ok && dry_run {
            println!("dry run: nothing changed");
        }
    }
    Ok(if reply.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn print_status(status: &RunStatus) {
    let mut state = String::new();
    if status.paused {
        state.push_str(" (paused)");
    }
    if status.stopping {
        state.push_str(" (stopping)");
    }
    println!("run {}: step {}/{}{state}", status.run_dir.display(), status.step, status.steps);
    if let Some(manifest) = &status.manifest {
        println!(
            "manifest generation {} ({}, from step {}){}",
            manifest.generation,
            manifest.reason,
            manifest.from_step,
            if status.can_roll_back { "; the previous one is kept for a rollback" } else { "" }
        );
        for task in &manifest.tasks.tasks {
            let figures = status.tasks.get(&task.name).map_or(String::new(), |m| {
                format!("  groups {}  reward {:.3}  pass {:.3}", m.groups, m.reward_mean, m.pass_rate)
            });
            let only = if task.eval_only { " (eval only)" } else { "" };
            println!("  task {}  weight {}{only}{figures}", task.name, task.weight);
        }
        for (reference, sha256) in &manifest.plugins {
            println!("  plugin {reference}  sha256 {sha256}");
        }
    }
    for change in &status.staged {
        println!("staged: {change}");
    }
    for (sha256, seconds) in &status.backoff_s {
        println!("back-off: sha256 {} may be applied again in {seconds:.0} s", &sha256[..12.min(sha256.len())]);
    }
}

fn print_report(report: &Report) {
    for change in &report.changes {
        println!("change: {change}");
    }
    for check in &report.checks {
        let kinds: Vec<String> = check.failures.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let mut line =
            format!("check: task {} {}: {} calls, {} failed", check.task, check.kind, check.calls, check.failed);
        if !kinds.is_empty() {
            line.push_str(&format!(" ({})", kinds.join(", ")));
        }
        if let (Some(old), Some(new)) = (check.reward_mean_old, check.reward_mean_new) {
            line.push_str(&format!(
                "; reward mean {old:.3} -> {new:.3}; {} flip to pass, {} to fail",
                check.flips_to_pass, check.flips_to_fail
            ));
        }
        if let Some(note) = &check.note {
            line.push_str(&format!("; {note}"));
        }
        println!("{line}");
    }
    println!("failure rate of the checks: {:.1}%", report.failure_rate * 100.0);
}
