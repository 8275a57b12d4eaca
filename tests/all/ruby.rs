//! CRuby as a code runner: ruby.wasm (a WASI 0.1 core module, not a component) driven by the
//! host, answering as `ruby program.rb` would — stdin, `ARGV`, exit statuses, an uncaught
//! exception's message — under the same limits as every runner, each program in a fresh
//! instance started from a snapshot of CRuby's boot, and the same runner again in worker
//! processes.

use std::sync::OnceLock;
use wirl_sandbox::{CodeRunnerPlugin, Limits, Outcome, PluginSpec, Program, RunLimits, Sandbox, SandboxSettings};
use wirl_sandbox::{Error, Termination};
use wirl_test_artifacts::PREBUILT_RUBY_RUNNER;

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("components");
        Sandbox::new(SandboxSettings { cache_dir: Some(cache), ..Default::default() }).unwrap()
    })
}

fn runner() -> &'static CodeRunnerPlugin {
    static RUNNER: OnceLock<CodeRunnerPlugin> = OnceLock::new();
    RUNNER.get_or_init(|| {
        let spec = PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(PREBUILT_RUBY_RUNNER) };
        CodeRunnerPlugin::new(sandbox().load(spec).unwrap()).unwrap()
    })
}

fn ruby(source: &str, stdin: &str, args: &[&str]) -> Program {
    Program {
        language: "ruby".into(),
        source: source.into(),
        stdin: stdin.into(),
        args: args.iter().map(|arg| arg.to_string()).collect(),
    }
}

fn run_with(runner: &CodeRunnerPlugin, program: &Program, wall_ms: u32) -> Outcome {
    runner.run(program, &RunLimits { wall_ms, memory_bytes: 256 << 20, fuel: None, max_output_bytes: 64 << 10 })
}

fn run(source: &str, stdin: &str, args: &[&str]) -> Outcome {
    run_with(runner(), &ruby(source, stdin, args), 10_000)
}

#[test]
fn a_ruby_program_reads_stdin_and_arguments_and_uses_the_standard_library() {
    // (`gets` would read the files ARGV names, as `ruby program.rb --x ...` does.)
    let source = "require 'set'\nrequire 'json'\na, b = $stdin.gets.split.map(&:to_i)\nrest = $stdin.read\n\
                  puts a + b, rest.encoding, rest.strip.reverse\nputs JSON.generate(ARGV), Set[1, 1, 2].size, $0, __FILE__\n\
                  printf(\"%05.2f\\n\", 3.14159)";
    let outcome = run(source, "2 40\nnaïve ✓\n", &["--x", "a \"quoted\" arg"]);
    assert_eq!(outcome.termination, Termination::Exited(0), "{outcome:?}");
    assert_eq!(
        outcome.stdout,
        "42\nUTF-8\n✓ evïan\n[\"--x\",\"a \\\"quoted\\\" arg\"]\n2\nprogram.rb\nprogram.rb\n03.14\n"
    );
}

#[test]
fn exit_statuses_and_uncaught_exceptions_end_as_ruby_ends_them() {
    let cases: [(&str, i32, &str, &str); 9] = [
        ("puts 1\nexit 7", 7, "1\n", ""),
        // A process's status is a byte: 200 as it is, 256 as 0, -1 as 255.
        ("exit 200", 200, "", ""),
        ("exit 256", 0, "", ""),
        ("exit(-1)", 255, "", ""),
        ("begin\n  exit!(5)\nrescue Exception\n  puts 'caught'\nend", 5, "", ""),
        ("abort('gave up')", 1, "", "gave up\n"),
        ("begin\n  exit 3\nensure\n  puts 'ensure'\nend", 3, "ensure\n", ""),
        ("exit false", 1, "", ""),
        ("$stderr.puts 'warned'\nputs 'done'", 0, "done\n", "warned\n"),
    ];
    for (source, status, stdout, stderr) in cases {
        let outcome = run(source, "", &[]);
        assert_eq!(outcome.termination, Termination::Exited(status), "{source}: {outcome:?}");
        assert_eq!((outcome.stdout.as_str(), outcome.stderr.as_str()), (stdout, stderr), "{source}");
    }
    let raised = run("def f(x) = raise ArgumentError, \"bad #{x}\"\nputs 'before'\nf(3)", "", &[]);
    assert_eq!(raised.termination, Termination::Exited(1));
    assert_eq!(raised.stdout, "before\n");
    assert!(
        raised.stderr.starts_with("program.rb:1:in 'Object#f': bad 3 (ArgumentError)\n\tfrom program.rb:3:in '<main>'"),
        "{}",
        raised.stderr
    );
    let syntax = run("def f(\nputs 1", "", &[]);
    assert_eq!(syntax.termination, Termination::Exited(1));
    assert!(syntax.stderr.contains("syntax error"), "{}", syntax.stderr);
}

#[test]
fn limits_end_ruby_programs_and_keep_what_they_printed() {
    let looped = run_with(runner(), &ruby("puts 'before'\nloop {}", "", &[]), 1_500);
    assert_eq!((looped.termination, looped.stdout.as_str()), (Termination::TimedOut, "before\n"));
    let greedy = run("a = []\nloop { a << 'x' * (1 << 20) }", "", &[]);
    assert_eq!(greedy.termination, Termination::OutOfMemory, "{greedy:?}");
    let chatty = run("loop { puts 'y' * 1000 }", "", &[]);
    assert_eq!(chatty.termination, Termination::OutputLimit);
    let deep = run("def f(n) = f(n + 1) + 1\nf(0)", "", &[]);
    assert!(!matches!(deep.termination, Termination::Exited(0)), "{deep:?}");
    let next = run("puts [3, 1, 2].sort.inspect", "", &[]);
    assert_eq!((next.termination, next.stdout.as_str()), (Termination::Exited(0), "[1, 2, 3]\n"));
}

/// Every run starts from CRuby's instance as it was after booting once: nothing a program
/// defines reaches the next, and each run's random numbers are its own (the boot seeded
/// `Random` once for all of them; each run reseeds it).
#[test]
fn every_run_starts_from_the_booted_interpreter_alone() {
    let marked = run("$mark = 1\nclass Integer; def marked? = true; end\nputs 1.marked?", "", &[]);
    assert_eq!(marked.stdout, "true\n", "{marked:?}");
    let next = run("puts defined?($mark).inspect, 1.respond_to?(:marked?)", "", &[]);
    assert_eq!(next.stdout, "nil\nfalse\n", "{next:?}");
    let draws: Vec<String> = (0..3).map(|_| run("puts rand(1 << 60)", "", &[]).stdout).collect();
    assert!(draws[0] != draws[1] || draws[1] != draws[2], "the same random numbers every run: {draws:?}");
}

#[test]
fn ruby_runs_in_worker_processes_too() {
    wirl_sandbox::register_worker_command(env!("CARGO_BIN_EXE_wirl"), &["code-worker"]);
    let spec = PluginSpec { limits: Limits::code_runner(), ..PluginSpec::new(PREBUILT_RUBY_RUNNER) };
    let workers = CodeRunnerPlugin::new(sandbox().load(spec).unwrap()).unwrap().in_workers(sandbox(), 1).unwrap();
    let outcome = run_with(&workers, &ruby("puts gets.to_i * 2\nexit 4", "21\n", &[]), 10_000);
    assert_eq!((&outcome.termination, outcome.stdout.as_str()), (&Termination::Exited(4), "42\n"), "{outcome:?}");
}

#[test]
fn a_core_module_that_is_not_cruby_is_refused_naming_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reactor.wasm");
    // (module (memory (export "memory") 1) (func (export "_initialize")))
    let mut module = b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\x05\x03\x01\0\x01".to_vec();
    module.extend_from_slice(b"\x07\x18\x02\x06memory\x02\0\x0b_initialize\0\0\x0a\x04\x01\x02\0\x0b");
    std::fs::write(&path, module).unwrap();
    match sandbox().load(PluginSpec::new(&path)) {
        Err(Error::Refused { reason, .. }) => {
            assert!(reason.contains("core WebAssembly module, not a component"), "{reason}");
            assert!(reason.contains("`cabi_realloc`"), "{reason}");
        }
        other => panic!("loaded: {other:?}"),
    }
    // Loaded, CRuby serves only as a code runner.
    let cruby = sandbox().load(PluginSpec::new(PREBUILT_RUBY_RUNNER)).unwrap();
    assert!(wirl_sandbox::RewardPlugin::new(cruby).is_err());
}

/// A file that poses as ruby.wasm — CRuby's export names, but other types, or a boot that
/// traps or never ends — fails each run as the runner's own failure, naming it; it never
/// panics the host and is never taken for a program's verdict.
#[test]
fn an_impostor_of_ruby_wasm_fails_its_runs_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let exports = |initialize: &str| {
        format!(
            r#"(module (memory (export "memory") 1)
                 (func (export "_initialize") {initialize})
                 (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
                 (func (export "ruby-init: func(args: list<string>) -> ()") (param i32))
                 (func (export "rb-eval-string-protect: func(str: string) -> tuple<handle<rb-abi-value>, s32>")))"#
        )
    };
    for (name, text, says) in [
        ("wrong-types.wasm", exports(""), "CRuby could not boot"),
        ("trapping-boot.wasm", exports("unreachable"), "CRuby could not boot"),
        ("endless-boot.wasm", exports("(loop (br 0))"), "CRuby could not boot"),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, wat::parse_str(&text).unwrap()).unwrap();
        let limits = Limits { deadline_ms: 1_000, ..Limits::code_runner() };
        let runner =
            CodeRunnerPlugin::new(sandbox().load(PluginSpec { limits, ..PluginSpec::new(&path) }).unwrap()).unwrap();
        for _ in 0..2 {
            let failure = runner.try_run(&ruby("puts 1", "", &[]), &RunLimits::configured()).unwrap_err();
            assert!(failure.0.contains(says), "{name}: {failure}");
        }
    }
}
