//! Weighted multi-task: how many of a step's groups each task gets, by Megatron-RL's rule
//! (`weighted_multi_task.py`): weights normalised over the tasks that train; each task's
//! exact share `groups × weight` rounded down, the remainder given one by one to the largest
//! fractional parts (ties to the earlier task); then every task with a positive weight that
//! got nothing takes one group from the most over-served task that has at least two. Fewer
//! groups than weighted tasks is an error; a weight of 0 is never sampled.

/// A step's groups per task.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// Groups per task, in the order of the weights given.
    pub groups: Vec<usize>,
    /// Each task's share of the groups as allocated (what the weights became).
    pub effective: Vec<f64>,
    /// Whether rounding moved any task's share away from its normalised weight.
    pub moved: bool,
}

/// Why no allocation exists.
#[derive(Clone, Debug, PartialEq)]
pub enum MixtureError {
    /// A weight that is negative, NaN or infinite (its position).
    BadWeight(usize),
    /// No task has a positive weight.
    NothingToSample,
    /// Fewer groups per step than tasks with a positive weight.
    TooFewGroups { groups: usize, weighted: usize },
}

impl std::fmt::Display for MixtureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MixtureError::BadWeight(i) => write!(f, "tasks[{i}].weight must be a finite number >= 0"),
            MixtureError::NothingToSample => {
                write!(f, "no task has a positive weight (eval_only tasks and weight 0 are never trained on)")
            }
            MixtureError::TooFewGroups { groups, weighted } => write!(
                f,
                "{groups} groups per step cannot give each of the {weighted} weighted tasks one: raise \
                 grpo.prompts_per_step to at least {weighted}, or give some tasks weight 0"
            ),
        }
    }
}

impl std::error::Error for MixtureError {}

/// Split `groups` among tasks of these `weights` (an `eval_only` task is given as 0).
pub fn allocate(weights: &[f64], groups: usize) -> Result<Allocation, MixtureError> {
    if let Some(i) = weights.iter().position(|w| !(w.is_finite() && *w >= 0.0)) {
        return Err(MixtureError::BadWeight(i));
    }
    let weighted = weights.iter().filter(|&&w| w > 0.0).count();
    if weighted == 0 {
        return Err(MixtureError::NothingToSample);
    }
    // Scaled by the largest first, so that a sum of huge weights cannot overflow.
    let largest = weights.iter().copied().fold(0.0, f64::max);
    let weights: Vec<f64> = weights.iter().map(|w| w / largest).collect();
    let total: f64 = weights.iter().sum();
    if groups < weighted {
        return Err(MixtureError::TooFewGroups { groups, weighted });
    }
    let normalised: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let exact: Vec<f64> = normalised.iter().map(|w| groups as f64 * w).collect();
    let mut counts: Vec<usize> = exact.iter().map(|x| x.floor() as usize).collect();
    let remaining = groups - counts.iter().sum::<usize>();
    // Largest fractional part first; a stable sort keeps the earlier task first on ties.
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &i in order.iter().take(remaining) {
        counts[i] += 1;
    }
    // Every weighted task gets a group, taken from the most over-served one that can spare it.
    for starved in 0..weights.len() {
        if weights[starved] > 0.0 && counts[starved] == 0 {
            let donor = (0..weights.len())
                .filter(|&i| counts[i] >= 2)
                .max_by(|&a, &b| {
                    let over = |i: usize| counts[i] as f64 - exact[i];
                    // `max_by` keeps the last of equals: compare reversed indices for the first.
                    over(a).total_cmp(&over(b)).then(b.cmp(&a))
                })
                .expect("groups >= weighted tasks leaves a task with two groups while one has none");
            counts[donor] -= 1;
            counts[starved] += 1;
        }
    }
    let effective: Vec<f64> = counts.iter().map(|&c| c as f64 / groups as f64).collect();
    let moved = effective.iter().zip(&normalised).any(|(e, w)| (e - w).abs() > 1e-9);
    Ok(Allocation { groups: counts, effective, moved })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(weights: &[f64], total: usize) -> Vec<usize> {
        allocate(weights, total).unwrap().groups
    }

    #[test]
    fn exact_shares_are_kept_and_not_reported_as_moved() {
        let a = allocate(&[0.5, 0.5], 4).unwrap();
        assert_eq!(a.groups, [2, 2]);
        assert!(!a.moved);
        // Weights need not sum to 1.
        assert_eq!(groups(&[3.0, 1.0], 8), [6, 2]);
    }

    #[test]
    fn the_remainder_goes_to_the_largest_fractional_parts_ties_to_the_earlier_task() {
        // 10 × (0.25, 0.35, 0.4) = 2.5, 3.5, 4.0 → 2, 3, 4 and one left: the tie 0.5 = 0.5
        // goes to the first.
        assert_eq!(groups(&[0.25, 0.35, 0.4], 10), [3, 3, 4]);
        // Three equal tasks, four groups: the first gets the extra one, and that is a move.
        let a = allocate(&[1.0, 1.0, 1.0], 4).unwrap();
        assert_eq!(a.groups, [2, 1, 1]);
        assert!(a.moved);
        assert_eq!(a.effective, [0.5, 0.25, 0.25]);
        // 7 × (0.6, 0.3, 0.1) = 4.2, 2.1, 0.7 → 4, 2, 0 and one left for the largest part (0.7).
        assert_eq!(groups(&[0.6, 0.3, 0.1], 7), [4, 2, 1]);
    }

    #[test]
    fn a_weighted_task_rounded_to_nothing_takes_a_group_from_the_most_over_served() {
        // 4 × (0.9, 0.1) = 3.6, 0.4 → 4, 0 by remainders; the second takes one from the first.
        assert_eq!(groups(&[0.9, 0.1], 4), [3, 1]);
        // 5 × (0.46, 0.46, 0.08) = 2.3, 2.3, 0.4 → 2, 2, 1 by remainders already.
        assert_eq!(groups(&[0.46, 0.46, 0.08], 5), [2, 2, 1]);
        // 6 × (0.5, 0.45, 0.025, 0.025) = 3, 2.7, 0.15, 0.15 → 3, 3, 0, 0 by remainders. The
        // third takes from the second (over by 0.3, the first by 0); then the fourth from the
        // first (over by 0; the second, left with 2, is under by 0.7).
        assert_eq!(groups(&[0.5, 0.45, 0.025, 0.025], 6), [2, 2, 1, 1]);
    }

    #[test]
    fn zero_weights_are_never_sampled_and_errors_name_the_cause() {
        assert_eq!(groups(&[1.0, 0.0, 1.0], 4), [2, 0, 2]);
        assert_eq!(allocate(&[1.0, 1.0, 1.0], 2), Err(MixtureError::TooFewGroups { groups: 2, weighted: 3 }));
        assert_eq!(allocate(&[0.0, 0.0], 4), Err(MixtureError::NothingToSample));
        assert_eq!(allocate(&[1.0, f64::NAN], 4), Err(MixtureError::BadWeight(1)));
        assert_eq!(allocate(&[-1.0, 2.0], 4), Err(MixtureError::BadWeight(0)));
        assert_eq!(allocate(&[], 4), Err(MixtureError::NothingToSample));
        assert!(allocate(&[1.0, 1.0, 1.0], 2).unwrap_err().to_string().contains("prompts_per_step"));
    }

    #[test]
    fn every_allocation_sums_to_the_groups_and_serves_every_weighted_task() {
        let weight_sets: [&[f64]; 6] =
            [&[1.0], &[0.7, 0.2, 0.1], &[5.0, 1.0, 1.0, 0.01], &[1e-9, 1.0], &[1e300, 1.0], &[f64::MAX, f64::MAX, 1.0]];
        for weights in weight_sets {
            for total in weights.len()..40 {
                let a = allocate(weights, total).unwrap();
                assert_eq!(a.groups.iter().sum::<usize>(), total, "{weights:?} {total}");
                assert!(a.groups.iter().all(|&g| g >= 1), "{weights:?} {total}: {:?}", a.groups);
            }
        }
    }
}
