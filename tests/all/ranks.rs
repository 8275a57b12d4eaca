//! Data parallelism in the learner: ranks (threads here, `ThreadComm`) each train on their
//! share of a step's groups, sum their gradients and take the same optimizer step — the
//! weights one learner reaches with every group, within float summation order.

use crate::hardening::{tiny_weights, two_epochs_with_kl};
use std::collections::HashMap;
use std::sync::Arc;
use wirl_engine::{Comm, Device, ThreadComm};
use wirl_grpo::{GroupBatch, Learner, UpdateStats};

/// Four groups of different prompts, lengths and advantages.
fn groups() -> Vec<GroupBatch> {
    (0..4u32)
        .map(|g| GroupBatch {
            prompt: (0..6 + g).map(|i| (i * 3 + g * 7) % 60 + 2).collect(),
            completions: vec![vec![3 + g, 9, 27], vec![5, 6 + g], vec![44, 1, 8, 10 + g]],
            advantages: vec![1.0 - g as f32 * 0.3, -0.5, 0.25 + g as f32 * 0.1],
            token_advantages: Vec::new(),
            trainable: Vec::new(),
            sampler_logprobs: Vec::new(),
            sampler_lag: 0,
        })
        .collect()
}

/// A learner over the tiny model (with a KL reference) in the group `ranks`.
fn learner(
    config: &wirl_engine::Config,
    tensors: &HashMap<String, candle_core::Tensor>,
    ranks: Arc<dyn Comm>,
) -> Learner {
    let policy = wirl_grpo::Policy::new(config, tensors, &Device::Cpu).unwrap();
    let vars: Vec<_> = policy.vars().iter().map(|(_, v)| v.clone()).collect();
    let reference = Some(policy.frozen_copy(&Device::Cpu).unwrap());
    let optimizer = wirl_grpo::optim::Optimizer::new(vars, 0.0).unwrap();
    Learner { ranks, ..Learner::new(policy, reference, optimizer) }
}

fn weights(learner: &Learner) -> Vec<f32> {
    learner
        .policy
        .vars()
        .iter()
        .flat_map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

/// A rank's weights after its steps, and each step's stats (`None`: abandoned).
type RankResult = anyhow::Result<(Vec<f32>, Vec<Option<UpdateStats>>)>;

/// Two steps on `shares` (each rank's groups), every rank in its own thread; each rank's
/// weights and last step's stats. `stop_on` asks that rank to stop during the first step.
fn run_ranks(shares: &[Vec<GroupBatch>], stop_on: Option<usize>) -> Vec<RankResult> {
    let (_dir, config, tensors) = tiny_weights();
    let comms = ThreadComm::group(shares.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(shares)
            .enumerate()
            .map(|(rank, (comm, share))| {
                let (config, tensors) = (&config, &tensors);
                scope.spawn(move || {
                    let mut learner = learner(config, tensors, Arc::new(comm));
                    let mut stats = Vec::new();
                    for step in 0..2 {
                        let stop = move || stop_on == Some(rank) && step == 0;
                        stats.push(learner.update(share, &two_epochs_with_kl(), None, &stop, &mut |_, _| {})?);
                    }
                    Ok((weights(&learner), stats))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn data_parallel_ranks_reach_one_learners_weights() {
    let all = groups();
    let one = run_ranks(std::slice::from_ref(&all), None).pop().unwrap().unwrap();
    let (one_weights, one_stats) = (one.0, one.1[1].clone().unwrap());
    // Adam's first steps are about lr × sign(g): a weight whose gradient is ~0 moves by float
    // noise (the ranks' sums add in another order), so the weights are held within a tenth
    // of one step (lr 1e-3); a group lost, counted twice or normalised by its rank's tokens
    // alone would move many by a whole step.
    let tolerance = 1e-4;
    for shares in [
        vec![all[..2].to_vec(), all[2..].to_vec()],
        vec![all[..3].to_vec(), all[3..].to_vec()],
        vec![all.clone(), Vec::new()],
        vec![all[..1].to_vec(), all[1..2].to_vec(), all[2..].to_vec()],
    ] {
        let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
        let ranks: Vec<_> = run_ranks(&shares, None).into_iter().map(Result::unwrap).collect();
        for (rank, (w, stats)) in ranks.iter().enumerate() {
            assert_eq!(w, &ranks[0].0, "{sizes:?}: rank {rank}'s weights are not rank 0's");
            let stats = stats[1].as_ref().unwrap();
            assert!((stats.loss - one_stats.loss).abs() < 1e-5, "{sizes:?}: loss {} vs {}", stats.loss, one_stats.loss);
            assert!((stats.kl - one_stats.kl).abs() < 1e-5, "{sizes:?}: kl {} vs {}", stats.kl, one_stats.kl);
            let norms = (stats.grad_norm, one_stats.grad_norm);
            assert!((norms.0 - norms.1).abs() < 1e-5 * norms.1, "{sizes:?}: gradient norm {norms:?}");
        }
        let worst = ranks[0].0.iter().zip(&one_weights).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("{sizes:?}: largest weight difference from one learner {worst:e}");
        assert!(worst < tolerance, "{sizes:?}: a weight differs from one learner's by {worst}");
    }
}

#[test]
fn a_rank_asked_to_stop_stops_every_rank_and_a_rank_that_fails_ends_the_others() {
    let all = groups();
    let (_dir, _, tensors) = tiny_weights();
    let start: Vec<f32> = {
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        names.iter().flat_map(|n| tensors[*n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
    };
    // Rank 1 is stopped in the first step: both ranks abandon it (nothing applied), then
    // both take the second.
    let ranks = run_ranks(&[all[..2].to_vec(), all[2..].to_vec()], Some(1));
    let one_step = run_ranks(&[all[..2].to_vec(), all[2..].to_vec()], None);
    for result in &ranks {
        let (w, stats) = result.as_ref().unwrap();
        assert!(stats[0].is_none(), "the stopped step was abandoned on every rank");
        assert!(stats[1].is_some());
        assert_ne!(w, &start);
        assert_ne!(w, &one_step[0].as_ref().unwrap().0, "only one step was taken");
    }

    // A rank that fails before the update (its comm dropped with its thread) ends the
    // other's update with an error naming it, instead of a hang.
    let (_dir, config, tensors) = tiny_weights();
    let mut comms = ThreadComm::group(2);
    let failed = comms.pop().unwrap();
    let survivor = comms.pop().unwrap();
    let error = std::thread::scope(|scope| {
        let handle = scope.spawn(|| {
            let mut learner = learner(&config, &tensors, Arc::new(survivor));
            learner.update(&all[..2], &two_epochs_with_kl(), None, &|| false, &mut |_, _| {}).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(failed);
        handle.join().unwrap()
    });
    let error = wirl_engine::error_chain(&error.expect_err("the survivor must fail"));
    assert!(error.contains("rank 1 left the group"), "{error}");
}

/// `wirl train --dp 2` (ranks as threads): the same rollouts and, within float summation
/// order, the same weights as one trainer after two steps; rank 0 alone writes the run; a
/// resume goes on with two ranks; with a generation lag too.
#[test]
fn wirl_train_on_two_ranks_trains_as_one_trainer_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&config, text).unwrap();
    let train = |run: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(&config)
            .arg("--run-dir")
            .arg(run)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    train(&one, &[]);
    train(&two, &["--dp", "2"]);
    let read = |run: &std::path::Path, name: &str| std::fs::read_to_string(run.join(name)).unwrap();
    // Each group keeps the seed of its place in the step: the ranks roll what one trainer does.
    assert_eq!(read(&one, "rollouts.jsonl"), read(&two, "rollouts.jsonl"));
    let (metrics_one, metrics_two) = (crate::grpo::metrics(&one), crate::grpo::metrics(&two));
    assert_eq!(metrics_two.len(), 2);
    for (a, b) in metrics_one.iter().zip(&metrics_two) {
        assert_eq!(a["groups_kept"], b["groups_kept"], "rank 0 measures every rank's groups");
        assert_eq!(a["reward_mean"], b["reward_mean"]);
        let (la, lb) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!((la - lb).abs() < 1e-5, "loss {la} vs {lb}");
    }
    let weights = |run: &std::path::Path| {
        let model = run.join("checkpoints/step-000002/model");
        let (_, _, tensors) = wirl_engine::load::load_tensors(&model, &Default::default()).unwrap();
        let mut names: Vec<_> = tensors.keys().cloned().collect();
        names.sort();
        names.iter().flat_map(|n| tensors[n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect::<Vec<f32>>()
    };
    let worst = weights(&one).iter().zip(&weights(&two)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("--dp 2 against one trainer: largest weight difference {worst:e}");
    assert!(worst < 1e-4, "a weight differs by {worst}");
    // Rank 0 alone wrote the run: the same files as one trainer's.
    let listing = |run: &std::path::Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(run).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    assert_eq!(listing(&one), listing(&two));

    // Stopped after step 1 and resumed on two ranks: the same records as the whole run.
    let parts = dir.path().join("parts");
    train(&parts, &["--dp", "2", "--steps", "1"]);
    let resumed = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", "--dp", "2", "--steps", "2", "--resume"])
        .arg(&parts)
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(read(&one, "rollouts.jsonl"), read(&parts, "rollouts.jsonl"));

    // With a generation lag each rank samples its share of the next step during the
    // update: still one trainer's records.
    let (lagged_one, lagged_two) = (dir.path().join("lagged-one"), dir.path().join("lagged-two"));
    train(&lagged_one, &["--set", "grpo.generation_lag=1", "--steps", "3"]);
    train(&lagged_two, &["--dp", "2", "--set", "grpo.generation_lag=1", "--steps", "3"]);
    assert_eq!(read(&lagged_one, "rollouts.jsonl"), read(&lagged_two, "rollouts.jsonl"));
    let lags: Vec<_> = crate::grpo::metrics(&lagged_two).iter().map(|m| m["sampler_lag"].clone()).collect();
    assert_eq!(lags, [0, 1, 1], "the later steps were sampled during the updates before them");
}

/// Ranks that do not start from the same config (here: another learning rate) refuse to
/// train, naming the rank and what differs — on every rank, none left waiting.
#[test]
fn ranks_that_disagree_on_their_config_refuse_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let text = std::fs::read_to_string(&path).unwrap();
    let config = wirl_trainer::TrainConfig::load(&path).unwrap();
    let mut other = config.clone();
    other.grpo.learning_rate = 0.02;
    let run = dir.path().join("run");
    wirl_trainer::run_dir::create(&run, &text, &config).unwrap();
    let model = dir.path().join("model");
    let control = wirl_trainer::Control::new();
    let mut comms = ThreadComm::group(2).into_iter();
    let (first, second) = (comms.next().unwrap(), comms.next().unwrap());
    let start = |config: wirl_trainer::TrainConfig, comm: ThreadComm| {
        let mut quiet = wirl_trainer::Quiet;
        let ranks: Arc<dyn Comm> = Arc::new(comm);
        wirl_trainer::Trainer::new(config, &model, &run, None, control.clone(), &mut quiet, ranks).unwrap()
    };
    // Rank 0 first: it writes the run's start that the other reads.
    let mut rank0 = start(config, first);
    let errors: Vec<String> = std::thread::scope(|scope| {
        let other_rank = scope.spawn(|| {
            let mut trainer = start(other, second);
            trainer.train(0, None, &mut wirl_trainer::Quiet).err().map(|e| wirl_engine::error_chain(&e))
        });
        let mine = rank0.train(0, None, &mut wirl_trainer::Quiet).err().map(|e| wirl_engine::error_chain(&e));
        vec![mine.expect("rank 0 refuses"), other_rank.join().unwrap().expect("rank 1 refuses")]
    });
    for error in &errors {
        assert!(error.contains("rank 1 disagrees with rank 0 on its config"), "{error}");
    }
}

/// `wirl generate --tp 2` (ranks as threads, each holding half of the heads, the MLP and the
/// vocabulary): the text one model writes, greedy and sampled with a seed; a split that does
/// not divide the heads is refused, naming the field.
#[test]
fn generate_on_two_tensor_parallel_ranks_writes_one_models_text() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), true);
    let generate = |tp: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["generate", "--prompt", "w2", "--max-tokens", "12", "--tp", tp, "--model"])
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for extra in [&["--temperature", "0"][..], &["--temperature", "1", "--seed", "7", "-n", "3"][..]] {
        let (ok1, one, said1) = generate("1", extra);
        let (ok2, two, said2) = generate("2", extra);
        assert!(ok1 && ok2, "{said1}\n{said2}");
        assert!(!one.trim().is_empty());
        assert_eq!(one, two, "{extra:?}");
    }
    let (ok, _, said) = generate("3", &[]);
    assert!(!ok && said.contains("tensor-parallel ranks"), "{said}");
}

/// `wirl serve --tp 2` (ranks as threads: the first batches and sends the other its plan
/// every turn): answers as one model does, greedy and seeded; stays whole through a client
/// that goes away mid-stream (its cancellation is part of the plan) and a burst of
/// concurrent requests (joining mid-batch), after which it still answers as one model.
#[test]
fn serve_on_two_tensor_parallel_ranks_answers_as_one_model() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), true);
    let one = crate::serve::Server::start_model(dir.path(), &[]);
    let two = crate::serve::Server::start_model(dir.path(), &["--tp", "2"]);
    let requests = [
        json!({"prompt": "w2", "max_tokens": 12, "temperature": 0}),
        json!({"prompt": "w3 w1", "max_tokens": 10, "temperature": 1, "seed": 7, "n": 3}),
    ];
    let answer = |server: &crate::serve::Server, body: &serde_json::Value| -> Vec<String> {
        let (status, value) = server.post("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{value}");
        value["choices"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_string()).collect()
    };
    let expected: Vec<Vec<String>> = requests.iter().map(|r| answer(&one, r)).collect();
    assert!(expected.iter().flatten().any(|text| !text.is_empty()));
    for (request, expected) in requests.iter().zip(&expected) {
        assert_eq!(&answer(&two, request), expected, "{request}");
    }
    drop(two.start_counting(400));
    std::thread::scope(|scope| {
        let burst: Vec<_> = (0..6)
            .map(|i| {
                let body = json!({"prompt": format!("w{} w{}", i + 1, i + 2), "max_tokens": 8 + i, "temperature": 1});
                let two = &two;
                scope.spawn(move || answer(two, &body))
            })
            .collect();
        for request in burst {
            assert_eq!(request.join().unwrap().len(), 1);
        }
    });
    for (request, expected) in requests.iter().zip(&expected) {
        assert_eq!(&answer(&two, request), expected, "after the burst: {request}");
    }
}

/// What `wirl serve --tp` cannot do is refused before it listens, saying why: no ranks, a
/// split that does not divide the heads, reloadable weights, a device this build lacks.
#[test]
fn serve_refuses_splits_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), true);
    let serve = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["serve", "--port", "0", "--model"])
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?} was served");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(serve(&["--tp", "0"]).contains("--tp must be at least 1"));
    assert!(serve(&["--tp", "3"]).contains("tensor-parallel ranks"));
    let weights = dir.path().to_str().unwrap();
    assert!(serve(&["--tp", "2", "--weights-dir", weights]).contains("--weights-dir"));
    if !cfg!(feature = "cuda") {
        assert!(serve(&["--tp", "2", "--device", "cuda"]).contains("built without CUDA"));
    }
}

/// A LoRA run (bf16 base, KL on) on two ranks: the adapters' gradients are what the ranks
/// sum; the run writes one trainer's rollouts and a PEFT adapter of the same values.
#[test]
fn a_lora_run_on_two_ranks_trains_as_one_trainer_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.05);
    let text = std::fs::read_to_string(&config).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&config, format!("{text}\n[lora]\nrank = 4\nalpha = 8\nbase_dtype = \"bf16\"\n")).unwrap();
    let train = |run: &std::path::Path, dp: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(&config)
            .args(["--dp", dp, "--run-dir"])
            .arg(run)
            .output()
            .unwrap();
        assert!(out.status.success(), "--dp {dp}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    train(&one, "1");
    train(&two, "2");
    let read = |run: &std::path::Path| std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
    assert_eq!(read(&one), read(&two));
    let adapter = |run: &std::path::Path| {
        let path = run.join("checkpoints/step-000002/adapter/adapter_model.safetensors");
        let tensors = candle_core::safetensors::load(path, &candle_core::Device::Cpu).unwrap();
        let mut names: Vec<_> = tensors.keys().cloned().collect();
        names.sort();
        names.iter().flat_map(|n| tensors[n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect::<Vec<f32>>()
    };
    let (a, b) = (adapter(&one), adapter(&two));
    assert!(!a.is_empty() && a.len() == b.len());
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "an adapter weight differs by {worst}");
}

/// More ranks than the step has groups (6 ranks, 4 groups): the ranks without a group still
/// take part in every step and the run equals one trainer's; out-of-range `--dp` and `--tp`
/// are refused by clap, naming the flag.
#[test]
fn more_ranks_than_groups_still_train_as_one_trainer_and_bad_counts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let wirl = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(args).output().unwrap();
    let run = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (one, six) = (run("one"), run("six"));
    let config = config.to_str().unwrap();
    for (path, dp) in [(&one, "1"), (&six, "6")] {
        let out = wirl(&["train", config, "--dp", dp, "--run-dir", path]);
        assert!(out.status.success(), "--dp {dp}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let read = |run: &str| std::fs::read_to_string(std::path::Path::new(run).join("rollouts.jsonl")).unwrap();
    assert_eq!(read(&one), read(&six));
    for args in [["train", "--dp", "0"], ["train", "--dp", "65"], ["generate", "--tp", "0"]] {
        let out = wirl(&args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(args[1]), "{args:?}: {said}");
    }
}
