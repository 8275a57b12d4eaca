//! Ranks as processes: `mpirun -n 2 wirl train --dp 2` with a wirl built with the `mpi`
//! feature (`scripts/test` builds one and runs these where Open MPI is installed; elsewhere
//! they say why they skip). The processes' run equals the threads' and one trainer's; a rank
//! that fails or is killed ends the job within a bounded time, saying which.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<&'static str> {
    if !cfg!(feature = "mpi") {
        return Some("this test binary's wirl was built without the `mpi` feature (scripts/test builds one)");
    }
    let found = Command::new("mpirun").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !found.is_ok_and(|s| s.success()) {
        return Some("no `mpirun` on PATH (Debian: apt install openmpi-bin libopenmpi-dev)");
    }
    None
}

/// `mpirun -n 2` of `wirl` with `args` (each rank its own), allowed as root and on fewer
/// cores than ranks (a CI machine's).
fn mpirun(ranks: &[&[&str]]) -> Command {
    let mut command = Command::new("mpirun");
    command.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    command.args(["--oversubscribe", "--mca", "btl", "self,vader"]);
    for (i, args) in ranks.iter().enumerate() {
        if i > 0 {
            command.arg(":");
        }
        command.args(["-n", "1", env!("CARGO_BIN_EXE_wirl")]).args(*args);
    }
    command
}

fn train_args<'a>(config: &'a str, run: &'a str, extra: &'a [&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", config, "--run-dir", run];
    args.extend_from_slice(extra);
    args
}

fn said(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn setup() -> Option<(tempfile::TempDir, PathBuf)> {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&config, text).unwrap();
    Some((dir, config))
}

#[test]
fn mpirun_ranks_train_as_threads_and_one_trainer_do() {
    let Some((dir, config)) = setup() else { return };
    let config = config.to_str().unwrap().to_string();
    let run = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (one, threads, processes) = (run("one"), run("threads"), run("processes"));
    for (path, extra) in [(&one, &["--dp", "1"][..]), (&threads, &["--dp", "2"][..])] {
        let out = Command::new(env!("CARGO_BIN_EXE_wirl")).args(train_args(&config, path, extra)).output().unwrap();
        assert!(out.status.success(), "{}", said(&out));
    }
    let args = train_args(&config, &processes, &["--dp", "2"]);
    let out = mpirun(&[&args, &args]).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let read = |run: &str| std::fs::read_to_string(Path::new(run).join("rollouts.jsonl")).unwrap();
    assert_eq!(read(&one), read(&processes), "the processes roll what one trainer does");
    assert_eq!(read(&threads), read(&processes));
    let weights = |run: &str| {
        let model = Path::new(run).join("checkpoints/step-000002/model");
        let (_, _, tensors) = wirl_engine::load::load_tensors(&model, &Default::default()).unwrap();
        let mut names: Vec<_> = tensors.keys().cloned().collect();
        names.sort();
        names.iter().flat_map(|n| tensors[n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect::<Vec<f32>>()
    };
    let (w_threads, w_processes) = (weights(&threads), weights(&processes));
    assert_eq!(w_threads, w_processes, "processes and threads sum in the same order: the same bits");
    let worst = weights(&one).iter().zip(&w_processes).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "against one trainer a weight differs by {worst}");

    // Resumed under mpirun: the same records as the whole run.
    let parts = run("parts");
    let first = train_args(&config, &parts, &["--dp", "2", "--steps", "1"]);
    let out = mpirun(&[&first, &first]).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let resume = ["train", "--dp", "2", "--steps", "2", "--resume", parts.as_str()];
    let out = mpirun(&[&resume, &resume]).output().unwrap();
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(read(&one), read(&parts));
}

#[test]
fn a_rank_that_fails_or_is_killed_ends_the_job_saying_which() {
    let Some((dir, config)) = setup() else { return };
    let config = config.to_str().unwrap().to_string();
    // Rank 1 refuses its arguments: the job ends with its error, not a hang.
    let run = dir.path().join("refused").to_str().unwrap().to_string();
    let (good, bad) = (train_args(&config, &run, &["--dp", "2"]), train_args(&config, &run, &["--dp", "3"]));
    let out = mpirun(&[&good, &bad]).output().unwrap();
    assert!(!out.status.success());
    assert!(said(&out).contains("rank 1: mpirun started 2 processes but --dp is 3"), "{}", said(&out));

    // Rank 1 killed (SIGKILL) while the run trains: mpirun ends rank 0 too, and says so.
    let run = dir.path().join("killed").to_str().unwrap().to_string();
    let args = train_args(&config, &run, &["--dp", "2", "--steps", "400"]);
    let mut job = mpirun(&[&args, &args]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let metrics = Path::new(&run).join("metrics.jsonl");
    let started = Instant::now();
    while std::fs::read_to_string(&metrics).unwrap_or_default().lines().count() < 1 {
        assert!(started.elapsed() < Duration::from_secs(120), "no step in 2 min");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rank 0 answers `wirl ctl`, as a trainer alone does.
    let status =
        Command::new(env!("CARGO_BIN_EXE_wirl")).args(["ctl", run.as_str(), "status", "--json"]).output().unwrap();
    assert!(status.status.success(), "{}", said(&status));
    let rank1 = rank_pid(1, &run).expect("rank 1's process");
    assert_eq!(unsafe { libc::kill(rank1, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    loop {
        if let Some(status) = job.try_wait().unwrap() {
            assert!(!status.success());
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "rank 0 still running a minute after rank 1 was killed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = job.wait_with_output().unwrap();
    assert!(said(&out).contains("signal 9") || said(&out).contains("Killed"), "{}", said(&out));
}

/// The pid of the wirl process that Open MPI made rank `rank` of the job training in
/// `run` (other tests' jobs may be running beside it).
fn rank_pid(rank: usize, run: &str) -> Option<i32> {
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let is_wirl = std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| exe.ends_with("wirl"));
        let ours = cmdline.split(|&b| b == 0).any(|arg| arg == run.as_bytes());
        if is_wirl && ours && environ.split(|&b| b == 0).any(|var| var == wanted.as_bytes()) {
            return Some(pid);
        }
    }
    None
}
