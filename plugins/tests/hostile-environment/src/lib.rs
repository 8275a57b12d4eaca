//! An environment that fails on request, for the trainer's tests: the task at an index that
//! is `fail_mod`-th (config `fail_mod = N`: index % N == 1) is an error, `trap_mod` traps
//! there instead, and `fail_all = true` fails every index. Other tasks are short questions
//! whose answer is "1".

use wirl_sdk::environment::{Description, Environment, Message, Task, config};

struct HostileEnvironment;

fn hits(key: &str, index: u64) -> Result<bool, String> {
    let every: u64 = config::get_or(key, 0)?;
    Ok(every > 0 && index % every == 1)
}

impl Environment for HostileEnvironment {
    fn describe() -> Description {
        Description { name: "hostile-environment".into(), size: None, episodes: false }
    }

    fn task(seed: u64, index: u64) -> Result<Task, String> {
        if config::get_or("fail_all", false)? || hits("fail_mod", index)? {
            return Err(format!("no task at index {index}, on purpose"));
        }
        if hits("trap_mod", index)? {
            std::process::abort();
        }
        Ok(Task {
            id: format!("hostile/{seed}/{index}"),
            messages: vec![Message::user(format!("Say one ({index})."))],
            answer: Some("1".into()),
            metadata: None,
        })
    }
}

wirl_sdk::register_environment!(HostileEnvironment);
