//! A `wirl:rl@0.2.0` environment whose episodes last `turns` model turns (config, default 3)
//! and reward each turn the episode goes on from with its reply's length in characters (none
//! for the turn numbered `silent`, from 0, if the config names one, and for every turn with
//! `quiet = true`; NaN for the turn numbered `nan`, a hostile value); the outcome is the
//! config's `outcome` (default 0) for every episode. What a test needs to see turn rewards
//! reach the trainer and be credited to their turn's tokens while the outcome says nothing.

use wirl_sdk::environment_v0_2::{Description, Environment, Episode, Message, Score, StepResult, Task, Turn, config};

struct TurnRewards;

struct Counting {
    turn: u64,
    turns: u64,
    silent: Option<u64>,
    quiet: bool,
    nan: Option<u64>,
    outcome: f32,
}

impl Environment for TurnRewards {
    fn describe() -> Description {
        Description { name: "turn-rewards".into(), size: None, episodes: true }
    }

    fn task(seed: u64, index: u64) -> Result<Task, String> {
        Ok(Task {
            id: format!("turn-rewards/{seed}/{index}"),
            messages: vec![Message::user(format!("Say something about the number {index}."))],
            answer: None,
            metadata: None,
        })
    }

    fn start_episode(_task: Task) -> Result<Box<dyn Episode>, String> {
        Ok(Box::new(Counting {
            turn: 0,
            turns: config::get_or("turns", 3)?,
            silent: config::get("silent")?,
            quiet: config::get_or("quiet", false)?,
            nan: config::get("nan")?,
            outcome: config::get_or("outcome", 0.0)?,
        }))
    }
}

impl Episode for Counting {
    fn step(&mut self, reply: String) -> Result<StepResult, String> {
        let turn = self.turn;
        self.turn += 1;
        if self.turn >= self.turns {
            return Ok(StepResult::Done(Score::new(self.outcome).part("turns", self.turn as f32)));
        }
        let next = Turn::new(vec![Message::user("Say more.")]);
        Ok(StepResult::Continue(if self.quiet || self.silent == Some(turn) {
            next
        } else if self.nan == Some(turn) {
            next.reward(f32::NAN)
        } else {
            next.reward(reply.chars().count() as f32)
        }))
    }
}

wirl_sdk::register_environment_v0_2!(TurnRewards);
