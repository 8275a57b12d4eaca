//! Data parallelism in the learner: ranks (threads here, `ThreadComm`) each train on their
//! share of a step's groups, sum their gradients and take the same optimizer step — the
//! weights one learner reaches with every group, within float summation order.

use crate::hardening::{tiny_update_settings, tiny_weights};
use std::collections::HashMap;
use std::sync::Arc;
use wirl_engine::{Comm, Device, ThreadComm};
use wirl_grpo::{GroupBatch, Learner, UpdateSettings, UpdateStats};

/// Four groups of different prompts, lengths and advantages.
fn groups() -> Vec<GroupBatch> {
    (0..4u32)
        .map(|g| GroupBatch {
            prompt: (0..6 + g).map(|i| (i * 3 + g * 7) % 60 + 2).collect(),
            completions: vec![vec![3 + g, 9, 27], vec![5, 6 + g], vec![44, 1, 8, 10 + g]],
            advantages: vec![1.0 - g as f32 * 0.3, -0.5, 0.25 + g as f32 * 0.1],
            trainable: Vec::new(),
            sampler_logprobs: Vec::new(),
            sampler_lag: 0,
        })
        .collect()
}

fn settings() -> UpdateSettings {
    UpdateSettings {
        loss: wirl_grpo::loss::LossSettings { clip_low: 0.2, clip_high: 0.2, beta: 0.04, entropy: 0.01 },
        inner_epochs: 2,
        ..tiny_update_settings()
    }
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
                        stats.push(learner.update(share, &settings(), None, &stop, &mut |_, _| {})?);
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
            learner.update(&all[..2], &settings(), None, &|| false, &mut |_, _| {}).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(failed);
        handle.join().unwrap()
    });
    let error = format!("{:#}", error.expect_err("the survivor must fail"));
    assert!(error.contains("rank 1 left the group"), "{error}");
}
