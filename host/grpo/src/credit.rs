//! Credit for multi-turn episodes whose turns carry rewards of their own.
//!
//! verl and TRL give a multi-turn episode one advantage, from its outcome, on every model
//! token (tool output masked). wirl does the same with the outcome and, when an environment
//! rewards turns (`wirl:rl@0.2.0`), adds a turn term to each turn's tokens (the turn-level
//! credit of MT-GRPO, arXiv 2505.11821, generalised to any number of turns):
//!
//! - turn k's return is the sum of the turn rewards from k on, `R_k = Σ_{t ≥ k} r_t`: a turn
//!   is credited with what it and the turns after it earned, not with what came before it;
//! - among the group's episodes that reached turn k, `R_k` is made an advantage by the
//!   task's estimator (GRPO's `(R − mean) / (std + 1e-4)`, Dr. GRPO's `R − mean`, RLOO's
//!   leave-one-out); REINFORCE++ and pass@k, whose advantages are not a group's baseline,
//!   take the mean-centred `R − mean`;
//! - a token of turn k gets the episode's outcome advantage plus turn k's term.
//!
//! Without turn rewards every term is 0, and the credit is exactly the outcome's.

use crate::loss::{AdvantageMode, group_advantages};

/// Each episode's turn terms, one per turn it has: `turn_rewards[i][k]` is episode i's
/// turn-k reward. A turn that fewer than two episodes reached, or whose returns are equal
/// across them, has a term of 0.
pub fn turn_advantages(turn_rewards: &[Vec<f32>], mode: AdvantageMode) -> Vec<Vec<f32>> {
    let returns: Vec<Vec<f32>> = turn_rewards
        .iter()
        .map(|rewards| {
            // Summed in f64 and held to f32's range: turn rewards near f32::MAX do not sum to
            // infinity (which would make every term NaN).
            let mut sum = 0.0f64;
            let mut to_go: Vec<f32> = rewards
                .iter()
                .rev()
                .map(|&r| {
                    sum += f64::from(r);
                    sum.clamp(-f64::from(f32::MAX), f64::from(f32::MAX)) as f32
                })
                .collect();
            to_go.reverse();
            to_go
        })
        .collect();
    let mut terms: Vec<Vec<f32>> = returns.iter().map(|r| vec![0.0; r.len()]).collect();
    let centred = match mode {
        AdvantageMode::Grpo | AdvantageMode::MeanOnly | AdvantageMode::Rloo => mode,
        AdvantageMode::ReinforcePlusPlus | AdvantageMode::ReinforcePlusPlusBaseline | AdvantageMode::PassAtK => {
            AdvantageMode::MeanOnly
        }
    };
    let longest = returns.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..longest {
        let reached: Vec<usize> = (0..returns.len()).filter(|&i| returns[i].len() > k).collect();
        if reached.len() < 2 {
            continue;
        }
        let at_k: Vec<f32> = reached.iter().map(|&i| returns[i][k]).collect();
        if let Some(advantages) = group_advantages(&at_k, centred) {
            for (&i, a) in reached.iter().zip(advantages) {
                terms[i][k] = a;
            }
        }
    }
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_credited_with_what_it_and_later_turns_earned() {
        // Episode 0 earned at turn 1, episode 1 at turn 0; both reached turns 0 and 1.
        let terms = turn_advantages(&[vec![0.0, 1.0], vec![1.0, 0.0]], AdvantageMode::MeanOnly);
        // Turn 0: returns 1 and 1, equal: no term. Turn 1: returns 1 and 0.
        assert_eq!(terms, [vec![0.0, 0.5], vec![0.0, -0.5]]);
    }

    #[test]
    fn a_turn_only_one_episode_reached_has_no_term() {
        let terms = turn_advantages(&[vec![1.0, 2.0, 4.0], vec![0.0, 1.0], vec![3.0]], AdvantageMode::MeanOnly);
        // Turn 0 returns 7, 1, 3 (mean 11/3); turn 1: 6, 1 (mean 3.5); turn 2: episode 0 alone.
        let close = |a: f32, b: f32| (a - b).abs() < 1e-5;
        assert!(close(terms[0][0], 7.0 - 11.0 / 3.0) && close(terms[1][0], 1.0 - 11.0 / 3.0));
        assert!(close(terms[2][0], 3.0 - 11.0 / 3.0));
        assert_eq!((terms[0][1], terms[1][1]), (2.5, -2.5));
        assert_eq!(terms[0][2], 0.0);
        assert_eq!(terms[2].len(), 1);
    }

    #[test]
    fn the_estimator_is_the_tasks_and_no_rewards_give_no_terms() {
        let grpo = turn_advantages(&[vec![1.0], vec![0.0]], AdvantageMode::Grpo);
        let std = (0.5f32).sqrt();
        assert!((grpo[0][0] - 0.5 / (std + 1e-4)).abs() < 1e-5, "{grpo:?}");
        let rloo = turn_advantages(&[vec![1.0], vec![0.0]], AdvantageMode::Rloo);
        assert_eq!(rloo, [vec![1.0], vec![-1.0]]);
        let whitened = turn_advantages(&[vec![1.0], vec![0.0]], AdvantageMode::ReinforcePlusPlus);
        assert_eq!(whitened, [vec![0.5], vec![-0.5]]);
        let none = turn_advantages(&[vec![0.0, 0.0], vec![0.0]], AdvantageMode::Grpo);
        assert_eq!(none, [vec![0.0, 0.0], vec![0.0]]);
        assert!(turn_advantages(&[], AdvantageMode::Grpo).is_empty());
    }

    #[test]
    fn huge_turn_rewards_give_finite_terms() {
        let big = f32::MAX;
        let terms = turn_advantages(&[vec![big, big], vec![-big, 0.0]], AdvantageMode::Grpo);
        assert!(terms.iter().flatten().all(|a| a.is_finite()), "{terms:?}");
        assert!(terms[0][0] > 0.0 && terms[1][0] < 0.0, "{terms:?}");
    }
}
