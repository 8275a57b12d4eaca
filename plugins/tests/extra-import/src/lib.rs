//! A reward plugin that also imports `test:extra-import/vault`, which no host provides.

wit_bindgen::generate!({ world: "test:extra-import/extra-import", path: ["../../../wit", "wit"], generate_all });

use exports::wirl::rl::reward::Guest;
use wirl::rl::types::{Score, Task};

struct Extra;

impl Guest for Extra {
    fn score_completion(_task: Task, _completion: String) -> Result<Score, String> {
        Ok(Score { reward: test::extra_import::vault::secret().len() as f32, parts: vec![], note: None })
    }
    fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
        completions.into_iter().map(|c| Self::score_completion(task.clone(), c)).collect()
    }
}

export!(Extra);
