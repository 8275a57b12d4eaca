//! An agent plugin that misbehaves on request, for the trainer's tests. Config `mode`:
//! - `ok`: one turn per rollout on the task "Say something.", reward = the reply's length
//!   in characters (what the tiny test model can raise);
//! - `hang`: loops without end (its own compute: the deadline ends it);
//! - `trap`: aborts;
//! - `generate_forever`: calls `generate` again and again, ignoring refusals (the host's cap
//!   on calls refuses, then the deadline ends it);
//! - `unknown_handle`: every other rollout names a generation the host never gave;
//! - `broken_chain`: every other rollout names two generations of unrelated conversations;
//! - `agent_error`: every other rollout's outcome is an error;
//! - `slow_generate_ok`: like `ok`, but generates in many small calls, one per rollout (time
//!   spent generating must not count against its deadline).

use wirl_sdk::agent::{Agent, Message, Rollout, RolloutGroup, RolloutRequest, Sampling, Score, Task, config, generate};

struct HostileAgent;

fn task(index: u64) -> Task {
    Task {
        id: format!("hostile-agent/{index}"),
        messages: vec![Message::user("Say something.")],
        answer: None,
        metadata: None,
    }
}

impl Agent for HostileAgent {
    fn rollouts(request: RolloutRequest) -> Result<Vec<RolloutGroup>, String> {
        let mode: String = config::get_or("mode", "ok".to_string())?;
        let sampling = Sampling { seed: None, ..request.sampling.clone() };
        match mode.as_str() {
            "hang" => {
                let mut x = 0u64;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "trap" => std::process::abort(),
            "generate_forever" => loop {
                let _ = generate(&[vec![Message::user("again")]], &sampling);
            },
            _ => {}
        }
        let tasks: Vec<Task> = (0..request.groups as u64).map(|i| task(request.cursor + i)).collect();
        let total = (request.groups * request.group_size) as usize;
        let conversations: Vec<Vec<Message>> =
            (0..total).map(|i| tasks[i / request.group_size as usize].messages.clone()).collect();
        let completions = if mode == "slow_generate_ok" {
            let mut all = Vec::new();
            for conversation in &conversations {
                all.extend(generate(std::slice::from_ref(conversation), &sampling)?);
            }
            all
        } else {
            generate(&conversations, &sampling)?
        };
        let mut completions = completions.into_iter().enumerate();
        Ok(tasks
            .into_iter()
            .map(|task| {
                let rollouts = (&mut completions)
                    .take(request.group_size as usize)
                    .map(|(i, c)| {
                        let odd = i % 2 == 1;
                        let generations = match mode.as_str() {
                            "unknown_handle" if odd => vec![c.generation + 1_000_000],
                            "broken_chain" if odd => vec![c.generation, c.generation],
                            _ => vec![c.generation],
                        };
                        let outcome = if mode == "agent_error" && odd {
                            Err("this rollout could not be judged".to_string())
                        } else {
                            Ok(Score::new(c.text.chars().count() as f32))
                        };
                        let mut messages = task.messages.clone();
                        messages.push(Message::assistant(c.text));
                        Rollout { messages, generations, outcome }
                    })
                    .collect();
                RolloutGroup { task, rollouts }
            })
            .collect())
    }
}

wirl_sdk::register_agent!(HostileAgent);
