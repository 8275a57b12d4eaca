//! `builtin:code-tests`: stdin/stdout test cases (CodeContests, APPS, LiveCodeBench) judged
//! by running the completion's program once per case in the code runner its config names —
//! Python's, JavaScript's, Lua's and Ruby's — the first failure stopping the grading.

use std::sync::{Arc, OnceLock};
use wirl_sandbox::{Limits, Plugin, PluginSpec, RewardPlugin, Sandbox, SandboxSettings, Task};
use wirl_test_artifacts::{C_LUA_RUNNER, JS_CODE_RUNNER, PREBUILT_RUBY_RUNNER, PYTHON_CODE_RUNNER};

/// The grader loaded once per runner (a runner's path, and the grader that uses it).
type Loaded = std::sync::Mutex<Vec<(&'static str, Arc<Plugin>)>>;

fn grader(runner: &'static str) -> RewardPlugin {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    let sandbox = SANDBOX.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("components");
        Sandbox::new(SandboxSettings { cache_dir: Some(cache), ..Default::default() }).unwrap()
    });
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap();
    if !loaded.iter().any(|(path, _)| *path == runner) {
        let mut spec = wirl_builtins::spec(std::path::Path::new("builtin:code-tests")).unwrap();
        spec.limits.deadline_ms = 60_000;
        spec.config.insert("timeout_ms".into(), 3000.into());
        spec.code_runner = Some(Box::new(PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(runner) }));
        loaded.push((runner, sandbox.load(spec).unwrap()));
    }
    let plugin = loaded.iter().find(|(path, _)| *path == runner).unwrap().1.clone();
    RewardPlugin::new(plugin).unwrap()
}

fn task(metadata: serde_json::Value) -> Task {
    Task { id: "a-plus-b".into(), messages: Vec::new(), answer: None, metadata: Some(metadata.to_string()) }
}

fn a_plus_b() -> serde_json::Value {
    serde_json::json!({"tests": [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "-5 5\n", "output": "0\n"},
        {"input": "1000000000 1000000000\n", "output": "2000000000\n"},
    ]})
}

#[test]
fn python_programs_are_judged_case_by_case() {
    let mut grader = grader(PYTHON_CODE_RUNNER);
    let sums = task(a_plus_b());
    let score = |grader: &mut RewardPlugin, completion: &str| {
        let score = grader.score(&sums, completion).unwrap();
        (score.reward, score.note.unwrap_or_default())
    };
    let right = "Read both and add:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```";
    assert_eq!(score(&mut grader, right), (1.0, "all 3 cases passed".into()));
    let wrong = "```python\na, b = map(int, input().split())\nprint(a + b if a > 0 else 1)\n```";
    let (reward, note) = score(&mut grader, wrong);
    assert_eq!(reward, 0.0);
    assert!(note.starts_with("case 2 of 3: wrong answer"), "{note}");
    let (reward, note) = score(&mut grader, "```python\nimport sys\nsys.exit(2)\n```");
    assert_eq!((reward, note.as_str()), (0.0, "case 1 of 3: runtime error (exit 2): "));
    let (reward, note) = score(&mut grader, "```python\nwhile True: pass\n```");
    assert_eq!((reward, note.as_str()), (0.0, "case 1 of 3: timeout (3000 ms)"));
    let (reward, note) = score(&mut grader, "I cannot solve this.");
    assert_eq!(reward, 0.0);
    assert!(note.starts_with("case 1 of 3: runtime error (exit 1)"), "{note}");
    // APPS' shape, and a task's own time limit.
    let apps = serde_json::json!({"input_output": serde_json::json!({"inputs": ["2\n"], "outputs": ["4\n"]}).to_string(),
                                  "time_limit_ms": 500});
    let score = grader.score(&task(apps), "```python\nprint(int(input()) ** 2)\n```").unwrap();
    assert_eq!(score.reward, 1.0, "{:?}", score.note);
    let slow = grader
        .score(
            &task(serde_json::json!({"inputs": ["1"], "outputs": ["1"], "time_limit_ms": 500})),
            "import time\ntime.sleep(5)",
        )
        .unwrap();
    assert_eq!(slow.note.as_deref(), Some("case 1 of 1: timeout (500 ms)"));
    // A task with no cases cannot be judged: the call fails, it does not score 0.
    assert!(grader.score(&task(serde_json::json!({})), right).is_err());
}

/// A+B in `language`: the right program passes every case, the wrong one fails as `failed`
/// says.
fn judged_in(runner: &'static str, language: &str, right: &str, wrong: &str, failed: &str) {
    let mut grader = grader(runner);
    let mut metadata = a_plus_b();
    metadata["language"] = language.into();
    let task = task(metadata);
    let score = grader.score(&task, right).unwrap();
    assert_eq!((score.reward, score.note.as_deref()), (1.0, Some("all 3 cases passed")), "{language}");
    let note = grader.score(&task, wrong).unwrap().note.unwrap();
    assert!(note.starts_with(failed), "{language}: {note}");
}

#[test]
fn javascript_programs_are_judged_by_the_javascript_runner() {
    let right = "```js\nconst [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(' ').map(Number);\nconsole.log(a + b)\n```";
    judged_in(JS_CODE_RUNNER, "javascript", right, "```js\nconsole.log(3)\n```", "case 2 of 3: wrong answer");
}

#[test]
fn ruby_programs_are_judged_by_the_ruby_runner() {
    let right = "```ruby\na, b = $stdin.read.split.map(&:to_i)\nputs a + b\n```";
    judged_in(PREBUILT_RUBY_RUNNER, "ruby", right, "```ruby\nputs nil + 1\n```", "case 1 of 3: runtime error (exit 1)");
}

#[test]
fn lua_programs_are_judged_by_the_lua_runner() {
    let right = "```lua\nlocal a, b = io.read('n', 'n')\nprint(a + b)\n```";
    judged_in(C_LUA_RUNNER, "lua", right, "```lua\nprint(nil + 1)\n```", "case 1 of 3: runtime error (exit 1)");
}
