//! wirl's objectives against the peers' own code (docs/ALGORITHMS.md): each loss, KL
//! estimator, aggregation and advantage estimator on the fixed inputs of
//! `tests/fixtures/algorithms.json`, whose values and gradients TRL's
//! `GRPOTrainer._compute_loss` and verl's `core_algos` computed (scripts/reference/algorithms.py).

use candle_core::{DType, Device, Tensor, Var};
use wirl_grpo::{AdvantageMode, Aggregation, KlEstimator, LossKind, LossSettings};

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/algorithms.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn matrix(value: &serde_json::Value) -> Vec<Vec<f32>> {
    serde_json::from_value::<Vec<Vec<f64>>>(value.clone())
        .unwrap()
        .iter()
        .map(|r| r.iter().map(|&x| x as f32).collect())
        .collect()
}

fn tensor(rows: &[Vec<f32>]) -> Tensor {
    Tensor::from_vec(rows.concat(), (rows.len(), rows[0].len()), &Device::Cpu).unwrap()
}

fn named<T: serde::de::DeserializeOwned>(name: &serde_json::Value) -> T {
    serde_json::from_value(name.clone()).unwrap()
}

/// Within 1e-6 of the peer's float64 value, relative to the value where it is above 1 (the
/// loss is computed in f32).
fn close(ours: f64, theirs: f64) -> bool {
    (ours - theirs).abs() <= 1e-6 * theirs.abs().max(1.0)
}

#[test]
fn every_loss_kl_and_aggregation_gives_the_peers_value_and_gradient() {
    let f = fixture();
    let mask = matrix(&f["mask"]);
    let lengths: Vec<usize> = mask.iter().map(|row| row.iter().filter(|&&m| m > 0.0).count()).collect();
    let (rows, width) = (mask.len(), mask[0].len());
    let max_tokens = f["max_tokens"].as_u64().unwrap() as usize;
    let logp = tensor(&matrix(&f["logp"]));
    let old = tensor(&matrix(&f["old_logp"]));
    let reference = tensor(&matrix(&f["ref_logp"]));
    let advantages: Vec<f32> = named::<Vec<f64>>(&f["advantages"]).iter().map(|&a| a as f32).collect();
    let advantages = Tensor::from_vec(advantages, rows, &Device::Cpu).unwrap();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let aggregation: Aggregation = named(&case["aggregation"]);
        let weights = wirl_grpo::token_weights(&lengths, width, aggregation, lengths.iter().sum(), rows, max_tokens);
        let weights = Tensor::from_vec(weights, (rows, width), &Device::Cpu).unwrap();
        let settings = LossSettings {
            clip_low: case["clip_low"].as_f64().unwrap(),
            clip_high: case["clip_high"].as_f64().unwrap(),
            beta: case["beta"].as_f64().unwrap(),
            entropy: 0.0,
            kind: named::<LossKind>(&case["loss"]),
            kl: named::<KlEstimator>(&case["kl"]),
            sapo_temperatures: case.get("sapo_temperatures").map_or(wirl_grpo::SAPO_TEMPERATURES, named),
        };
        let var = Var::from_tensor(&logp).unwrap();
        let parts =
            wirl_grpo::grpo_loss(var.as_tensor(), &old, Some(&reference), None, &advantages, &weights, &settings)
                .unwrap();
        let what = format!(
            "{} ({}, {:?}, β {}, ε_high {})",
            case["name"], case["peer"], aggregation, settings.beta, settings.clip_high
        );
        let value = f64::from(parts.loss.to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap());
        let expected = case["value"].as_f64().unwrap();
        assert!(close(value, expected), "{what}: loss {value} vs {expected}");
        let grad = parts.loss.backward().unwrap().get(var.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        let expected: Vec<Vec<f64>> = named(&case["grad"]);
        for (r, (ours, theirs)) in grad.iter().zip(&expected).enumerate() {
            for (t, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
                assert!(close(f64::from(a), b), "{what}: d loss / d logp[{r}][{t}] {a} vs {b}");
            }
        }
    }
}

#[test]
fn every_advantage_estimator_gives_the_peers_advantages() {
    let f = fixture();
    let rewards: Vec<f32> = named::<Vec<f64>>(&f["rewards"]).iter().map(|&r| r as f32).collect();
    for case in f["advantage_cases"].as_array().unwrap() {
        let mode: AdvantageMode = named(&case["mode"]);
        let ours = wirl_grpo::group_advantages(&rewards, mode).unwrap();
        let theirs: Vec<f64> = named(&case["advantages"]);
        for (a, b) in ours.iter().zip(&theirs) {
            assert!(close(f64::from(*a), *b), "{mode:?}: {ours:?} vs {theirs:?}");
        }
    }
}

/// Pass@k: only the best completion of a group is reinforced, by verl's margin; a group
/// whose best two tie trains nothing.
#[test]
fn pass_at_k_gives_verls_advantages() {
    let f = fixture();
    let cases = f["passk_cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let rewards: Vec<f32> = named::<Vec<f64>>(&case["rewards"]).iter().map(|&r| r as f32).collect();
        let theirs: Vec<f64> = named(&case["advantages"]);
        match wirl_grpo::group_advantages(&rewards, AdvantageMode::PassAtK) {
            None => assert!(theirs.iter().all(|&a| a == 0.0), "{case}"),
            Some(ours) => {
                assert_eq!(ours.iter().filter(|&&a| a != 0.0).count(), 1, "{case}: {ours:?}");
                for (a, b) in ours.iter().zip(&theirs) {
                    assert!(close(f64::from(*a), *b), "{case}: {ours:?}");
                }
            }
        }
    }
    assert!(cases.iter().any(|c| named::<Vec<f64>>(&c["advantages"]).iter().all(|&a| a == 0.0)));
}

#[test]
fn overlong_shaping_gives_the_peers_penalties() {
    let f = fixture();
    let cases = f["overlong_cases"].as_array().unwrap();
    assert!(cases.iter().any(|c| c["penalty"].as_f64().unwrap() < 0.0) && cases.iter().any(|c| c["penalty"] == 0));
    for case in cases {
        let n = |key: &str| case[key].as_u64().unwrap() as usize;
        let ours = wirl_grpo::overlong_penalty(
            n("length"),
            n("max_tokens"),
            n("buffer"),
            case["factor"].as_f64().unwrap() as f32,
        );
        assert!(close(f64::from(ours), case["penalty"].as_f64().unwrap()), "{case}: {ours}");
    }
}

/// REINFORCE++ (and its group-baseline form): the groups' advantages whitened over the
/// step's tokens give verl's, a group of equal rewards included.
#[test]
fn reinforce_plus_plus_whitens_as_the_peer_does() {
    let f = fixture();
    let groups: Vec<(Vec<f32>, Vec<usize>)> = f["whitening_groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let rewards: Vec<f64> = named(&g["rewards"]);
            (rewards.iter().map(|&r| r as f32).collect(), named(&g["tokens"]))
        })
        .collect();
    for case in f["whitening_cases"].as_array().unwrap() {
        let mode: AdvantageMode = named(&case["mode"]);
        assert!(mode.whitened());
        let before: Vec<Vec<f32>> = groups
            .iter()
            .map(|(rewards, _)| wirl_grpo::group_advantages(rewards, mode).expect("every group trains"))
            .collect();
        let mut whitening = wirl_grpo::Whitening::default();
        let each = |f: &mut dyn FnMut(f32, usize)| {
            for (advantages, (_, tokens)) in before.iter().zip(&groups) {
                advantages.iter().zip(tokens).for_each(|(&a, &n)| f(a, n));
            }
        };
        each(&mut |a, n| whitening.add(a, n));
        each(&mut |a, n| whitening.centre(a, n));
        let theirs: Vec<Vec<f64>> = named(&case["advantages"]);
        for (ours, theirs) in before.iter().zip(&theirs) {
            for (&a, &b) in ours.iter().zip(theirs) {
                let a = whitening.apply(a);
                assert!(close(f64::from(a), b), "{mode:?}: {a} vs {b}");
            }
        }
    }
}

/// What the issue asks of every objective beside its formula: a run stopped at a checkpoint
/// and resumed equals the uninterrupted one; two data-parallel ranks train as one trainer does
/// (the same rollouts, losses within 1e-5: REINFORCE++ whitens over every rank's tokens,
/// dynamic sampling draws on every rank alike); a LoRA adapter trains under it; a weighted
/// multi-task run with a multi-turn task (its token ledger) trains under it. GSPO and CISPO
/// with the KL term on (k2, so the estimator reaches the ranks and the resume too), and every
/// advantage estimator (REINFORCE++ whitening over ranks, k1 beside its baseline form, RLOO
/// with truncated completions masked, pass@k).
#[test]
fn each_objective_resumes_runs_on_two_ranks_and_trains_an_adapter() {
    use crate::grpo::{deterministic, metrics, resume, train_with, write_config};
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 4, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 3\ncheckpoint_every = 2");
    let text = text.replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&config, &text).unwrap();
    let multitask = crate::trainer::write_multitask_config(&dir.path().join("multi"), 2);
    let multitask_text = std::fs::read_to_string(&multitask).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&multitask, multitask_text).unwrap();
    let lora = dir.path().join("lora.toml");
    std::fs::write(&lora, format!("{text}\n[lora]\nrank = 4\nalpha = 8\n")).unwrap();
    let run = |config: &std::path::Path, name: &str, args: &[&str]| {
        let run_dir = dir.path().join(name);
        let out = train_with(config, &run_dir, args);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        run_dir
    };
    for (name, sets) in [
        ("gspo", &["grpo.loss=gspo", "grpo.aggregation=sequence-mean", "grpo.kl_estimator=k2"][..]),
        ("cispo", &["grpo.loss=cispo", "grpo.clip_high=4", "grpo.kl_estimator=k2"]),
        ("sapo", &["grpo.loss=sapo", "grpo.sapo_temperature_pos=0.5", "grpo.inner_epochs=2"]),
        ("reinforce++", &["grpo.advantage=reinforce++"]),
        ("reinforce++-baseline", &["grpo.advantage=reinforce++-baseline", "grpo.kl_estimator=k1"]),
        ("rloo", &["grpo.advantage=rloo", "grpo.mask_truncated=true"]),
        ("pass@k", &["grpo.advantage=pass@k"]),
        ("dapo", &["grpo.preset=dapo"]),
    ] {
        let mut args: Vec<&str> = sets.iter().flat_map(|set| ["--set", set]).collect();
        let whole = run(&config, &format!("{name}-whole"), &args);
        let mut first = args.clone();
        first.extend(["--steps", "2"]);
        let parts = run(&config, &format!("{name}-parts"), &first);
        let resumed = resume(&parts, 4);
        assert!(resumed.status.success(), "{name}: {}", String::from_utf8_lossy(&resumed.stderr));
        let (a, b) = (metrics(&whole), metrics(&parts));
        assert_eq!((a.len(), b.len()), (4, 4), "{name}");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(deterministic(x), deterministic(y), "{name}: resumed differs");
        }

        args.extend(["--steps", "2"]);
        let one = run(&config, &format!("{name}-one"), &args);
        args.extend(["--dp", "2"]);
        let two = run(&config, &format!("{name}-two"), &args);
        let read = |run: &std::path::Path| std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
        assert_eq!(read(&one), read(&two), "{name}: the ranks rolled other groups");
        for (x, y) in metrics(&one).iter().zip(&metrics(&two)) {
            let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
            assert!((lx - ly).abs() < 1e-5, "{name}: loss {lx} alone, {ly} on two ranks");
        }

        let mut adapter: Vec<&str> = sets.iter().flat_map(|set| ["--set", set]).collect();
        adapter.extend(["--steps", "2"]);
        let trained = run(&lora, &format!("{name}-lora"), &adapter);
        let steps = metrics(&trained);
        assert_eq!(steps.len(), 2, "{name}");
        assert!(steps.iter().all(|s| s["loss"].as_f64().is_some_and(f64::is_finite)), "{name}: {steps:?}");
        let checkpoint = trained.join("checkpoints/step-000002");
        assert!(checkpoint.join("adapter").is_dir() && !checkpoint.join("model").exists(), "{name}: not an adapter");

        let mut multi: Vec<&str> = sets.iter().flat_map(|set| ["--set", set]).collect();
        multi.extend(["--eval-tasks", "0"]);
        let steps = metrics(&run(&multitask, &format!("{name}-multi"), &multi));
        assert_eq!(steps.len(), 2, "{name}");
        assert!(steps.iter().all(|s| s["loss"].as_f64().is_some_and(f64::is_finite)), "{name}: {steps:?}");
        let turns: u64 = steps.iter().map(|s| s["episode_turns"].as_u64().unwrap_or(0)).sum();
        assert!(turns > 0, "{name}: the multi-turn task ran no episode");
    }
}

/// The KL in the reward (`grpo.kl_in_reward`): a completion's score less β × its summed KL
/// estimate, as verl's `apply_kl_penalty` makes token rewards and its outcome estimators sum
/// them (k1, k2 and k3 = verl's "kl", "mse", "low_var_kl", whose clamp at ±10 the second
/// half of the cases reach; two β), within 1e-6.
#[test]
fn the_kl_in_the_reward_shapes_scores_as_verl_does() {
    let fixture = fixture();
    let (reference, mask) = (matrix(&fixture["ref_logp"]), matrix(&fixture["mask"]));
    let cases = fixture["kl_in_reward_cases"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    for case in cases {
        let old = matrix(&case["old_logp"]);
        let estimator: KlEstimator = named(&case["estimator"]);
        let beta = case["beta"].as_f64().unwrap() as f32;
        for (row, score) in case["scores"].as_array().unwrap().iter().enumerate() {
            let trained: Vec<bool> = mask[row].iter().map(|&m| m > 0.5).collect();
            let penalty = wirl_grpo::kl_penalty(&old[row], &reference[row], Some(&trained), estimator, beta);
            let ours = score.as_f64().unwrap() - f64::from(penalty);
            let theirs = case["shaped"][row].as_f64().unwrap();
            assert!(close(ours, theirs), "{estimator:?} β {beta} row {row}: {ours} vs verl's {theirs}");
        }
    }
}

/// verl's adaptive KL controller (`grpo.kl_target`): the step's KL from the fixture's rows
/// (each row's mean estimate per token over its mask, averaged over the rows) and β after
/// each update, from below, at and past the target (the error clipped at ±0.2), within 1e-6.
#[test]
fn the_adaptive_kl_coefficient_moves_as_verls_controller() {
    let fixture = fixture();
    let (old, reference, mask) = (matrix(&fixture["old_logp"]), matrix(&fixture["ref_logp"]), matrix(&fixture["mask"]));
    let cases = fixture["kl_controller_cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    let number = |value: &serde_json::Value| value.as_f64().unwrap();
    for case in cases {
        let estimator: KlEstimator = named(&case["estimator"]);
        let rows = old.len();
        let current: f64 = (0..rows)
            .map(|row| {
                let trained: Vec<bool> = mask[row].iter().map(|&m| m > 0.5).collect();
                wirl_grpo::kl_estimate(&old[row], &reference[row], Some(&trained), estimator).mean()
            })
            .sum::<f64>()
            / rows as f64;
        let theirs = number(&case["current_kl"]);
        assert!(close(current, theirs), "{estimator:?}: the step's KL {current}, verl's {theirs}");
        let mut adaptive = wirl_grpo::AdaptiveKl {
            value: number(&case["beta"]),
            target: number(&case["target"]),
            horizon: number(&case["horizon"]),
        };
        let later = case["later_kls"].as_array().unwrap().iter().map(number);
        let values = case["values"].as_array().unwrap().iter().map(number);
        for (kl, theirs) in std::iter::once(theirs).chain(later).zip(values) {
            adaptive.update(kl, rows);
            assert!(close(adaptive.value, theirs), "{estimator:?} at KL {kl}: β {}, verl's {theirs}", adaptive.value);
        }
    }
}

/// `grpo.kl_target` end to end: β starts at `beta` and moves after each step by verl's rule
/// from that step's KL over its shaped completions (the metrics' `kl_coef`, `reward_kl`); a
/// run stopped at a checkpoint and resumed goes on with the β it had reached (the whole
/// run's metrics); two ranks move it as one trainer; without a target it stays put; each
/// key without what it needs, or out of range, is refused by name.
#[test]
fn the_adaptive_kl_coefficient_trains_resumes_and_runs_on_ranks() {
    use crate::grpo::{deterministic, metrics, resume, train_with, write_config};
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 4, 0.05);
    let text = std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 3\ncheckpoint_every = 2");
    std::fs::write(&config, text).unwrap();
    let run = |name: &str, args: &[&str]| {
        let run_dir = dir.path().join(name);
        let out = train_with(&config, &run_dir, args);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        run_dir
    };
    let keys = ["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_target=0.001", "grpo.kl_horizon=24"];
    let mut args: Vec<&str> = keys.iter().flat_map(|set| ["--set", *set]).collect();
    let whole = metrics(&run("whole", &args));
    assert_eq!(whole.len(), 4);
    let field = |m: &serde_json::Value, key: &str| m[key].as_f64().unwrap_or_else(|| panic!("no {key} in {m}"));
    assert_eq!(field(&whole[0], "kl_coef"), 0.5);
    for pair in whole.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert_eq!(before["trajectories_masked"], 0);
        let completions = before["groups_kept"].as_u64().unwrap() as f64 * 6.0;
        let error = (field(before, "reward_kl") / 0.001 - 1.0).clamp(-0.2, 0.2);
        let expected = field(before, "kl_coef") * (1.0 + error * completions / 24.0);
        let got = field(after, "kl_coef");
        assert!((got - expected).abs() < 1e-9 * expected, "step {}: β {got}, the rule's {expected}", after["step"]);
    }
    assert_ne!(field(&whole[1], "kl_coef"), 0.5, "β did not move");
    // TensorBoard has them too (as verl logs its reward KL and coefficient), and the draws.
    let events: Vec<_> =
        std::fs::read_dir(dir.path().join("whole/tensorboard")).unwrap().map(|e| e.unwrap().path()).collect();
    let scalars = wirl_trainer::tensorboard::read_scalars(&events[0]).unwrap();
    assert_eq!(scalars.len(), 1 + 4, "the version record and four steps");
    for (step, values) in scalars.iter().skip(1) {
        let value = |tag: &str| values.iter().find(|(t, _)| t == tag).unwrap_or_else(|| panic!("no {tag}")).1;
        let m = &whole[*step as usize - 1];
        assert_eq!(value("kl/coef"), field(m, "kl_coef") as f32, "step {step}");
        assert_eq!(value("kl/reward"), field(m, "reward_kl") as f32, "step {step}");
        assert_eq!(value("groups/draws"), 1.0, "step {step}");
    }
    let plot = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("plot")
        .arg(dir.path().join("whole"))
        .output()
        .unwrap();
    assert!(plot.status.success(), "{}", String::from_utf8_lossy(&plot.stderr));

    let mut first = args.clone();
    first.extend(["--steps", "2"]);
    let parts = run("parts", &first);
    let resumed = resume(&parts, 4);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    for (x, y) in whole.iter().zip(&metrics(&parts)) {
        assert_eq!(deterministic(x), deterministic(y), "resumed differs");
    }

    args.extend(["--dp", "2"]);
    let ranks = metrics(&run("ranks", &args));
    assert_eq!(ranks.len(), 4);
    for (one, two) in whole.iter().zip(&ranks) {
        let (a, b) = (field(one, "kl_coef"), field(two, "kl_coef"));
        assert!((a - b).abs() < 1e-6 * a, "β {a} alone, {b} on two ranks");
        let (a, b) = (field(one, "loss"), field(two, "loss"));
        assert!((a - b).abs() < 1e-5, "loss {a} alone, {b} on two ranks");
    }

    let fixed = dir.path().join("fixed");
    let out =
        train_with(&config, &fixed, &["--steps", "2", "--set", "grpo.beta=0.5", "--set", "grpo.kl_in_reward=true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fixed = metrics(&fixed);
    assert!(fixed.iter().all(|m| field(m, "kl_coef") == 0.5), "{fixed:?}");
    // The console shows the rewards' KL and β (the loss has no KL term to show).
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("kl(reward) ") && said.contains(" β 0.5000 "), "{said}");

    for (sets, said) in [
        (&["grpo.beta=0.5", "grpo.kl_target=0.01"][..], "`grpo.kl_target` = 0.01 without `grpo.kl_in_reward`"),
        (&["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_target=0"], "`grpo.kl.target` = 0: it must be"),
        (&["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_target=nan"], "`grpo.kl.target` = NaN"),
        (&["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_horizon=24"], "`grpo.kl_horizon` = 24 without"),
        (
            &["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_target=0.01", "grpo.kl_horizon=0"],
            "`grpo.kl.horizon` = 0",
        ),
        // 12 completions a step: a horizon of 2 could take β below 0 in one step.
        (
            &["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_target=0.01", "grpo.kl_horizon=2"],
            "prompts_per_step × group_size = 12",
        ),
    ] {
        let args: Vec<&str> = sets.iter().flat_map(|set| ["--set", *set]).collect();
        let out = train_with(&config, &dir.path().join("refused"), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(said), "{sets:?}: {stderr}");
        assert!(!dir.path().join("refused").exists());
    }
}

/// `grpo.kl_in_reward = true` end to end: at step 1 the policy is the reference, so the KL
/// (the sampler's log-probs against the reference's) is ~0 and the step is a β-0 run's; later
/// steps differ from it (the KL reached the rewards, and nothing else did: the loss has no
/// KL term). Two ranks, each shaping its own groups, train as one trainer does. Without a β
/// it is refused, naming the key.
#[test]
fn the_kl_in_the_reward_trains_and_needs_a_beta() {
    use crate::grpo::{metrics, train_with, write_config};
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 3, 0.05);
    let losses = |name: &str, sets: &[&str]| -> Vec<f64> {
        let mut args = vec!["--eval-tasks", "0"];
        args.extend(sets.iter().flat_map(|set| ["--set", *set]));
        let out = train_with(&config, &dir.path().join(name), &args);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.path().join(name)).iter().map(|m| m["loss"].as_f64().unwrap()).collect()
    };
    let plain = losses("plain", &[]);
    let keys = ["grpo.beta=0.5", "grpo.kl_in_reward=true", "grpo.kl_estimator=k1"];
    let shaped = losses("shaped", &keys);
    assert_eq!((plain.len(), shaped.len()), (3, 3));
    // A KL misaligned by one token moved step 1's loss by 7.5e-5 (tried).
    assert!((plain[0] - shaped[0]).abs() < 1e-6, "step 1: {} vs {}", plain[0], shaped[0]);
    assert_ne!(plain[1..], shaped[1..], "the KL in the reward changed nothing");
    let mut args = vec!["--eval-tasks", "0", "--dp", "2"];
    args.extend(keys.iter().flat_map(|set| ["--set", *set]));
    let out = train_with(&config, &dir.path().join("ranks"), &args);
    assert!(out.status.success(), "ranks: {}", String::from_utf8_lossy(&out.stderr));
    let ranks = metrics(&dir.path().join("ranks"));
    assert_eq!(ranks.len(), 3);
    for (one, two) in shaped.iter().zip(ranks) {
        let two = two["loss"].as_f64().unwrap();
        assert!((one - two).abs() < 1e-5, "loss {one} alone, {two} on two ranks");
    }
    let out = train_with(&config, &dir.path().join("refused"), &["--set", "grpo.kl_in_reward=true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("`grpo.kl_in_reward`") && stderr.contains("beta"), "{stderr}");
}
