//! A task's prompt as token ids, and a step's tasks: those whose prompt leaves room for a
//! completion in the model's context, failures skipped, recorded and replaced.

use crate::source::TaskSource;
use wirl_engine::{ChatMessage, Tokenizer};
use wirl_sandbox::{Task, printable};

/// A task's conversation, rendered with the model's chat template and tokenized.
pub fn prompt_ids(tokenizer: &Tokenizer, task: &Task) -> crate::error::Result<Vec<u32>> {
    let messages: Vec<ChatMessage> =
        task.messages.iter().map(|m| ChatMessage { role: m.role.clone(), content: m.content.clone() }).collect();
    Ok(tokenizer.encode(&tokenizer.render_chat(&messages, true)?)?)
}

/// `task`'s prompt, if it leaves room for `room` new tokens in a context of `context`; else
/// why not, naming the sizes.
pub fn fitting_prompt(
    tokenizer: &Tokenizer,
    task: &Task,
    room: usize,
    context: usize,
) -> Result<Vec<u32>, TaskFailure> {
    let prompt = prompt_ids(tokenizer, task).map_err(|e| TaskFailure::of(task, wirl_engine::error_chain(&e)))?;
    if prompt.is_empty() || prompt.len().saturating_add(room) > context {
        return Err(TaskFailure::of(
            task,
            format!(
                "its prompt is {} tokens; with sampling.max_tokens = {room} it does not fit the model's context of \
                 {context}",
                prompt.len()
            ),
        ));
    }
    Ok(prompt)
}

/// A task source's held-out problems whose prompts fit (`room` tokens left for the answer
/// within `context`), with the slots left out and why (a source that could not give the
/// task, a prompt too long), each also logged.
#[allow(clippy::too_many_arguments)]
pub fn held_out_prompts(
    name: &str,
    source: &mut TaskSource,
    first_index: u64,
    offset: u64,
    count: usize,
    tokenizer: &Tokenizer,
    room: usize,
    context: usize,
) -> (Vec<(Task, Vec<u32>)>, Vec<SkippedTask>) {
    let held_out = source.held_out(first_index, offset, count);
    if held_out.is_empty() && count > 0 && !matches!(source, TaskSource::Agent { .. }) {
        tracing::warn!("task `{name}`: no held-out problems (a dataset needs an `eval` file)");
    }
    let (mut usable, mut skipped) = (Vec::new(), Vec::new());
    for (index, problem) in held_out {
        let fitted = problem
            .map_err(|reason| TaskFailure { id: None, reason })
            .and_then(|problem| fitting_prompt(tokenizer, &problem, room, context).map(|prompt| (problem, prompt)));
        match fitted {
            Ok(fitted) => usable.push(fitted),
            Err(failure) => {
                let left = failure.at(index);
                let reason = printable(&left.reason);
                match &left.id {
                    Some(id) => tracing::warn!("held-out task `{}` left out: {reason}", printable(id)),
                    None => tracing::warn!("held-out task {index} of `{name}` left out: {reason}"),
                }
                skipped.push(left);
            }
        }
    }
    (usable, skipped)
}

/// Tries per task slot of a step before the source counts as broken.
pub const MAX_TASK_TRIES: u64 = 8;
/// Where replacement tasks' indices start: far above training's and the default held-out
/// range (`eval.first_index` = 2^40).
pub const REPLACEMENT_INDICES: u64 = 1 << 50;

/// Why a task could not be used.
#[derive(Clone, Debug)]
pub struct TaskFailure {
    pub id: Option<String>,
    pub reason: String,
}

impl TaskFailure {
    pub fn of(task: &Task, reason: String) -> Self {
        TaskFailure { id: Some(task.id.clone()), reason }
    }

    fn at(self, index: u64) -> SkippedTask {
        SkippedTask { index, id: self.id, reason: self.reason }
    }
}

/// A step's tasks, their prompts, and the tasks skipped on the way.
pub struct StepTasks {
    pub tasks: Vec<Task>,
    pub prompts: Vec<Vec<u32>>,
    pub skipped: Vec<SkippedTask>,
}

/// A task skipped in a step, as recorded in rollouts and metrics.
#[derive(Clone, Debug)]
pub struct SkippedTask {
    pub index: u64,
    pub id: Option<String>,
    pub reason: String,
}

impl std::fmt::Display for SkippedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.id {
            Some(id) => write!(f, "task {} (`{id}`) skipped: {}", self.index, self.reason),
            None => write!(f, "task {} skipped: {}", self.index, self.reason),
        }
    }
}

/// The tasks at `indices` and their prompts. A task the source cannot give — its `task-at`
/// fails, or `fit` refuses its prompt — is skipped (returned, to be recorded) and replaced by
/// another index; a slot that finds no task in `MAX_TASK_TRIES` tries is an error, since the
/// source is then broken.
pub fn step_tasks(
    source: &mut TaskSource,
    indices: std::ops::Range<u64>,
    fit: impl Fn(&Task) -> Result<Vec<u32>, TaskFailure>,
) -> crate::error::Result<StepTasks> {
    let (mut tasks, mut prompts, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    for index in indices {
        let mut found = false;
        // The source's own error of the last try, kept whole: its cause (a remote server
        // down, an I/O error) is the caller's to tell apart.
        let mut last_error = None;
        for attempt in 0..MAX_TASK_TRIES {
            // Replacements come from a range of their own, the same on every resume.
            let index = if attempt == 0 { index } else { REPLACEMENT_INDICES + index * MAX_TASK_TRIES + attempt };
            last_error = None;
            let task = source.training(index).map_err(|e| {
                let failure = TaskFailure { id: None, reason: wirl_engine::error_chain(&e) };
                last_error = Some(e);
                failure
            });
            match task.and_then(|task| Ok((fit(&task)?, task))) {
                Ok((prompt, task)) => {
                    tasks.push(task);
                    prompts.push(prompt);
                    found = true;
                    break;
                }
                Err(failure) => skipped.push(failure.at(index)),
            }
        }
        if !found {
            let head = format!(
                "the task source failed {MAX_TASK_TRIES} tasks in a row (index {index} and its replacements; fix the \
                 environment, dataset or task server, then `wirl train --resume`); the last"
            );
            return Err(match last_error {
                Some(error) => crate::Error::Context { context: head, source: Box::new(error) },
                None => {
                    let last = skipped.last().map(|s| s.reason.clone()).unwrap_or_default();
                    crate::error::invalid!("{head}: {last}")
                }
            });
        }
    }
    Ok(StepTasks { tasks, prompts, skipped })
}
