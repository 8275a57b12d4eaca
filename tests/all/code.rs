//! Model-written code: the CPython code-runner component, one fresh instance per program,
//! and the HumanEval grader that judges programs in a separate sandbox. Every hostile
//! program ends with a named termination and the next program runs clean.

use std::sync::{Arc, OnceLock};
use wirl_sandbox::{
    CodeRunnerPlugin, Limits, Outcome, PluginSpec, Program, RewardPlugin, RunLimits, Sandbox, SandboxSettings, Task,
    Termination,
};
use wirl_test_artifacts::{HUMANEVAL_GRADER, PYTHON_CODE_RUNNER as CODE_RUNNER, PYTHON_HUMANEVAL_RUNNER};

/// One sandbox for these tests, with a compiled-component cache kept in the target
/// directory: CPython's 20 MB component is compiled once, not per test.
fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("components");
        Sandbox::new(SandboxSettings { cache_dir: Some(cache), ..Default::default() }).unwrap()
    })
}

fn runner_spec() -> PluginSpec {
    PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(CODE_RUNNER) }
}

fn runner() -> &'static CodeRunnerPlugin {
    static RUNNER: OnceLock<CodeRunnerPlugin> = OnceLock::new();
    RUNNER.get_or_init(|| CodeRunnerPlugin::new(sandbox().load(runner_spec()).unwrap()).unwrap())
}

fn limits(wall_ms: u32, memory_mib: u64, max_output_bytes: u32) -> RunLimits {
    RunLimits { wall_ms, memory_bytes: memory_mib << 20, fuel: None, max_output_bytes }
}

fn run(source: &str) -> Outcome {
    runner().run(&Program::python(source), &limits(2_000, 128, 64 << 10))
}

/// Run a hostile program, then check that the next one runs clean.
fn hostile(source: &str) -> Outcome {
    let outcome = run(source);
    let next = run("print(sum(range(10)))");
    assert_eq!((next.termination, next.stdout.as_str()), (Termination::Exited(0), "45\n"), "after {source}");
    outcome
}

fn exited(outcome: &Outcome) -> Option<i32> {
    match outcome.termination {
        Termination::Exited(status) => Some(status),
        _ => None,
    }
}

#[test]
fn a_program_reads_stdin_and_arguments_and_prints() {
    let program = Program {
        stdin: "3 4\n".into(),
        args: vec!["--twice".into()],
        ..Program::python(
            "import sys\na, b = map(int, input().split())\nprint(a * b * (2 if sys.argv[1:] == ['--twice'] else 1))\n\
             print('note', file=sys.stderr)",
        )
    };
    let outcome = runner().run(&program, &RunLimits::configured());
    assert_eq!(outcome.termination, Termination::Exited(0), "{}", outcome.stderr);
    assert_eq!((outcome.stdout.as_str(), outcome.stderr.as_str(), outcome.truncated), ("24\n", "note\n", false));
}

#[test]
fn the_standard_library_that_tests_use_imports() {
    let modules = "math re collections itertools functools heapq string json typing fractions decimal bisect \
                   random datetime hashlib statistics operator copy array textwrap unicodedata time dataclasses enum";
    let source = format!(
        "import importlib\nfor name in {:?}.split():\n    importlib.import_module(name)\n\
         import hashlib, decimal, fractions\nprint(hashlib.sha256(b'x').hexdigest()[:8], decimal.Decimal('0.1') * 3, \
         fractions.Fraction(1, 3) + fractions.Fraction(1, 6))",
        modules
    );
    let outcome = run(&source);
    assert_eq!(outcome.termination, Termination::Exited(0), "{}", outcome.stderr);
    assert_eq!(outcome.stdout, "2d711642 0.3 1/2\n");
}

#[test]
fn exit_statuses_are_the_programs_own() {
    assert_eq!(exited(&hostile("import sys\nsys.exit(3)")), Some(3));
    let exit = hostile("import os\nprint('bye', flush=True)\nos._exit(4)");
    // WASI 0.2's `exit` carries only success or failure; the runner keeps os._exit's status.
    assert_eq!((exited(&exit), exit.stdout.as_str()), (Some(4), "bye\n"), "{exit:?}");
    assert_eq!(exited(&hostile("import os\nos._exit(0)")), Some(0));
    assert_eq!(exited(&hostile("import os\ndef f():\n    os._exit(263)\nf()\nprint('not here')")), Some(7));
    let raised = hostile("raise ValueError('no')");
    assert_eq!(exited(&raised), Some(1));
    assert!(raised.stderr.contains("ValueError: no"), "{}", raised.stderr);
    let syntax = hostile("def f(:\n  pass");
    assert_eq!(exited(&syntax), Some(1));
    assert!(syntax.stderr.contains("SyntaxError"), "{}", syntax.stderr);
    let other =
        runner().run(&Program { language: "ruby".into(), ..Program::python("puts 1") }, &RunLimits::configured());
    assert_eq!(exited(&other), Some(127), "{}", other.stderr);
}

#[test]
fn an_endless_loop_times_out() {
    let outcome =
        runner().run(&Program::python("print('start', flush=True)\nwhile True: pass"), &limits(300, 128, 1024));
    assert_eq!(outcome.termination, Termination::TimedOut);
    assert_eq!(outcome.stdout, "start\n", "output before the time-out is kept");
    assert!((300..3_000).contains(&outcome.duration_ms), "{} ms", outcome.duration_ms);
    hostile("pass");
}

#[test]
fn allocating_ten_gigabytes_runs_out_of_memory() {
    // Ten gigabytes in one piece cannot even be asked for in a 32-bit interpreter.
    let one_piece = hostile("x = bytearray(10 * 2**30)");
    assert_eq!(exited(&one_piece), Some(1));
    assert!(one_piece.stderr.contains("OverflowError"), "{one_piece:?}");
    // Past the memory limit in one piece, and in ten thousand 1 MiB pieces.
    assert_eq!(hostile("x = bytearray(3 * 2**29)").termination, Termination::OutOfMemory);
    assert_eq!(hostile("x = []\nwhile True: x.append(' ' * 2**20)").termination, Termination::OutOfMemory);
    // The host, not a `MemoryError` the program could catch, has the last word.
    let caught = hostile("try:\n    x = bytearray(3 * 2**29)\nexcept MemoryError:\n    print('survived')");
    assert_eq!(
        (exited(&caught), caught.stdout.as_str()),
        (Some(0), "survived\n"),
        "a caught MemoryError is the program's business"
    );
}

#[test]
fn recursion_a_million_deep_ends_without_harm() {
    let outcome = hostile("import sys\nsys.setrecursionlimit(10**7)\ndef f(n): return f(n + 1)\nf(0)");
    assert_ne!(exited(&outcome), Some(0), "{outcome:?}");
}

#[test]
fn printing_without_end_stops_at_the_output_limit() {
    let outcome = runner().run(&Program::python("while True: print('x' * 1000)"), &limits(5_000, 128, 10_000));
    assert_eq!(outcome.termination, Termination::OutputLimit);
    assert!(outcome.truncated);
    assert_eq!(outcome.stdout.len(), 10_000);
    // A gigabyte string never reaches the output: building it exceeds memory first.
    let huge = hostile("print('x' * 10**9)");
    assert!(matches!(huge.termination, Termination::OutOfMemory | Termination::OutputLimit), "{huge:?}");
}

#[test]
fn one_large_print_arrives_whole_or_ends_as_an_output_limit() {
    // One write of 200 KB: a write permit of 64 KiB once cut it to 65,536 bytes, silently.
    let big =
        runner().run(&Program::python("import sys\nsys.stdout.write('y' * 200_000)"), &limits(5_000, 128, 1 << 20));
    assert_eq!((&big.termination, big.stdout.len(), big.truncated), (&Termination::Exited(0), 200_000, false));
    let err =
        runner().run(&Program::python("import sys\nsys.stderr.write('e' * 150_000)"), &limits(5_000, 128, 1 << 20));
    assert_eq!((&err.termination, err.stderr.len(), err.truncated), (&Termination::Exited(0), 150_000, false));
    // Past the limit in one write: the limit is named and the output says it was cut.
    let over =
        runner().run(&Program::python("import sys\nsys.stdout.write('z' * 300_000)"), &limits(5_000, 128, 100_000));
    assert_eq!((&over.termination, over.truncated), (&Termination::OutputLimit, true), "{over:?}");
    assert_eq!(over.stdout.len(), 100_000);
}

#[test]
fn no_files_processes_network_or_native_code() {
    for source in [
        "print(open('/etc/passwd').read())",
        "import os\nprint(os.listdir('/'))",
        "import os\nassert os.system('echo hi') == 0",
        "import subprocess\nsubprocess.run(['echo', 'hi'], check=True)",
        "import socket\nsocket.create_connection(('127.0.0.1', 22))",
        "import ctypes\nctypes.CDLL(None)",
        "import os\nprint(os.environ['HOME'])",
    ] {
        let outcome = hostile(source);
        assert_eq!(exited(&outcome), Some(1), "{source}: {outcome:?}");
    }
}

#[test]
fn a_program_cannot_influence_the_next_programs_instance() {
    let tamper = "import builtins, sys, math, random\nbuiltins.print = None\nmath.pi = 3\nrandom.seed(1)\n\
                  sys.modules['json'] = None\nbuiltins.LEFT_BEHIND = 1";
    let tampered = run(tamper);
    assert_eq!(exited(&tampered), Some(0), "{}", tampered.stderr);
    let check = "import builtins, math, json\nprint(math.pi > 3.14, hasattr(builtins, 'LEFT_BEHIND'), json.dumps(1))";
    let outcome = run(check);
    assert_eq!(outcome.stdout, "True False 1\n", "{}", outcome.stderr);
}

#[test]
fn fuel_limits_a_program_deterministically() {
    let sandbox = Sandbox::new(SandboxSettings {
        fuel: true,
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("components")),
        ..Default::default()
    })
    .unwrap();
    let runner = CodeRunnerPlugin::new(sandbox.load(runner_spec()).unwrap()).unwrap();
    let budget = RunLimits { fuel: Some(50_000_000), ..limits(10_000, 128, 1024) };
    assert_eq!(runner.run(&Program::python("while True: pass"), &budget).termination, Termination::OutOfFuel);
    assert_eq!(runner.run(&Program::python("print(1)"), &budget).termination, Termination::Exited(0));
}

#[test]
fn requested_limits_are_lowered_to_the_configured_ones() {
    let effective = runner().effective_limits(&RunLimits { wall_ms: 99_000_000, ..limits(0, 1 << 20, 0) });
    assert_eq!(effective.deadline_ms, Limits::code_runner().deadline_ms);
    assert_eq!(effective.memory_bytes, Limits::code_runner().memory_bytes);
    assert_eq!(effective.max_print_bytes, Limits::code_runner().max_print_bytes);
    assert!(!effective.reuse_instance);
}

// ---- the HumanEval grader ----------------------------------------------------------------

pub fn humaneval() -> &'static [Task] {
    static TASKS: OnceLock<Vec<Task>> = OnceLock::new();
    TASKS.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/humaneval/HumanEval.jsonl");
        std::fs::read_to_string(path).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    })
}

/// The runners a grader's programs may go to: the plain code runner (the judge's source sent
/// whole with each program) and the humaneval runner (the judge compiled into its snapshot).
const RUNNERS: [&str; 2] = [CODE_RUNNER, PYTHON_HUMANEVAL_RUNNER];

/// The HumanEval grader with its programs run by `runner` (one of [`RUNNERS`]).
fn grader_on(runner: &'static str) -> RewardPlugin {
    static PLUGINS: OnceLock<[Arc<wirl_sandbox::Plugin>; 2]> = OnceLock::new();
    let plugins = PLUGINS.get_or_init(|| {
        RUNNERS.map(|runner| {
            let spec = PluginSpec {
                limits: Limits { deadline_ms: 60_000, ..Limits::default() },
                code_runner: Some(Box::new(PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(runner) })),
                ..PluginSpec::new(HUMANEVAL_GRADER)
            };
            sandbox().load(spec).unwrap()
        })
    });
    let index = RUNNERS.iter().position(|r| *r == runner).expect("one of RUNNERS");
    RewardPlugin::new(plugins[index].clone()).unwrap()
}

fn grader() -> RewardPlugin {
    grader_on(CODE_RUNNER)
}

/// Grade `completion` of HumanEval task `index` on `runner`: the reward and the note.
fn grade_on(runner: &'static str, index: usize, completion: &str) -> (f32, String) {
    let score = grader_on(runner).score(&humaneval()[index], completion).unwrap();
    (score.reward, score.note.unwrap_or_default())
}

/// Grade `completion` of HumanEval task `index`: the reward and the note.
fn grade(index: usize, completion: &str) -> (f32, String) {
    grade_on(CODE_RUNNER, index, completion)
}

#[test]
fn a_grader_without_a_code_runner_is_refused_by_name() {
    // It loads (to be inspected), but cannot score.
    let plugin = sandbox().load(PluginSpec::new(HUMANEVAL_GRADER)).unwrap();
    assert_eq!(plugin.world(), wirl_sandbox::World::GraderPlugin);
    let Err(error) = RewardPlugin::new(plugin) else { panic!("a grader without a runner was accepted") };
    let error = error.to_string();
    assert!(error.contains("humaneval_grader") && error.contains("code_runner"), "{error}");
}

#[test]
fn canonical_solutions_pass_and_wrong_ones_fail_with_a_reason() {
    let tasks = humaneval();
    for runner in RUNNERS {
        let grade = |index: usize, completion: &str| grade_on(runner, index, completion);
        for index in [0, 32, 33, 38, 72] {
            let answer = tasks[index].answer.clone().unwrap();
            assert_eq!(grade(index, &answer), (1.0, "passed".to_string()), "{} on {runner}", tasks[index].id);
        }
        let (reward, note) = grade(2, "    return number\n");
        assert_eq!(reward, 0.0);
        assert!(note.starts_with("assertion: test line"), "{note}");
        assert!(grade(2, "    return number +\n").1.starts_with("syntax error"));
        assert!(grade(2, "    raise ValueError('nope')\n").1.contains("ValueError: nope"));
        assert!(grade(2, "    while True: pass\n").1.starts_with("timeout"));
        let memory = grade(2, "    x = [bytearray(2**20) for _ in range(10_000)]\n").1;
        assert!(memory.starts_with("memory"), "{memory}");
        assert!(grade(2, "    while True: print('x' * 10000)\n").1.starts_with("output limit"));
    }
}

/// A task of our own, in HumanEval's shape.
fn task_of(prompt: &str, test: &str, entry_point: &str) -> Task {
    let metadata = serde_json::json!({ "prompt": prompt, "test": test, "entry_point": entry_point });
    Task { id: "own/0".into(), messages: Vec::new(), answer: None, metadata: Some(metadata.to_string()) }
}

#[test]
fn large_results_and_many_asserts_are_judged_not_unreadable() {
    // A correct function returning 20,000 numbers: its results line is ~110 KB.
    let task = task_of(
        "def squares(n):\n    \"\"\"The squares of 0 to n - 1.\"\"\"\n",
        "def check(candidate):\n    assert candidate(20000) == [i * i for i in range(20000)]\n",
        "squares",
    );
    for runner in RUNNERS {
        let right = grader_on(runner).score(&task, "    return [i * i for i in range(n)]\n").unwrap();
        assert_eq!((right.reward, right.note.as_deref()), (1.0, Some("passed")), "on {runner}");
        let wrong = grader_on(runner).score(&task, "    return [i for i in range(n)]\n").unwrap();
        assert_eq!(wrong.reward, 0.0, "on {runner}");
    }
    // 600 asserts: the judge's list of calls is far over 64 KiB.
    let asserts: String = (0..600).map(|i| format!("    assert candidate({i}, 'pad' * 40) == {}\n", i + 1)).collect();
    let many =
        task_of("def inc(x, pad):\n    \"\"\"x + 1.\"\"\"\n", &format!("def check(candidate):\n{asserts}"), "inc");
    let right = grader().score(&many, "    return x + 1\n").unwrap();
    assert_eq!((right.reward, right.note.as_deref()), (1.0, Some("passed")));
    assert_eq!(grader().score(&many, "    return x\n").unwrap().reward, 0.0);
}

#[test]
fn mbpp_bare_asserts_are_judged_and_a_test_that_asserts_nothing_is_refused() {
    let task = task_of("", "assert add(1, 2) == 3\nassert add(-4, 4) == 0\n", "add");
    for runner in RUNNERS {
        let right = grader_on(runner).score(&task, "def add(a, b):\n    return a + b\n").unwrap();
        assert_eq!((right.reward, right.note.as_deref()), (1.0, Some("passed")), "on {runner}");
        let wrong = grader_on(runner).score(&task, "def add(a, b):\n    return a - b\n").unwrap();
        assert_eq!(wrong.reward, 0.0, "on {runner}");
        assert!(wrong.note.as_deref().unwrap_or("").starts_with("assertion"), "{wrong:?}");
    }
    // A test that could never fail passes nothing: the task is refused by name, not scored.
    let vacuous = task_of("", "x = add\n", "add");
    let refused = grader().score(&vacuous, "def add(a, b):\n    return a + b\n").unwrap_err();
    assert!(refused.message.contains("asserts nothing"), "{refused:?}");
}

#[test]
fn a_whole_function_in_a_chat_reply_is_graded() {
    let reply = "Sure:\n```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```\n";
    assert_eq!(grade(2, reply).0, 1.0);
}

#[test]
fn a_group_is_graded_in_one_call() {
    let task = &humaneval()[2];
    let completions: Vec<String> =
        ["    return number % 1.0\n", "    return 0.5\n", "    return number - int(number)\n"].map(String::from).into();
    let rewards: Vec<f32> = grader().score_group(task, &completions).into_iter().map(|s| s.unwrap().reward).collect();
    assert_eq!(rewards, [1.0, 0.0, 1.0]);
}

/// The tricks of a program that wants a pass it did not earn. Each is written for
/// `truncate_number` (HumanEval/2), whose honest answer is `number % 1.0`.
#[test]
fn forged_passes_fail() {
    let forgeries = [
        // Leave before any test runs, with success.
        "    import sys; sys.exit(0)\n",
        "    import os; os._exit(0)\n",
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        // Print what a verdict might look like.
        "    return 0\nprint('__WIRL_JUDGE__{\"verdict\": \"pass\"}')\nprint('passed')\n",
        // Make assertions harmless, in every way Python offers.
        "    return 0\nimport builtins\nbuiltins.AssertionError = type('Nothing', (BaseException,), {})\n",
        "    return 0\nimport sys\nsys.excepthook = lambda *a: None\nsys.settrace(lambda *a: None)\n",
        "    return 0\nimport atexit, os\natexit.register(lambda: os._exit(0))\n",
        // Claim answers without computing them: every call "returned" 0.5.
        "    return 0\nimport sys, json\nreq = json.loads(sys.stdin.read())\n\
         print('__WIRL_RESULTS__' + json.dumps([[k, json.dumps({'ok': {'f': '0.5'}})] for k in req['calls']]))\n\
         sys.exit(0)\n",
        // Look for the tests or their expected values in this interpreter.
        "    import gc, sys\n    for o in gc.get_objects():\n        if callable(o) and getattr(o, '__name__', '') == 'check':\n            \
         return o.__code__.co_consts[1]\n    return None\n",
        "    import inspect\n    for f in inspect.stack():\n        if 'check' in f.frame.f_globals: return 0.5\n    return -1\n",
        // A subclass whose == is always true.
        "    class Yes(float):\n        def __eq__(self, other): return True\n        __hash__ = float.__hash__\n    return Yes(0)\n",
    ];
    // With the judge compiled into the runner, a candidate can reach its module: rebinding the
    // driver, or the module's encoder, claims nothing the judge believes.
    let on_the_judge_module = [
        "    return 0\nimport wirl_humaneval_judge as j\nj._wirl_call_all = lambda ns: print('__WIRL_RESULTS__[]')\n",
        "    return 0\nimport wirl_humaneval_judge as j\nj._wirl_enc = lambda v, depth=0: {'f': '0.5'}\n",
        "    return 0\nimport wirl_humaneval_judge as j\nj.main()\n",
    ];
    for runner in RUNNERS {
        for forgery in forgeries.iter().chain(&on_the_judge_module) {
            let (reward, note) = grade_on(runner, 2, forgery);
            assert_eq!(reward, 0.0, "forged a pass on {runner}: {forgery}\n({note})");
        }
        // The honest answer still passes after all that.
        assert_eq!(grade_on(runner, 2, "    return number % 1.0\n").0, 1.0);
    }
}

/// `wirl score --answers` on the dataset: every canonical solution passes, through the real
/// binary, the real grader and CPython, on either runner.
#[test]
fn every_canonical_humaneval_solution_scores_one() {
    for runner in RUNNERS {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["score", "--plugin", HUMANEVAL_GRADER, "--code-runner", runner, "--answers"])
            .args(["--deadline-ms", "60000", "--input"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/humaneval/HumanEval.jsonl"))
            .env("WIRL_CACHE_DIR", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{runner}: {stderr}");
        let rewards: Vec<f64> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["reward"].as_f64().unwrap())
            .collect();
        assert_eq!(rewards.len(), 164);
        assert!(rewards.iter().all(|&r| r == 1.0), "{runner}: {stderr}");
    }
}

/// `wirl eval` on HumanEval with the real model: greedy pass rate, pass@k over samples, one
/// JSONL line per task with every completion's verdict.
#[test]
fn wirl_eval_reports_pass_at_k_on_humaneval() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/humaneval/HumanEval.jsonl");
    // The same evaluation with the programs in process and in two worker processes (the
    // tasks' groups then scored at once): the same lines.
    let eval = |workers: usize| {
        let config = dir.path().join(format!("humaneval-{workers}.toml"));
        std::fs::write(
            &config,
            format!(
                "[model]\npath = {model:?}\n[dataset]\neval = {dataset:?}\n\
                 [[rewards]]\nplugin = {HUMANEVAL_GRADER:?}\ndeadline_ms = 60000\n\
                 code_runner = {{ plugin = {CODE_RUNNER:?}, workers = {workers} }}\n\
                 [sampling]\nmax_tokens = 48\ntemperature = 0.8\n[eval]\ntasks = 2\nsamples = 3\nk = [1, 2]\n",
                model = crate::engine::default_model().display().to_string(),
            ),
        )
        .unwrap();
        let per_task = dir.path().join(format!("results-{workers}.jsonl"));
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("eval")
            .arg(&config)
            .arg("--output")
            .arg(&per_task)
            .env("WIRL_CACHE_DIR", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        (output, std::fs::read_to_string(&per_task).unwrap())
    };
    let (output, per_task) = eval(0);
    assert_eq!(eval(2).1, per_task, "in worker processes");
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for key in ["greedy_pass_rate", "pass@1", "pass@2"] {
        assert!(summary[key].as_f64().is_some_and(|p| (0.0..=1.0).contains(&p)), "{key}: {summary}");
    }
    let lines: Vec<serde_json::Value> = per_task.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["completions"].as_array().unwrap().len(), 3, "{line}");
        // Every verdict says why: "passed", or a reason such as "syntax error: ...".
        let notes = line["greedy"]["notes"].as_object().unwrap();
        assert!(notes.values().all(|n| n.as_str().is_some_and(|n| !n.is_empty())) && !notes.is_empty(), "{line}");
    }
    // pass@k comes from the per-task counts by the unbiased estimator.
    let mean_pass_1 = lines.iter().map(|l| l["passed"].as_f64().unwrap() / 3.0).sum::<f64>() / 2.0;
    assert!((summary["pass@1"].as_f64().unwrap() - mean_pass_1).abs() < 1e-9, "{summary}");
}

#[test]
fn a_judge_run_loads_the_code_an_earlier_one_compiled_and_compiles_afresh_what_it_cannot_read() {
    // The humaneval judge as the grader runs it: the task's prompt and guarded test compiled
    // by the first run of a group, loaded by the later ones.
    let runner = CodeRunnerPlugin::new(
        sandbox()
            .load(PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(PYTHON_HUMANEVAL_RUNNER) })
            .unwrap(),
    )
    .unwrap();
    let meta: serde_json::Value = serde_json::from_str(humaneval()[0].metadata.as_deref().unwrap()).unwrap();
    let judge = |code: serde_json::Value| -> serde_json::Value {
        let request = serde_json::json!({
            "prompt": meta["prompt"], "test": meta["test"], "entry_point": meta["entry_point"], "memo": {}, "code": code,
        });
        let program = Program {
            stdin: request.to_string(),
            ..Program::python("import wirl_humaneval_judge\nwirl_humaneval_judge.main()\n")
        };
        let outcome = runner.run(&program, &RunLimits::configured());
        assert_eq!(outcome.termination, Termination::Exited(0), "{}", outcome.stderr);
        let line = outcome.stdout.lines().rev().find_map(|l| l.strip_prefix("__WIRL_JUDGE__")).expect("a verdict");
        serde_json::from_str(line).unwrap()
    };
    let first = judge(serde_json::Value::Null);
    let code = first["code"].clone();
    assert!(code.as_str().is_some_and(|c| c.len() > 100), "{first}");
    let pending = &first["pending"];
    assert!(pending.as_array().is_some_and(|p| !p.is_empty()), "{first}");
    // Loaded: the same calls asked, nothing compiled to send back.
    let loaded = judge(code);
    assert_eq!((&loaded["pending"], loaded.get("code")), (pending, None), "{loaded}");
    // Not a code object this interpreter can read: compiled afresh, the same calls asked.
    for garbage in ["bm9uc2Vuc2U=", "not base64 at all", ""] {
        let again = judge(garbage.into());
        assert_eq!(&again["pending"], pending, "{garbage:?}: {again}");
    }
}

#[test]
fn a_sleeping_program_finishes_within_its_limit() {
    let started = std::time::Instant::now();
    let outcome =
        runner().run(&Program::python("import time\ntime.sleep(0.3)\nprint('woke')"), &limits(3_000, 128, 1024));
    assert_eq!(outcome.termination, Termination::Exited(0), "{outcome:?}");
    assert_eq!(outcome.stdout, "woke\n");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
}

#[test]
fn a_sleeping_program_is_cut_at_its_limit() {
    // `time.sleep(12)` waits in the host on a clock pollable; the limit still holds.
    let runner = runner(); // loaded (compiled on first use) before the clock starts
    let started = std::time::Instant::now();
    let outcome = runner.run(
        &Program::python("import time\nprint('before', flush=True)\ntime.sleep(12)\nprint('after')"),
        &limits(1_000, 128, 1024),
    );
    let took = started.elapsed().as_millis();
    assert_eq!(outcome.termination, Termination::TimedOut, "{outcome:?}");
    assert_eq!(outcome.stdout, "before\n", "output before the cut is kept");
    // Cut at the limit, long before the sleep's own 12 s (bounds loose for busy machines).
    assert!((1_000..6_000).contains(&took), "cut after {took} ms, the limit is 1000 ms");
    assert_eq!(run("print(2 + 2)").stdout, "4\n", "the next program runs");
}

/// Worker processes (`wirl code-worker`): the same outcomes as in process, and every way a
/// child can go wrong ends one program with a named crash, never a hang; the next program
/// gets a fresh child.
mod workers {
    use super::*;
    use std::time::Duration;

    /// A runner whose programs run in `workers` children of the wirl binary.
    fn in_workers(workers: usize) -> CodeRunnerPlugin {
        wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
        CodeRunnerPlugin::new(sandbox().load(runner_spec()).unwrap()).unwrap().in_workers(sandbox(), workers).unwrap()
    }

    fn signal(pid: u32, signal: &str) {
        let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Run `program` on `runner` while, after `after`, `act` is done to the one child.
    fn run_while(runner: &CodeRunnerPlugin, source: &str, wall_ms: u32, after: Duration, act: &str) -> Outcome {
        let [pid] = runner.worker_pids()[..] else { panic!("one worker: {:?}", runner.worker_pids()) };
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(after);
                signal(pid, act);
            });
            runner.run(&Program::python(source), &limits(wall_ms, 128, 64 << 10))
        })
    }

    fn runs_clean(runner: &CodeRunnerPlugin) {
        let next = runner.run(&Program::python("print(sum(range(10)))"), &RunLimits::configured());
        assert_eq!((next.termination, next.stdout.as_str()), (Termination::Exited(0), "45\n"));
    }

    fn crashed(outcome: &Outcome) -> &str {
        match &outcome.termination {
            Termination::Crashed(how) => how,
            other => panic!("expected a crash, got {other:?}"),
        }
    }

    #[test]
    fn programs_in_worker_processes_end_as_in_process() {
        let workers = in_workers(2);
        assert_eq!((workers.workers(), workers.worker_pids().len()), (2, 2));
        let programs = [
            Program {
                stdin: "3 4\n".into(),
                args: vec!["x".into()],
                ..Program::python(
                    "import sys\na, b = map(int, input().split())\nprint(a * b, sys.argv[1:])\nprint('e', file=sys.stderr)",
                )
            },
            Program::python("raise SystemExit(3)"),
            Program::python("1/0"),
            Program::python("while True: pass"),
            Program::python("print('x' * 10**6)"),
            Program::python("x = bytearray(10**10)"),
            Program { language: "ruby".into(), ..Program::python("puts 1") },
        ];
        let limits = limits(500, 64, 4096);
        // Two threads at once, as scorers of two groups would send them.
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for program in &programs {
                        let (here, there) = (runner().run(program, &limits), workers.run(program, &limits));
                        assert_eq!(
                            (&here.termination, &here.stdout, &here.stderr, here.truncated),
                            (&there.termination, &there.stdout, &there.stderr, there.truncated),
                            "{}",
                            program.source
                        );
                    }
                });
            }
        });
        assert_eq!(workers.worker_pids().len(), 2, "no child was lost on hostile programs");
    }

    #[test]
    fn a_worker_killed_mid_program_is_a_crash_and_is_replaced() {
        let runner = in_workers(1);
        let before = runner.worker_pids();
        let outcome = run_while(&runner, "while True: pass", 5_000, Duration::from_millis(300), "-KILL");
        let how = crashed(&outcome);
        assert!(how.contains("code worker") && how.contains("signal: 9"), "{how}");
        runs_clean(&runner);
        assert_ne!(runner.worker_pids(), before, "a fresh child took its place");
    }

    #[test]
    fn ctrl_c_in_the_terminal_leaves_a_workers_program_to_its_parent() {
        // The terminal's SIGINT reaches the whole process group; the parent decides.
        let runner = in_workers(1);
        let before = runner.worker_pids();
        let program = "import time\ntime.sleep(0.5)\nprint('done')";
        let outcome = run_while(&runner, program, 5_000, Duration::from_millis(100), "-INT");
        assert_eq!((outcome.termination, outcome.stdout.as_str()), (Termination::Exited(0), "done\n"));
        assert_eq!(runner.worker_pids(), before, "the same child");
    }

    #[test]
    fn a_worker_that_stops_answering_is_cut_at_the_deadline_and_replaced() {
        // A stopped child never answers: the host's own bound (the program's deadline plus a
        // margin) ends the wait; the child is killed, not left behind.
        let runner = in_workers(1);
        let [pid] = runner.worker_pids()[..] else { unreachable!() };
        let outcome = run_while(&runner, "while True: pass", 300, Duration::from_millis(100), "-STOP");
        // The host's bound ended the wait (the stopped child could not have answered).
        let how = crashed(&outcome);
        assert!(how.contains("did not answer"), "{how}");
        assert!(!runner.worker_pids().contains(&pid));
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the stopped child was reaped");
        runs_clean(&runner);
    }

    #[test]
    fn a_runner_changed_on_disk_is_refused_by_its_workers() {
        // Workers load the runner from its file: one that no longer has the bytes the host
        // checked is refused at start, by name, instead of running other code.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.wasm");
        std::fs::copy(CODE_RUNNER, &path).unwrap();
        let spec = PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(&path) };
        let runner = CodeRunnerPlugin::new(sandbox().load(spec).unwrap()).unwrap();
        std::fs::copy(PYTHON_HUMANEVAL_RUNNER, &path).unwrap();
        wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
        let error = runner.in_workers(sandbox(), 1).unwrap_err().to_string();
        assert!(error.contains("runner.wasm") && error.contains("changed since the host loaded it"), "{error}");
        let range_error = CodeRunnerPlugin::new(sandbox().load(runner_spec()).unwrap())
            .unwrap()
            .in_workers(sandbox(), wirl_sandbox::MAX_WORKERS + 1)
            .unwrap_err()
            .to_string();
        assert!(range_error.contains(&format!("give 1 to {}", wirl_sandbox::MAX_WORKERS)), "{range_error}");
    }

    #[test]
    fn a_grader_with_workers_grades_as_in_process() {
        wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
        let spec = PluginSpec {
            limits: Limits { deadline_ms: 60_000, ..Limits::default() },
            code_runner: Some(Box::new(PluginSpec {
                limits: Limits::code_runner(),
                workers: 2,
                ..PluginSpec::new(PYTHON_HUMANEVAL_RUNNER)
            })),
            ..PluginSpec::new(HUMANEVAL_GRADER)
        };
        let mut grader = RewardPlugin::new(sandbox().load(spec).unwrap()).unwrap();
        let task = &humaneval()[0];
        let right = task.answer.clone().unwrap();
        let completions = [right.clone(), "    return True\n".to_string(), "    while True: pass\n".to_string()];
        let scores: Vec<f32> = grader.score_group(task, &completions).into_iter().map(|s| s.unwrap().reward).collect();
        assert_eq!(scores, [1.0, 0.0, 0.0]);
        assert_eq!(grader.plugin().code_runner().unwrap().workers(), 2);
    }

    /// A worker killed under a grader (the OOM killer, say) fails the grader's call as the
    /// host's failure (`infrastructure`): it scored a correct solution 0, "verdict ok".
    #[test]
    fn a_graders_lost_worker_fails_the_call_it_does_not_score_0() {
        wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
        let spec = PluginSpec {
            limits: Limits { deadline_ms: 120_000, ..Limits::default() },
            code_runner: Some(Box::new(PluginSpec {
                limits: Limits::code_runner(),
                workers: 1,
                ..PluginSpec::new(PYTHON_HUMANEVAL_RUNNER)
            })),
            ..PluginSpec::new(HUMANEVAL_GRADER)
        };
        let mut grader = RewardPlugin::new(sandbox().load(spec).unwrap()).unwrap();
        let runner = grader.plugin().code_runner().unwrap().clone();
        let task = task_of(
            "def slow(x):\n    \"\"\"Slowly, x.\"\"\"\n",
            "def check(candidate):\n    assert candidate(1) == 1\n",
            "slow",
        );
        let completion =
            "    import time\n    s = time.time()\n    while time.time() - s < 20:\n        pass\n    return x\n";
        let verdict = std::thread::scope(|scope| {
            scope.spawn(|| {
                // The judge's first run is quick; then the candidate's 20 s run holds the worker.
                std::thread::sleep(Duration::from_secs(3));
                for pid in runner.worker_pids() {
                    signal(pid, "-KILL");
                }
            });
            grader.score(&task, completion)
        });
        let failure = verdict.unwrap_err();
        assert_eq!(failure.kind, wirl_sandbox::FailureKind::Infrastructure, "{failure:?}");
        assert!(failure.message.contains("code worker"), "{failure:?}");
    }

    #[test]
    fn groups_scored_at_once_get_the_verdicts_of_groups_scored_one_by_one() {
        wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
        let scorers = |workers: usize| {
            let source = wirl_rollout::RewardSource::Plugin {
                plugin: wirl_rollout::PluginRef {
                    path: HUMANEVAL_GRADER.into(),
                    stored: None,
                    config: Default::default(),
                    deadline_ms: Some(60_000),
                    memory_mib: None,
                },
                code_runner: Some(wirl_rollout::CodeRunnerRef {
                    path: PYTHON_HUMANEVAL_RUNNER.into(),
                    stored: None,
                    deadline_ms: Some(2_000),
                    memory_mib: None,
                    workers,
                }),
                inference: Default::default(),
                judge: Default::default(),
            };
            let reward = wirl_rollout::RewardSpec { source, weight: 1.0 };
            wirl_rollout::Scorers::load(sandbox(), &[reward]).unwrap()
        };
        let (mut one_by_one, mut at_once) = (scorers(0), scorers(2));
        assert_eq!((one_by_one.parallelism(), at_once.parallelism()), (1, 2));
        // Five groups of three: right, wrong, endless; each task's own answer.
        let texts: Vec<(Task, Vec<String>)> = [0, 2, 4, 7, 12]
            .map(|index| {
                let task = humaneval()[index].clone();
                let right = task.answer.clone().unwrap();
                (task, vec![right, "    return None\n".into(), "    while True: pass\n".into()])
            })
            .into();
        let outside = wirl_sandbox::Progress::OUTSIDE_TRAINING;
        let groups: Vec<(&Task, &[String], _)> =
            texts.iter().map(|(task, texts)| (task, texts.as_slice(), outside)).collect();
        let policy = wirl_rollout::FailurePolicy::default();
        let verdicts = |scored: Vec<Vec<wirl_rollout::Scored>>| -> Vec<Vec<(f32, Option<String>)>> {
            scored
                .into_iter()
                .map(|group| group.into_iter().map(|s| (s.reward, s.notes.values().next().cloned())).collect())
                .collect()
        };
        let expected = verdicts(one_by_one.score_groups(&groups, policy));
        assert_eq!(
            expected.iter().map(|g| g.iter().map(|v| v.0).collect::<Vec<_>>()).collect::<Vec<_>>(),
            vec![vec![1.0, 0.0, 0.0]; 5]
        );
        assert_eq!(verdicts(at_once.score_groups(&groups, policy)), expected, "in the order given");
        // Again, on the lanes made the first time.
        assert_eq!(verdicts(at_once.score_groups(&groups[1..], policy)), expected[1..]);
    }
}
