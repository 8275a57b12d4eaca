//! The replies of the served tasks' endpoints (`/v1/tasks`, `/v1/score`, `/get_reward`,
//! `/v1/episodes`, Megatron's `/rollouts/` and `/evaluation/`), as types.
//!
//! As in `openai.rs`, every struct lists its fields in alphabetical order and `f32` values are
//! written as the `f64` they widen to: the replies were `json!` literals before (maps that sort
//! their keys, floats widened), and a client may compare bytes; the tests below pin each reply
//! against the literal it replaced. `null` stays `null`; a field marked `skip` is left out when
//! `None`, as the literal left it out.

use crate::openai::{Widened, widened};
use serde::Serialize;
use serde::ser::Serializer;
use std::collections::BTreeMap;
use wirl_rollout::{OnFailure, Scored, Status};
use wirl_sandbox::{Message, Task};

/// An `f32` that may be absent (`null`), widened.
fn widened_option<S: Serializer>(x: &Option<f32>, serializer: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => serializer.serialize_f64(f64::from(*x)),
        None => serializer.serialize_none(),
    }
}

/// Named `f32` values, widened.
fn widened_map<S: Serializer>(parts: &BTreeMap<String, f32>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(parts.iter().map(|(name, &x)| (name, f64::from(x))))
}

/// Tasks and messages (the sandbox's types, which write their fields in declared order) with
/// their keys sorted, as the literals wrote them.
fn sorted<T: Serialize, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(value).map_err(serde::ser::Error::custom)?.serialize(serializer)
}

/// Rewards that may be `null` (a masked trajectory), widened.
pub struct Rewards(pub Vec<Option<f32>>);

impl Serialize for Rewards {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|x| x.map(f64::from)))
    }
}

/// A plugin by name and content hash.
#[derive(Serialize)]
pub struct PluginInfo {
    pub name: String,
    pub sha256: String,
}

/// A served task's sampling.
#[derive(Serialize)]
pub struct SamplingInfo {
    pub max_tokens: usize,
    #[serde(serialize_with = "widened")]
    pub temperature: f32,
    pub top_k: usize,
    #[serde(serialize_with = "widened")]
    pub top_p: f32,
}

/// A served task as `GET /v1/tasks` lists it.
#[derive(Serialize)]
pub struct TaskInfo {
    pub max_turns: usize,
    pub name: String,
    pub on_failure: OnFailure,
    pub rewards: Vec<PluginInfo>,
    pub sampling: SamplingInfo,
    /// environment, dataset, agent, remote or openenv.
    pub source: &'static str,
    pub source_plugin: Option<PluginInfo>,
}

/// `GET /v1/tasks`.
#[derive(Serialize)]
pub struct TaskList<'a> {
    pub data: &'a [TaskInfo],
    pub object: &'static str,
}

/// A scored completion: `reward` is null when the trajectory is masked (a plugin failed and
/// the task's `on_failure` is `mask`): never a silent 0.
#[derive(Serialize)]
pub struct ScoreInfo<'a> {
    pub failures: &'a [String],
    pub notes: &'a BTreeMap<String, String>,
    #[serde(serialize_with = "widened_map")]
    pub parts: &'a BTreeMap<String, f32>,
    #[serde(serialize_with = "widened_option")]
    pub reward: Option<f32>,
    pub status: Status,
}

impl<'a> ScoreInfo<'a> {
    pub fn of(score: &'a Scored) -> Self {
        ScoreInfo {
            failures: &score.failures,
            notes: &score.notes,
            parts: &score.parts,
            reward: usable_reward(score),
            status: score.status,
        }
    }
}

/// A score's reward, or `None` (`null`) for a masked trajectory.
pub fn usable_reward(score: &Scored) -> Option<f32> {
    score.status.usable().then_some(score.reward)
}

/// One task of `/v1/tasks/draw`: the task, or why the source could not give it.
#[derive(Serialize)]
pub struct Drawn {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub index: u64,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "sorted")]
    pub task: Option<Task>,
}

impl Drawn {
    pub fn task(index: u64, task: Task) -> Self {
        Drawn { error: None, index, task: Some(task) }
    }
    pub fn error(index: u64, error: String) -> Self {
        Drawn { error: Some(error), index, task: None }
    }
}

/// `POST /v1/tasks/draw`.
#[derive(Serialize)]
pub struct DrawReply<'a> {
    pub task: &'a str,
    pub tasks: Vec<Drawn>,
}

/// One group's scores in `POST /v1/score`.
#[derive(Serialize)]
pub struct GroupScores<'a> {
    pub rewards: Rewards,
    pub scores: Vec<ScoreInfo<'a>>,
}

impl<'a> GroupScores<'a> {
    pub fn of(scores: &'a [Scored]) -> Self {
        GroupScores {
            rewards: Rewards(scores.iter().map(usable_reward).collect()),
            scores: scores.iter().map(ScoreInfo::of).collect(),
        }
    }
}

/// `POST /v1/score` with one `problem`.
#[derive(Serialize)]
pub struct ScoreReply<'a> {
    pub rewards: Rewards,
    pub scores: Vec<ScoreInfo<'a>>,
    pub task: &'a str,
}

/// `POST /v1/score` with `groups`.
#[derive(Serialize)]
pub struct GroupsReply<'a> {
    pub groups: Vec<GroupScores<'a>>,
    pub task: &'a str,
}

/// OpenRLHF's `POST /get_reward`.
#[derive(Serialize)]
pub struct RewardReply<'a> {
    pub failures: Vec<&'a [String]>,
    pub rewards: Rewards,
}

/// What the model sees next in an episode.
#[derive(Serialize)]
pub struct Observation<'a> {
    #[serde(serialize_with = "sorted")]
    pub messages: &'a [Message],
}

/// `POST /v1/episodes` (201).
#[derive(Serialize)]
pub struct EpisodeStarted<'a> {
    pub done: bool,
    pub max_turns: usize,
    pub observation: Observation<'a>,
    pub session_id: &'a str,
    #[serde(serialize_with = "sorted")]
    pub task: &'a Task,
}

/// `POST /v1/episodes/ID/step`. Which optional fields appear depends on how the turn ended:
/// `score` for a single-turn task, `parts` and `note` for an environment's finite score,
/// `failure` (and `truncated` past `max_turns`) for an episode that failed.
#[derive(Serialize)]
pub struct EpisodeStep<'a> {
    pub done: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Present (a note or `null`) with `parts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<Option<String>>,
    pub observation: Observation<'a>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "widened_parts")]
    pub parts: Option<BTreeMap<String, f32>>,
    #[serde(serialize_with = "widened_option")]
    pub reward: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<ScoreInfo<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    pub turns: usize,
}

fn widened_parts<S: Serializer>(parts: &Option<BTreeMap<String, f32>>, serializer: S) -> Result<S::Ok, S::Error> {
    match parts {
        Some(parts) => widened_map(parts, serializer),
        None => serializer.serialize_none(),
    }
}

impl<'a> EpisodeStep<'a> {
    /// A turn whose episode goes on or ends, with no score and no failure.
    pub fn plain(messages: &'a [Message], done: bool, turns: usize) -> Self {
        EpisodeStep {
            done,
            failure: None,
            note: None,
            observation: Observation { messages },
            parts: None,
            reward: None,
            score: None,
            truncated: None,
            turns,
        }
    }
}

/// `DELETE /v1/episodes/ID`.
#[derive(Serialize)]
pub struct Closed<'a> {
    pub closed: &'a str,
}

/// One trajectory as Megatron-RL's `/rollouts/` gives it (lists of one), with wirl's
/// additions (failures, notes, parts, text, finish_reason, turns, weights_version).
#[derive(Serialize)]
pub struct TokenRollout<'a> {
    pub env_id: &'a str,
    pub failures: &'a [String],
    pub finish_reason: &'static str,
    pub generation_mask: [Vec<bool>; 1],
    pub kv_cache_epoch: [[[u64; 2]; 1]; 1],
    pub logprobs: [Widened<'a>; 1],
    pub notes: &'a BTreeMap<String, String>,
    pub num_evictions: [u64; 1],
    #[serde(serialize_with = "widened_map")]
    pub parts: &'a BTreeMap<String, f32>,
    pub policy_epoch: [[[u64; 2]; 1]; 1],
    pub problem_id: &'a str,
    pub prompt_length: [usize; 1],
    #[serde(serialize_with = "widened")]
    pub reward: f32,
    pub rollout_status: &'static str,
    pub text: &'a str,
    pub trajectory: [Vec<u32>; 1],
    pub turns: usize,
    pub weights_version: u64,
}

/// One problem of Megatron-RL's `/evaluation/`.
#[derive(Serialize)]
pub struct EvalResult<'a> {
    pub failures: &'a [String],
    pub passed: bool,
    pub problem_id: &'a str,
    #[serde(serialize_with = "sorted")]
    pub prompt: &'a [Message],
    pub response: &'a str,
    #[serde(serialize_with = "widened_option")]
    pub reward: Option<f32>,
    pub status: Status,
}

/// Megatron-RL's `/evaluation/`.
#[derive(Serialize)]
pub struct EvalReply<'a> {
    pub env_id: &'a str,
    pub pass_rate: Option<f64>,
    pub results: Vec<EvalResult<'a>>,
}

/// Each reply against the `json!` literal it replaced (as it was written in `tasks.rs`, with
/// values whose `f32` and `f64` texts differ): the same bytes.
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn bytes(reply: impl Serialize) -> String {
        serde_json::to_string(&reply).unwrap()
    }

    fn scored(status: Status) -> Scored {
        Scored {
            status,
            reward: 0.7,
            parts: BTreeMap::from([("correct".to_string(), 0.1), ("format".to_string(), 1.0)]),
            failures: vec!["deadline".into()],
            notes: BTreeMap::from([("math".to_string(), "extracted 42".to_string())]),
            turn_rewards: Vec::new(),
        }
    }

    /// The literal `scored()` wrote.
    fn old_scored(score: &Scored) -> Value {
        json!({
            "reward": if score.status.usable() { json!(score.reward) } else { Value::Null },
            "status": score.status,
            "parts": score.parts,
            "failures": score.failures,
            "notes": score.notes,
        })
    }

    fn task() -> Task {
        Task {
            id: "t-1".into(),
            messages: vec![Message::new("user", "What is 6 * 7?")],
            answer: Some("42".into()),
            metadata: None,
        }
    }

    #[test]
    fn task_list_draw_and_close() {
        let info = TaskInfo {
            max_turns: 3,
            name: "math".into(),
            on_failure: OnFailure::Mask,
            rewards: vec![PluginInfo { name: "math_answer".into(), sha256: "ab".into() }],
            sampling: SamplingInfo { max_tokens: 64, temperature: 0.7, top_k: 0, top_p: 0.9 },
            source: "dataset",
            source_plugin: None,
        };
        let old = json!({
            "name": "math", "source": "dataset", "source_plugin": Value::Null,
            "rewards": [json!({"name": "math_answer", "sha256": "ab"})], "max_turns": 3,
            "sampling": {"max_tokens": 64, "temperature": 0.7f32, "top_p": 0.9f32, "top_k": 0},
            "on_failure": OnFailure::Mask,
        });
        let list = [info];
        assert_eq!(bytes(TaskList { data: &list, object: "list" }), bytes(json!({"object": "list", "data": [old]})));
        let drawn = vec![Drawn::task(4, task()), Drawn::error(5, "no row 5".into())];
        let old = json!({"task": "math", "tasks": [json!({"index": 4, "task": task()}),
                                                     json!({"index": 5, "error": "no row 5"})]});
        assert_eq!(bytes(DrawReply { task: "math", tasks: drawn }), bytes(old));
        assert_eq!(bytes(Closed { closed: "ep-1-00ff" }), bytes(json!({"closed": "ep-1-00ff"})));
    }

    #[test]
    fn scores_and_rewards() {
        let scores = [scored(Status::Ok), scored(Status::Masked)];
        let rewards: Vec<Value> = scores.iter().map(|s| old_scored(s)["reward"].clone()).collect();
        let olds: Vec<Value> = scores.iter().map(old_scored).collect();
        let group = GroupScores::of(&scores);
        assert_eq!(
            bytes(ScoreReply { rewards: group.rewards, scores: group.scores, task: "math" }),
            bytes(json!({"task": "math", "rewards": rewards, "scores": olds}))
        );
        let old_group = json!({"rewards": rewards, "scores": olds});
        assert_eq!(
            bytes(GroupsReply { groups: vec![GroupScores::of(&scores)], task: "math" }),
            bytes(json!({"task": "math", "groups": [old_group]}))
        );
        let failures: Vec<&Vec<String>> = scores.iter().map(|s| &s.failures).collect();
        let reply = RewardReply {
            failures: scores.iter().map(|s| s.failures.as_slice()).collect(),
            rewards: Rewards(scores.iter().map(usable_reward).collect()),
        };
        assert_eq!(bytes(reply), bytes(json!({"rewards": rewards, "failures": failures})));
    }

    #[test]
    fn episodes() {
        let problem = task();
        let started = EpisodeStarted {
            done: false,
            max_turns: 4,
            observation: Observation { messages: &problem.messages },
            session_id: "ep-1",
            task: &problem,
        };
        let old = json!({"session_id": "ep-1", "observation": {"messages": problem.messages}, "task": problem,
                         "max_turns": 4, "done": false});
        assert_eq!(bytes(started), bytes(old));

        let score = scored(Status::Ok);
        let single = EpisodeStep {
            reward: usable_reward(&score),
            score: Some(ScoreInfo::of(&score)),
            ..EpisodeStep::plain(&[], true, 1)
        };
        let old = json!({"observation": {"messages": []}, "done": true, "turns": 1, "score": old_scored(&score),
                         "reward": old_scored(&score)["reward"]});
        assert_eq!(bytes(single), bytes(old));

        let messages = vec![Message::new("user", "Try again.")];
        let old = json!({"observation": {"messages": messages}, "reward": null, "done": false, "turns": 2});
        assert_eq!(bytes(EpisodeStep::plain(&messages, false, 2)), bytes(old));

        let truncated = EpisodeStep {
            failure: Some("max_turns: the episode did not end within 2 model turns".into()),
            truncated: Some(true),
            ..EpisodeStep::plain(&messages, true, 2)
        };
        let old = json!({"observation": {"messages": messages}, "reward": null, "done": true, "turns": 2,
                         "truncated": true, "failure": "max_turns: the episode did not end within 2 model turns"});
        assert_eq!(bytes(truncated), bytes(old));

        let parts = [("correct".to_string(), 0.1f32)];
        for note in [Some("close".to_string()), None] {
            let done = EpisodeStep {
                note: Some(note.clone()),
                parts: Some(parts.iter().cloned().collect()),
                reward: Some(0.7),
                ..EpisodeStep::plain(&[], true, 3)
            };
            let old = json!({"observation": {"messages": []}, "reward": 0.7f32, "done": true, "turns": 3,
                             "parts": parts.iter().cloned().collect::<std::collections::HashMap<_, _>>(), "note": note});
            assert_eq!(bytes(done), bytes(old));
        }
        let failed = EpisodeStep { failure: Some("guest_error: boom".into()), ..EpisodeStep::plain(&[], true, 1) };
        let old = json!({"observation": {"messages": []}, "reward": null, "done": true, "turns": 1,
                         "failure": "guest_error: boom"});
        assert_eq!(bytes(failed), bytes(old));
    }

    #[test]
    fn megatron_rollouts_and_evaluation() {
        let s = scored(Status::Failed);
        let (prompt, tokens, logprobs) = (vec![1u32, 2], vec![3u32, 4], vec![-0.1f32, -2.3]);
        let trajectory: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let mask = vec![false, false, true, true];
        let rollout = TokenRollout {
            env_id: "math",
            failures: &s.failures,
            finish_reason: "length",
            generation_mask: [mask.clone()],
            kv_cache_epoch: [[[0, 7]]],
            logprobs: [Widened(&logprobs)],
            notes: &s.notes,
            num_evictions: [0],
            parts: &s.parts,
            policy_epoch: [[[0, 7]]],
            problem_id: "t-1",
            prompt_length: [2],
            reward: s.reward,
            rollout_status: "failed",
            text: "42",
            trajectory: [trajectory.clone()],
            turns: 1,
            weights_version: 7,
        };
        let epoch = json!([[[0, 7u64]]]);
        let old = json!({
            "trajectory": [trajectory], "prompt_length": [prompt.len()], "generation_mask": [mask],
            "logprobs": [logprobs], "reward": s.reward, "env_id": "math", "problem_id": "t-1",
            "policy_epoch": epoch, "kv_cache_epoch": epoch, "num_evictions": [0], "rollout_status": "failed",
            "failures": s.failures, "notes": s.notes, "parts": s.parts, "text": "42", "finish_reason": "length",
            "turns": 1, "weights_version": 7u64,
        });
        assert_eq!(bytes([rollout]), bytes(json!([old])));

        let problem = task();
        let (ok, masked) = (scored(Status::Ok), scored(Status::Masked));
        fn result<'a>(s: &'a Scored, problem: &'a Task) -> EvalResult<'a> {
            EvalResult {
                failures: &s.failures,
                passed: s.status.usable() && s.reward >= 0.5,
                problem_id: &problem.id,
                prompt: &problem.messages,
                response: "42",
                reward: usable_reward(s),
                status: s.status,
            }
        }
        let old_result = |s: &Scored| {
            json!({"prompt": problem.messages, "response": "42",
                   "reward": if s.status.usable() { json!(s.reward) } else { Value::Null },
                   "problem_id": problem.id, "passed": s.status.usable() && s.reward >= 0.5,
                   "status": s.status, "failures": s.failures})
        };
        let reply = EvalReply {
            env_id: "math",
            pass_rate: Some(0.5),
            results: vec![result(&ok, &problem), result(&masked, &problem)],
        };
        let old = json!({"env_id": "math", "results": [old_result(&ok), old_result(&masked)], "pass_rate": json!(0.5)});
        assert_eq!(bytes(reply), bytes(old));
        let empty = EvalReply { env_id: "math", pass_rate: None, results: Vec::new() };
        assert_eq!(bytes(empty), bytes(json!({"env_id": "math", "results": [], "pass_rate": Value::Null})));
    }
}
