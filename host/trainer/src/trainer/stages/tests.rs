//! Each stage on groups made by hand: no model, no plugin, no rank.

use super::*;
use crate::config::GrpoSection;
use wirl_grpo::Overlong;
use wirl_rollout::{Scored, Status, Trajectory};
use wirl_sandbox::Task;

fn trajectory(tokens: usize) -> Trajectory {
    Trajectory { tokens: vec![7; tokens], logprobs: vec![-0.5; tokens], ..Trajectory::empty() }
}

fn scored(reward: f32) -> Scored {
    Scored { reward, ..Scored::default() }
}

/// A group of `rewards`, each completion `tokens` long; a `None` reward is a masked one.
fn group(rewards: &[Option<f32>], tokens: usize) -> RolloutGroup {
    RolloutGroup {
        task_name: "t".into(),
        task: Task { id: "p".into(), messages: Vec::new(), answer: None, metadata: None },
        prompt: vec![1, 2, 3],
        trajectories: rewards.iter().map(|_| trajectory(tokens)).collect(),
        scores: rewards
            .iter()
            .map(|r| match r {
                Some(r) => scored(*r),
                None => Scored { status: Status::Masked, ..Scored::default() },
            })
            .collect(),
    }
}

fn objective() -> Objective {
    GrpoSection::default().objective()
}

fn with_advantage(advantage: AdvantageMode) -> Objective {
    Objective { advantage, ..objective() }
}

/// Groups of one task, from one draw and rank.
fn groups_of(list: Vec<RolloutGroup>) -> Groups {
    let mut groups = Groups::default();
    for g in list {
        groups.push(0, (0, 0), g);
    }
    groups
}

#[test]
fn a_signal_needs_two_usable_trajectories_whose_rewards_differ() {
    let o = objective();
    let (usable, rewards) = signal(&group(&[Some(1.0), None, Some(0.0)], 4), &o, 64, false).unwrap();
    assert_eq!(usable, [0, 2], "the masked trajectory takes no part");
    assert_eq!(rewards, [1.0, 0.0]);
    assert!(signal(&group(&[Some(1.0), Some(1.0)], 4), &o, 64, false).is_none(), "equal rewards");
    assert!(signal(&group(&[Some(1.0), None], 4), &o, 64, false).is_none(), "one usable");
    let mut no_prompt = group(&[Some(1.0), Some(0.0)], 4);
    no_prompt.prompt.clear();
    assert!(signal(&no_prompt, &o, 64, false).is_none(), "a placeholder has no prompt");
}

#[test]
fn equal_rewards_carry_a_signal_when_whitened_or_distilled() {
    let equal = group(&[Some(1.0), Some(1.0)], 4);
    assert!(signal(&equal, &with_advantage(AdvantageMode::ReinforcePlusPlus), 64, false).is_some());
    assert!(signal(&equal, &objective(), 64, true).is_some(), "a teacher tells tokens apart");
}

#[test]
fn overlong_shaping_is_read_against_the_tasks_max_tokens() {
    let o = Objective { overlong: Some(Overlong { buffer: 4, penalty: 1.0 }), ..objective() };
    let mut g = group(&[Some(1.0), Some(1.0)], 2);
    g.trajectories[1] = trajectory(10);
    // max_tokens 10, buffer 4: past 6 tokens a completion loses (length − 6) / 4.
    let (_, rewards) = signal(&g, &o, 10, false).unwrap();
    assert_eq!(rewards, [1.0, 0.0]);
    assert!(signal(&g, &o, 100, false).is_none(), "far from the limit neither is shaped");
}

#[test]
fn dynamic_sampling_trains_the_first_groups_with_signal_draw_by_draw_then_rank_by_rank() {
    // This rank (1 of 2): draw 0 has groups a (signal), b (none); draw 1 has c, d (both signal).
    let mut mine = Groups::default();
    for (draw, _) in [(0, 'a'), (0, 'b'), (1, 'c'), (1, 'd')] {
        mine.push(0, (draw, 1), group(&[Some(1.0), Some(0.0)], 2));
    }
    let signal = [true, false, true, true];
    let local = signal_cells(&mine, &signal, 2, 3);
    assert_eq!(local, [0.0, 1.0, 0.0, 2.0, 0.0, 0.0], "cells draw × ranks + rank");
    // Rank 0 had 2 with signal in draw 0 and 1 in draw 1: summed, every rank sees the same.
    let summed: Vec<f32> = local.iter().zip([2.0, 0.0, 1.0, 0.0, 0.0, 0.0]).map(|(a, b)| a + b).collect();
    // Places: draw 0 rank 0 → 0, 1; rank 1's a → 2; draw 1 rank 0 → 3; rank 1's c → 4, d → 5.
    assert_eq!(first_with_signal(&mine, &signal, &summed, 2, 5), [true, false, true, false]);
    assert_eq!(first_with_signal(&mine, &signal, &summed, 2, 6), [true, false, true, true]);
    assert_eq!(first_with_signal(&mine, &signal, &summed, 2, 2), [false; 4], "rank 0 filled the step");
}

#[test]
fn batches_count_unusable_groups_and_keep_only_those_that_train() {
    let o = objective();
    let mut groups = groups_of(vec![
        group(&[Some(1.0), Some(0.0)], 3), // trains
        group(&[Some(1.0), None], 3),      // unusable
        group(&[Some(1.0), Some(1.0)], 3), // no signal
        group(&[Some(0.0), Some(1.0)], 3), // has signal, not picked
    ]);
    groups.owners = vec![0, 1, 1, 0];
    let signals: Vec<Signal> = groups.iter().map(|(g, _)| signal(g, &o, 64, false)).collect();
    let out = batches(&groups, signals, &[true, true, true, false], 2, &o, 1, false);
    assert_eq!(out.batches.len(), 1);
    assert_eq!(out.kept_of_task, [1, 0]);
    assert_eq!(out.unusable_of_task, [0, 1]);
    let batch = &out.batches[0];
    assert_eq!(batch.prompt, [1, 2, 3]);
    assert_eq!(batch.completions, [vec![7; 3], vec![7; 3]]);
    assert!(batch.advantages[0] > 0.0 && batch.advantages[1] < 0.0);
    assert_eq!(batch.sampler_logprobs, [vec![-0.5; 3], vec![-0.5; 3]]);
    assert_eq!(batch.sampler_lag, 1, "the step's own draw keeps the lag");
    assert!(batch.trainable.is_empty() && batch.token_advantages.is_empty(), "every token trains");
}

#[test]
fn an_extra_draw_was_sampled_without_a_lag_and_truncated_completions_can_be_masked() {
    let o = Objective { mask_truncated: true, ..objective() };
    let mut g = group(&[Some(1.0), Some(0.0)], 3);
    g.trajectories[1].finish = FinishReason::Length;
    let mut groups = Groups::default();
    groups.push(0, (1, 0), g);
    let signals = vec![signal(&groups.groups[0], &o, 64, false)];
    let out = batches(&groups, signals, &[true], 1, &o, 1, false);
    let batch = &out.batches[0];
    assert_eq!(batch.sampler_lag, 0);
    assert_eq!(batch.trainable, [vec![true; 3], vec![false; 3]], "the truncated one carries no loss");
    assert!(batch.advantages[1] < 0.0, "but still counts in its group's advantages");
}

#[test]
fn equal_rewards_train_under_a_teacher_with_zero_advantages() {
    let o = objective();
    let groups = groups_of(vec![group(&[Some(1.0), Some(1.0)], 2)]);
    let signals = vec![signal(&groups.groups[0], &o, 64, true)];
    let out = batches(&groups, signals.clone(), &[true], 1, &o, 0, true);
    assert_eq!(out.batches[0].advantages, [0.0, 0.0]);
    assert_eq!(batches(&groups, signals, &[true], 1, &o, 0, false).batches.len(), 0, "no teacher, no batch");
}

#[test]
fn turn_rewards_are_credited_to_their_turns_tokens() {
    let o = objective();
    let mut g = group(&[Some(1.0), Some(1.0)], 4);
    for (i, t) in g.trajectories.iter_mut().enumerate() {
        t.turn_starts = vec![0, 2];
        t.trainable = vec![true, true, false, true];
        g.scores[i].turn_rewards = vec![if i == 0 { 1.0 } else { 0.0 }];
    }
    let groups = groups_of(vec![g]);
    let signals = vec![signal(&groups.groups[0], &o, 64, false)];
    assert!(signals[0].is_some(), "equal outcomes, turns told apart");
    let batch = &batches(&groups, signals, &[true], 1, &o, 0, false).batches[0];
    assert_eq!(batch.advantages, [0.0, 0.0]);
    assert_eq!(batch.trainable[0], [true, true, false, true], "the ledger's environment token carries no loss");
    let first = &batch.token_advantages[0];
    assert!(first[0] > 0.0 && first[0] == first[1], "the first turn's term on its tokens");
    assert_eq!(first[2..], [0.0, 0.0], "the second turn had no reward of its own");
}

#[test]
fn whitening_centres_and_scales_over_every_trained_token() {
    let o = with_advantage(AdvantageMode::ReinforcePlusPlus);
    let groups = groups_of(vec![group(&[Some(1.0), Some(0.0)], 1), group(&[Some(3.0), Some(3.0)], 3)]);
    let signals: Vec<Signal> = groups.iter().map(|(g, _)| signal(g, &o, 64, false)).collect();
    let mut out = batches(&groups, signals, &[true, true], 1, &o, 0, false);
    let mut calls = 0;
    whiten(&mut out.batches, o.advantage, |_| {
        calls += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(calls, 2, "the sums, then the squares, go to the other ranks");
    // Token-weighted over 1 + 1 + 3 + 3 tokens, the variance Bessel-corrected (verl's
    // `masked_whiten`).
    let whitened: Vec<f32> = out.batches.iter().flat_map(|b| b.advantages.clone()).collect();
    let tokens = [1.0f32, 1.0, 3.0, 3.0];
    let n: f32 = tokens.iter().sum();
    let mean: f32 = whitened.iter().zip(tokens).map(|(a, w)| a * w).sum::<f32>() / n;
    let var: f32 = whitened.iter().zip(tokens).map(|(a, w)| (a - mean).powi(2) * w).sum::<f32>() / (n - 1.0);
    assert!(mean.abs() < 1e-5, "mean {mean}");
    assert!((var - 1.0).abs() < 1e-4, "variance {var}");
    // Not whitened: untouched, nothing sent.
    let before = out.batches.clone();
    whiten(&mut out.batches, AdvantageMode::Grpo, |_| panic!("nothing to sum")).unwrap();
    let advantages = |batches: &[GroupBatch]| batches.iter().map(|b| b.advantages.clone()).collect::<Vec<_>>();
    assert_eq!(advantages(&before), advantages(&out.batches));
}

#[test]
fn the_update_begins_the_next_step_by_lag_then_overlap() {
    let base = GrpoSection { steps: 3, ..GrpoSection::default() };
    let lag = GrpoSection { generation_lag: 1, overlap: true, ..base.clone() };
    let overlap = GrpoSection { generation_lag: 0, overlap: true, ..base.clone() };
    let neither = GrpoSection { generation_lag: 0, overlap: false, ..base.clone() };
    assert_eq!(begin_next(&lag, 1, false), BeginNext::DrawAndSample);
    assert_eq!(begin_next(&lag, 1, true), BeginNext::Draw, "stopped: nothing sampled, overlap still draws");
    assert_eq!(begin_next(&overlap, 2, false), BeginNext::Draw);
    assert_eq!(begin_next(&neither, 1, false), BeginNext::Nothing);
    for g in [&lag, &overlap, &neither] {
        assert_eq!(begin_next(g, 3, false), BeginNext::Nothing, "no step after the last");
    }
}

#[test]
fn figures_count_passes_masks_failures_and_model_tokens() {
    let mut g = group(&[Some(1.0), Some(0.5), None], 4);
    g.scores[2].failures = vec!["deadline".into()];
    g.scores[0].parts.insert("format".into(), 1.0);
    g.trajectories[1].trainable = vec![true, false, false, true];
    let f = Figures::of([(&g, 1.0)].into_iter());
    assert_eq!((f.masked, f.scored), (1, 2));
    assert_eq!(f.pass_rate, 0.5);
    assert_eq!(f.reward_mean, 0.75);
    assert_eq!(f.reward_std, 0.25);
    assert_eq!(f.parts["format"], 0.5);
    assert_eq!(f.failures["deadline"], 1);
    assert_eq!((f.tokens, f.tokens_max), (4 + 2 + 4, 4), "a ledger counts the model's tokens");
}

#[test]
fn step_metrics_are_read_from_the_steps_values() {
    let groups = {
        let mut groups = groups_of(vec![group(&[Some(1.0), Some(0.0)], 3)]);
        groups.push(1, (0, 0), group(&[Some(1.0), None], 5));
        groups
    };
    let o = objective();
    let signals: Vec<Signal> = groups.iter().map(|(g, _)| signal(g, &o, 64, false)).collect();
    let Batched { batches, kept_of_task, unusable_of_task } = batches(&groups, signals, &[true, true], 3, &o, 1, false);
    let advantaged = Advantaged {
        batches,
        kept_of_task,
        unusable_of_task,
        sampler_lag: 1,
        reward_kl: RewardKl::default(),
        distill: None,
    };
    let stats = UpdateStats { loss: 0.25, kl: 0.125, ..UpdateStats::default() };
    let distill = DistillFigures { kl_sum: 3.0, tokens: 6, seconds: 2.0 };
    let updated = Updated { stats, learning_rate: 1e-6, reward_kl: Some((0.1, 0.02)), distill: Some(distill) };
    let skipped = [(1, SkippedTask { index: 4, id: None, reason: "too long".into() })];
    let tasks = ["a", "b", "off"];
    let run = |kl_reported| RunFacts {
        tasks: tasks.iter().zip([1, 1, 0]).map(|(name, groups)| TaskFacts { name, pass_reward: 1.0, groups }).collect(),
        manifest_generation: 2,
        kl_reported,
    };
    let measured = || Measured {
        peaks: PhasePeaks::default(),
        peak_rss: Some(100),
        clock: Clock { sampling_span: 2.0, train: 3.0, ..Clock::default() },
        episodes: EpisodeTimes::default(),
        started: Instant::now(),
        prompt_positions: (5, 7),
        rewards_inference: Default::default(),
    };
    let outcome = |measured| Outcome {
        step: 4,
        groups: &groups,
        advantaged: &advantaged,
        updated: &updated,
        skipped: &skipped,
        draws: 2,
        measured,
    };
    let m = step_metrics(&run(true), outcome(measured()));
    assert_eq!((m.step, m.manifest_generation, m.draws, m.learning_rate), (5, 2, 2, 1e-6));
    assert_eq!((m.groups_kept, m.groups_unusable, m.trajectories_masked, m.trajectories_scored), (1, 1, 1, 3));
    assert_eq!((m.loss, m.kl, m.sampler_lag), (0.25, 0.125, 1));
    assert_eq!((m.kl_coef, m.reward_kl, m.distill_kl), (Some(0.1), Some(0.02), Some(0.5)));
    assert_eq!((m.time_s.teacher, m.time_s.train), (2.0, 3.0));
    assert_eq!((m.completion_tokens, m.generate_tokens_per_s), (3 + 3 + 5 + 5, 8.0));
    assert_eq!((m.prompt_positions_cached, m.prompt_positions_computed, m.peak_rss_mib), (5, 7, Some(100)));
    assert_eq!(m.tasks_skipped[0].task_name, "b");
    assert_eq!(m.tasks.keys().collect::<Vec<_>>(), ["a", "b"], "a task given no groups is not reported");
    assert_eq!((m.tasks["a"].groups_kept, m.tasks["b"].groups_unusable, m.tasks["b"].tasks_skipped), (1, 1, 1));
    assert_eq!(m.tasks["b"].pass_rate, 1.0);
    assert_eq!(step_metrics(&run(false), outcome(measured())).kl, 0.0, "no KL term: none reported");
}
