//! The GRPO objective, after Megatron-RL's `rl_utils.py` and its peers (../shared/REFERENCE.md):
//! group-normalised advantages, a clipped importance ratio with separate low/high ε, a k3 KL
//! penalty to a frozen reference, an optional entropy bonus, and a choice of how token losses
//! are aggregated. Host-side arithmetic (advantages, weights) is plain Rust so that it can be
//! checked against hand-computed values; the per-token loss is tensor code so that it
//! differentiates.

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// How an advantage is computed from a group's rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdvantageMode {
    /// `(r − mean) / (std + 1e-4)`, std with Bessel's correction (GRPO, Megatron-RL).
    Grpo,
    /// `r − mean`, no division (Dr. GRPO).
    MeanOnly,
    /// `r − mean of the others`, the leave-one-out baseline (RLOO; verl's `rloo`:
    /// `(n·r − Σr) / (n − 1)`).
    Rloo,
    /// REINFORCE++: the reward itself, whitened over the step's trained tokens
    /// ([`Whitening`]); no group baseline, so a group whose rewards are equal trains too.
    #[serde(rename = "reinforce++")]
    ReinforcePlusPlus,
    /// REINFORCE++ with the group's mean subtracted first (verl's
    /// `reinforce_plus_plus_baseline`), then whitened over the step's trained tokens.
    #[serde(rename = "reinforce++-baseline")]
    ReinforcePlusPlusBaseline,
    /// Pass@k training (arXiv 2503.19595; verl's `grpo_passk`): only the group's best
    /// completion is reinforced, by `(r_max − r_second) / (std + 1e-6)`; the others get 0.
    #[serde(rename = "pass@k")]
    PassAtK,
}

impl AdvantageMode {
    /// Whether the step's advantages are whitened over its tokens after the groups' own
    /// ([`Whitening`]): then every group trains, even one whose rewards are all equal.
    pub fn whitened(self) -> bool {
        matches!(self, AdvantageMode::ReinforcePlusPlus | AdvantageMode::ReinforcePlusPlusBaseline)
    }
}

/// REINFORCE++'s batch normalisation: every trained token of the step carries its
/// sequence's advantage, and they are whitened together — `(A − mean) / sqrt(var + 1e-8)`,
/// mean and variance (Bessel-corrected) over the tokens, as verl's `masked_whiten` does. The
/// sums add over micro-batches and ranks: [`Whitening::add`] each sequence, then sum
/// [`Whitening::sums`] over ranks before [`Whitening::centre`], and again for the squares.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Whitening {
    /// Σ tokens · A, Σ tokens.
    pub sums: [f64; 2],
    /// Σ tokens · (A − mean)², once the mean is known.
    pub squares: f64,
}

impl Whitening {
    /// Count a sequence of `tokens` trained tokens with advantage `advantage`.
    pub fn add(&mut self, advantage: f32, tokens: usize) {
        self.sums[0] += f64::from(advantage) * tokens as f64;
        self.sums[1] += tokens as f64;
    }

    /// The tokens' mean advantage.
    pub fn mean(&self) -> f64 {
        if self.sums[1] > 0.0 { self.sums[0] / self.sums[1] } else { 0.0 }
    }

    /// Count a sequence's squared distance from the mean (the second pass).
    pub fn centre(&mut self, advantage: f32, tokens: usize) {
        self.squares += (f64::from(advantage) - self.mean()).powi(2) * tokens as f64;
    }

    /// `advantage` whitened.
    pub fn apply(&self, advantage: f32) -> f32 {
        let n = self.sums[1];
        let variance = if n > 1.0 { self.squares / n * n / (n - 1.0) } else { 0.0 };
        ((f64::from(advantage) - self.mean()) / (variance + 1e-8).sqrt()) as f32
    }
}

/// How the policy term weighs each token's log-probability (docs/ALGORITHMS.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum LossKind {
    /// PPO's clipped surrogate per token, `−min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)`
    /// with `r = π/π_old` (GRPO, DAPO's clip-higher).
    #[default]
    Grpo,
    /// The same clip on the sequence's ratio `s = exp(mean_t log(π/π_old))` over its
    /// trained tokens (GSPO; TRL's `importance_sampling_level = "sequence"`).
    Gspo,
    /// `−sg(min(r, 1 + ε_high))·A·log π` per token: the importance weight clipped and
    /// detached, every token's gradient kept (CISPO, MiniMax-M1; no lower bound).
    Cispo,
    /// `−σ(τ·(r − 1))·(4/τ)·A` per token: a soft gate in place of the clip, τ one temperature
    /// for positive advantages and another for the rest (SAPO, Qwen; TRL `loss_type =
    /// "sapo"`). Its gradient is the plain policy gradient at r = 1 and fades away from it.
    Sapo,
}

/// A `grpo.loss` name wirl has no loss for; its text says what to set instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownLoss(String);

impl LossKind {
    pub const ALL: [LossKind; 4] = [LossKind::Grpo, LossKind::Gspo, LossKind::Cispo, LossKind::Sapo];

    /// Its name in a config (`grpo.loss`).
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Grpo => "grpo",
            LossKind::Gspo => "gspo",
            LossKind::Cispo => "cispo",
            LossKind::Sapo => "sapo",
        }
    }
}

impl TryFrom<String> for LossKind {
    type Error = UnknownLoss;

    /// A loss by name; TRL's `loss_type` names that are not a loss here are answered with
    /// what they are in wirl, since users bring their TRL settings along.
    fn try_from(name: String) -> std::result::Result<Self, UnknownLoss> {
        if let Some(kind) = LossKind::ALL.into_iter().find(|kind| kind.name() == name) {
            return Ok(kind);
        }
        let refuse = |text: String| Err(UnknownLoss(text));
        match name.as_str() {
            "dr_grpo" | "dapo" => refuse(format!(
                "`{name}` is a preset here, not a loss: set grpo.preset = \"{name}\" (docs/ALGORITHMS.md)"
            )),
            "bnpo" => refuse(
                "`bnpo` is TRL's token mean over each randomly drawn micro-batch, averaged over \
                 the micro-batches; with one micro-batch a step it is the token mean, wirl's default \
                 (grpo.loss = \"grpo\" with grpo.aggregation = \"token-mean\", TRL's `dapo`). wirl does \
                 not let how a step is split for memory change its loss (docs/ALGORITHMS.md)"
                    .to_string(),
            ),
            other => {
                let names: Vec<String> = LossKind::ALL.iter().map(|kind| format!("`{}`", kind.name())).collect();
                refuse(format!("unknown loss `{other}`, expected one of {}", names.join(", ")))
            }
        }
    }
}

/// How the KL penalty to the reference is estimated per token, from `d = log π − log π_ref`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// `d` (unbiased, may be negative).
    K1,
    /// `d² / 2`.
    K2,
    /// `exp(−d) + d − 1` (unbiased, never negative: GRPO's, TRL's).
    #[default]
    K3,
}

impl KlEstimator {
    /// This estimate of KL(π ‖ π_ref) at one token, from `d = logp − ref_logp`, as verl's
    /// `kl_penalty` computes it for the reward: "kl", "mse", and "low_var_kl" clamped to ±10
    /// (reached where π_old is ~2.5 nats below π_ref; the loss's k3, TRL's, has no clamp). In
    /// f64: a sum over a completion's tokens follows.
    pub fn at(self, logp: f32, ref_logp: f32) -> f64 {
        let d = f64::from(logp) - f64::from(ref_logp);
        match self {
            KlEstimator::K1 => d,
            KlEstimator::K2 => d * d / 2.0,
            KlEstimator::K3 => ((-d).exp() + d - 1.0).clamp(-10.0, 10.0),
        }
    }
}

/// One completion's KL in the reward (verl's `apply_kl_penalty`, summed over the row as its
/// outcome advantages sum token rewards): β × Σ over its trained tokens (`trained`: `None`,
/// every one) of `estimator` between `old` (π_old) and `reference` log-probs.
pub fn kl_penalty(old: &[f32], reference: &[f32], trained: Option<&[bool]>, estimator: KlEstimator, beta: f32) -> f32 {
    kl_estimate(old, reference, trained, estimator).penalty(f64::from(beta))
}

/// One completion's KL estimate against the reference over its trained tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KlEstimate {
    /// Σ over the trained tokens of the estimator.
    pub sum: f64,
    /// How many tokens are trained.
    pub tokens: usize,
}

impl KlEstimate {
    /// The reward's penalty under coefficient β.
    pub fn penalty(self, beta: f64) -> f32 {
        (beta * self.sum) as f32
    }

    /// The mean over the trained tokens (verl's `masked_mean` of the row: 0 without any).
    pub fn mean(self) -> f64 {
        if self.tokens == 0 { 0.0 } else { self.sum / self.tokens as f64 }
    }
}

/// [`KlEstimate`] of one completion: `estimator` between `old` (π_old) and `reference`
/// log-probs over its trained tokens (`trained`: `None`, every one).
pub fn kl_estimate(old: &[f32], reference: &[f32], trained: Option<&[bool]>, estimator: KlEstimator) -> KlEstimate {
    let counted = |i: &usize| trained.is_none_or(|mask| mask[*i]);
    let (sum, tokens) = (0..old.len())
        .filter(counted)
        .fold((0.0, 0), |(sum, tokens), i| (sum + estimator.at(old[i], reference[i]), tokens + 1));
    KlEstimate { sum, tokens }
}

/// The KL coefficient of the reward's penalty, adapted towards a target KL (Ziegler et al.
/// 2019, arXiv 1909.08593; verl's `AdaptiveKLController`, `algorithm.kl_ctrl.type =
/// "adaptive"`): after each step, `β ← β · (1 + clip(KL / target − 1, ±0.2) · n / horizon)`,
/// KL the mean over the step's `n` completions of each one's mean estimate per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveKl {
    /// β now.
    pub value: f64,
    pub target: f64,
    pub horizon: f64,
}

impl AdaptiveKl {
    /// verl's default `horizon` (`algorithm.kl_ctrl.horizon`), in completions.
    pub const DEFAULT_HORIZON: usize = 10_000;

    /// One step's update from its mean `current` KL over `completions`.
    pub fn update(&mut self, current: f64, completions: usize) {
        let error = (current / self.target - 1.0).clamp(-0.2, 0.2);
        self.value *= 1.0 + error * completions as f64 / self.horizon;
    }
}

/// How per-token losses are summed into the step's loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Mean over every completion token of the step (DAPO; TRL's default).
    TokenMean,
    /// Mean over each completion's tokens, then over completions (the original GRPO).
    SequenceMean,
    /// Sum over tokens divided by completions × max completion tokens (Dr. GRPO): no length bias.
    Constant,
}

/// Advantages of one group's rewards. A group whose rewards are all equal carries no signal:
/// `None` (the trainer drops it). Rewards must be finite (the sandbox fails a plugin that
/// returns NaN or infinity).
///
/// Computed in f32, as every run before, unless a sum or square would overflow there
/// (rewards like 1e30 and 0): then in f64, so that large rewards still give advantages
/// instead of silently zeroing them.
pub fn group_advantages(rewards: &[f32], mode: AdvantageMode) -> Option<Vec<f32>> {
    let n = rewards.len();
    if n == 0 {
        return None;
    }
    // REINFORCE++: before the step's whitening (a group of equal rewards still trains).
    match mode {
        AdvantageMode::ReinforcePlusPlus => return Some(rewards.to_vec()),
        AdvantageMode::ReinforcePlusPlusBaseline => {
            let mean = rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / n as f64;
            return Some(rewards.iter().map(|&r| (f64::from(r) - mean) as f32).collect());
        }
        AdvantageMode::PassAtK => return pass_at_k(rewards),
        _ => {}
    }
    if rewards.iter().all(|&r| r == rewards[0]) {
        return None;
    }
    let advantages = centred(rewards, mode);
    let mean = rewards.iter().sum::<f32>() / n as f32;
    if mean.is_finite() && advantages.iter().all(|a| a.is_finite()) && advantages.iter().any(|&a| a != 0.0) {
        return Some(advantages);
    }
    let rewards: Vec<f64> = rewards.iter().map(|&r| f64::from(r)).collect();
    // Mean-only advantages of huge rewards are huge: clamp to what f32 holds.
    Some(
        centred(&rewards, mode)
            .into_iter()
            .map(|a| a.clamp(-f64::from(f32::MAX), f64::from(f32::MAX)) as f32)
            .collect(),
    )
}

/// The arithmetic a group's baseline needs, in f32 (every run's numbers) or in f64 (rewards
/// whose sums or squares overflow f32).
trait Real:
    Copy
    + PartialEq
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::iter::Sum
{
    /// GRPO's std offset, 1e-4.
    const STD_OFFSET: Self;
    fn count(n: usize) -> Self;
    fn square(self) -> Self;
    fn sqrt(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const STD_OFFSET: $t = 1e-4;
            fn count(n: usize) -> $t {
                n as $t
            }
            fn square(self) -> $t {
                self.powi(2)
            }
            fn sqrt(self) -> $t {
                <$t>::sqrt(self)
            }
        }
    };
}
real!(f32);
real!(f64);

/// The group-baseline advantages (GRPO's, Dr. GRPO's mean-only, RLOO's) of rewards that
/// differ, in `R`'s precision: the one definition the f32 and f64 paths share.
fn centred<R: Real>(rewards: &[R], mode: AdvantageMode) -> Vec<R> {
    let n = rewards.len();
    let mean = rewards.iter().copied().sum::<R>() / R::count(n);
    // The leave-one-out baseline's scale: n / (n − 1) (a single completion has no other).
    let loo = R::count(n) / R::count(n.max(2) - 1);
    match mode {
        AdvantageMode::MeanOnly => rewards.iter().map(|&r| r - mean).collect(),
        AdvantageMode::Rloo => rewards.iter().map(|&r| r * loo - mean * loo).collect(),
        AdvantageMode::Grpo => {
            let var = rewards.iter().map(|&r| (r - mean).square()).sum::<R>() / R::count(n.max(2) - 1);
            let std = var.sqrt();
            rewards.iter().map(|&r| (r - mean) / (std + R::STD_OFFSET)).collect()
        }
        AdvantageMode::ReinforcePlusPlus | AdvantageMode::ReinforcePlusPlusBaseline | AdvantageMode::PassAtK => {
            unreachable!("REINFORCE++'s and pass@k's advantages are computed before the group's baseline")
        }
    }
}

/// Pass@k's advantages: the best completion (the first of equals) gets the margin by which
/// it beats the next best, over the group's std (Bessel-corrected, + 1e-6, as verl); the
/// others 0. `None` when the best two tie (nothing to reinforce). In f64.
fn pass_at_k(rewards: &[f32]) -> Option<Vec<f32>> {
    let n = rewards.len();
    if n < 2 {
        return None;
    }
    let rewards: Vec<f64> = rewards.iter().map(|&r| f64::from(r)).collect();
    let best = (1..n).fold(0, |best, i| if rewards[i] > rewards[best] { i } else { best });
    let second = (0..n).filter(|&i| i != best).map(|i| rewards[i]).fold(f64::NEG_INFINITY, f64::max);
    if rewards[best] == second {
        return None;
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let mut advantages = vec![0.0f32; n];
    advantages[best] = ((rewards[best] - second) / (std + 1e-6)).min(f64::from(f32::MAX)) as f32;
    Some(advantages)
}

/// DAPO's soft overlong penalty, added to the reward of a completion of `length` tokens
/// under a limit of `max_tokens`: 0 up to `max_tokens − buffer` tokens, then falling linearly
/// to `−factor` at the limit (verl's DAPO reward manager: `min(−(length − (max − buffer)) /
/// buffer · factor, 0)`). `buffer` 0: none.
pub fn overlong_penalty(length: usize, max_tokens: usize, buffer: usize, factor: f32) -> f32 {
    if buffer == 0 {
        return 0.0;
    }
    let expected = max_tokens.saturating_sub(buffer);
    let exceed = length.saturating_sub(expected) as f32;
    (-exceed / buffer as f32 * factor).min(0.0)
}

/// Per-token weights that turn a sum of token losses into the chosen aggregation over the
/// whole step, so that micro-batches summed by gradient accumulation give the step's loss.
/// `lengths` are the completion lengths of one micro-batch; `step_tokens` / `step_sequences`
/// count the whole step; `max_tokens` is the completion limit.
pub fn token_weights(
    lengths: &[usize],
    width: usize,
    aggregation: Aggregation,
    step_tokens: usize,
    step_sequences: usize,
    max_tokens: usize,
) -> Vec<f32> {
    let mut weights = vec![0f32; lengths.len() * width];
    for (row, &len) in lengths.iter().enumerate() {
        let w = match aggregation {
            Aggregation::TokenMean => 1.0 / step_tokens.max(1) as f32,
            Aggregation::SequenceMean => 1.0 / (len.max(1) * step_sequences.max(1)) as f32,
            Aggregation::Constant => 1.0 / (step_sequences.max(1) * max_tokens.max(1)) as f32,
        };
        weights[row * width..row * width + len.min(width)].fill(w);
    }
    weights
}

/// [`token_weights`] for sequences of which only some tokens are trained on (a multi-turn
/// ledger: the model's turns, not the environment's): `trainable[row][i]` says whether token
/// i of the row is. A sequence's length, for the aggregation, is its trainable tokens, and
/// `step_tokens` counts only trainable tokens; all trainable, it equals [`token_weights`].
pub fn masked_token_weights(
    trainable: &[Vec<bool>],
    width: usize,
    aggregation: Aggregation,
    step_tokens: usize,
    step_sequences: usize,
    max_tokens: usize,
) -> Vec<f32> {
    let lengths: Vec<usize> = trainable.iter().map(|row| row.iter().filter(|&&t| t).count()).collect();
    let mut weights = token_weights(&lengths, width, aggregation, step_tokens, step_sequences, max_tokens);
    for (row, mask) in trainable.iter().enumerate() {
        let w = weights[row * width];
        let line = &mut weights[row * width..(row + 1) * width];
        line.fill(0.0);
        for (slot, &t) in line.iter_mut().zip(mask) {
            if t {
                *slot = w;
            }
        }
    }
    weights
}

/// Settings of the per-token objective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSettings {
    pub clip_low: f64,
    pub clip_high: f64,
    /// KL coefficient β (0: no reference model is kept).
    pub beta: f64,
    /// Entropy bonus coefficient (0: none).
    pub entropy: f64,
    /// The policy term.
    pub kind: LossKind,
    /// The KL penalty's estimator (with `beta` > 0).
    pub kl: KlEstimator,
    /// SAPO's temperatures: for tokens of positive advantage, and for the rest.
    pub sapo_temperatures: [f64; 2],
}

/// SAPO's temperatures as its paper and TRL set them (τ_pos, τ_neg).
pub const SAPO_TEMPERATURES: [f64; 2] = [1.0, 1.05];

impl LossSettings {
    /// GRPO's loss with the k3 KL: what every run before these choices trained with.
    pub fn grpo(clip_low: f64, clip_high: f64, beta: f64, entropy: f64) -> Self {
        LossSettings {
            clip_low,
            clip_high,
            beta,
            entropy,
            kind: LossKind::Grpo,
            kl: KlEstimator::K3,
            sapo_temperatures: SAPO_TEMPERATURES,
        }
    }
}

/// The step's loss over one micro-batch, and what it is made of.
pub struct LossParts {
    /// Scalar to differentiate.
    pub loss: Tensor,
    /// Weighted sums (same weights as the loss) for metrics.
    pub kl: f32,
    pub clip_fraction: f32,
    pub entropy: f32,
}

/// `logp`, `old_logp`, `ref_logp`, `entropy`, `weights`: `[rows, width]`; `advantages`:
/// `[rows]`, or `[rows, width]` for a per-token advantage (one carrying an importance
/// weight). Padding positions have weight 0.
pub fn grpo_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: Option<&Tensor>,
    entropy: Option<&Tensor>,
    advantages: &Tensor,
    weights: &Tensor,
    settings: &LossSettings,
) -> Result<LossParts> {
    let advantages = if advantages.rank() == 1 { advantages.unsqueeze(1)? } else { advantages.clone() };
    let active = weights.gt(0.0)?.to_dtype(weights.dtype())?;
    let log_ratio = (logp - old_logp)?;
    let ratio = match settings.kind {
        LossKind::Grpo | LossKind::Cispo | LossKind::Sapo => log_ratio.exp()?,
        LossKind::Gspo => {
            // The geometric mean of the sequence's token ratios over its trained tokens,
            // the same for each of them: `[rows, 1]`, broadcast below.
            let tokens = active.sum_keepdim(1)?.maximum(1.0)?;
            ((log_ratio * &active)?.sum_keepdim(1)? / tokens)?.exp()?.broadcast_as(logp.shape())?
        }
    };
    let (mut per_token, was_clipped) = match settings.kind {
        LossKind::Grpo | LossKind::Gspo => {
            let unclipped = ratio.broadcast_mul(&advantages)?;
            let clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)?.broadcast_mul(&advantages)?;
            (unclipped.minimum(&clipped)?.neg()?, clipped.lt(&unclipped)?)
        }
        LossKind::Cispo => {
            let cap = 1.0 + settings.clip_high;
            let weight = ratio.minimum(cap)?.detach();
            (weight.broadcast_mul(&advantages)?.mul(logp)?.neg()?, ratio.gt(cap)?)
        }
        LossKind::Sapo => {
            let [positive, negative] = settings.sapo_temperatures;
            // τ per advantage: `positive` where A > 0, `negative` elsewhere.
            let temperature = ((advantages.gt(0.0)?.to_dtype(logp.dtype())? * (positive - negative))? + negative)?;
            let gate = candle_nn::ops::sigmoid(&(ratio - 1.0)?.broadcast_mul(&temperature)?)?;
            let soft = (gate * 4.0)?.broadcast_div(&temperature)?;
            // Nothing is clipped: the gate only fades (the clip fraction reads 0).
            (soft.broadcast_mul(&advantages)?.neg()?, logp.zeros_like()?.ne(0.0)?)
        }
    };
    let clip_fraction = {
        let was_clipped = was_clipped.to_dtype(weights.dtype())?;
        let tokens = active.sum_all()?.to_scalar::<f32>()?;
        if tokens > 0.0 { (was_clipped * &active)?.sum_all()?.to_scalar::<f32>()? / tokens } else { 0.0 }
    };
    let mut kl = 0.0;
    if let (Some(reference), true) = (ref_logp, settings.beta > 0.0) {
        let estimate = match settings.kl {
            // k1: log π − log π_ref.
            KlEstimator::K1 => (logp - reference)?,
            // k2: (log π − log π_ref)² / 2.
            KlEstimator::K2 => ((logp - reference)?.sqr()? * 0.5)?,
            // k3: exp(ref − cur) − (ref − cur) − 1, unbiased and always ≥ 0.
            KlEstimator::K3 => {
                let delta = (reference - logp)?;
                ((delta.exp()? - &delta)? - 1.0)?
            }
        };
        kl = (estimate.detach() * weights)?.sum_all()?.to_scalar::<f32>()?;
        per_token = (per_token + (estimate * settings.beta)?)?;
    }
    let mut entropy_sum = 0.0;
    if let Some(entropy) = entropy {
        entropy_sum = (entropy.detach() * weights)?.sum_all()?.to_scalar::<f32>()?;
        if settings.entropy > 0.0 {
            per_token = (per_token - (entropy * settings.entropy)?)?;
        }
    }
    let loss = (per_token * weights)?.sum_all()?;
    Ok(LossParts { loss, kl, clip_fraction, entropy: entropy_sum })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn close(a: f32, b: f32) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }

    #[test]
    fn advantages_by_hand() {
        // rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3) = 0.57735.
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], AdvantageMode::Grpo).unwrap();
        close(a[0], 0.5 / (0.577_350_3 + 1e-4));
        close(a[1], -0.5 / (0.577_350_3 + 1e-4));
        let a = group_advantages(&[2.0, 0.0, 1.0], AdvantageMode::MeanOnly).unwrap();
        assert_eq!(a, vec![1.0, -1.0, 0.0]);
        assert_eq!(group_advantages(&[0.5; 8], AdvantageMode::Grpo), None, "zero variance is filtered");
        assert_eq!(group_advantages(&[], AdvantageMode::Grpo), None);
    }

    #[test]
    fn huge_rewards_do_not_overflow_the_advantages() {
        // In f32, (1e30 - mean)² overflows: the std is infinite and every advantage 0.
        let a = group_advantages(&[1e30, 0.0, 0.0, 0.0], AdvantageMode::Grpo).unwrap();
        assert!(a.iter().all(|x| x.is_finite()), "{a:?}");
        assert!((a[0] - 1.5).abs() < 1e-4 && (a[1] + 0.5).abs() < 1e-4, "{a:?}");
        let a = group_advantages(&[f32::MAX, -f32::MAX], AdvantageMode::MeanOnly).unwrap();
        assert!(a.iter().all(|x| x.is_finite()) && a[0] > 0.0 && a[1] < 0.0, "{a:?}");
        // Ordinary rewards give the f32 values of every earlier run, bit for bit.
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], AdvantageMode::Grpo).unwrap();
        let std = (4.0f32 * 0.25 / 3.0).sqrt();
        assert_eq!(a[0], 0.5 / (std + 1e-4));
    }

    #[test]
    fn aggregation_weights_by_hand() {
        // Two completions of 2 and 4 tokens, padded to 4; the step has 3 completions, 10 tokens.
        let w = token_weights(&[2, 4], 4, Aggregation::TokenMean, 10, 3, 8);
        assert_eq!(w, vec![0.1, 0.1, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1]);
        let w = token_weights(&[2, 4], 4, Aggregation::SequenceMean, 10, 3, 8);
        close(w[0], 1.0 / 6.0);
        close(w[4], 1.0 / 12.0);
        assert_eq!(w[2], 0.0);
        let w = token_weights(&[2, 4], 4, Aggregation::Constant, 10, 3, 8);
        close(w[0], 1.0 / 24.0);
        close(w[7], 1.0 / 24.0);
    }

    fn t(rows: &[&[f32]]) -> Tensor {
        let width = rows[0].len();
        Tensor::from_vec(rows.concat(), (rows.len(), width), &Device::Cpu).unwrap()
    }

    #[test]
    fn clipped_surrogate_kl_and_entropy_by_hand() {
        let settings = LossSettings::grpo(0.2, 0.28, 0.0, 0.0);
        // Token ratios e^0.5 = 1.6487 (above 1 + 0.28) and e^-0.5 = 0.6065 (below 1 − 0.2).
        let logp = t(&[&[0.0, 0.0]]);
        let old = t(&[&[-0.5, 0.5]]);
        let weights = t(&[&[0.5, 0.5]]);
        // Positive advantage: the high ratio is clipped to 1.28, the low one kept (min).
        let adv = Tensor::new(&[2.0f32], &Device::Cpu).unwrap();
        let parts = grpo_loss(&logp, &old, None, None, &adv, &weights, &settings).unwrap();
        let expected = -(0.5 * 1.28 * 2.0 + 0.5 * (-0.5f32).exp() * 2.0);
        close(parts.loss.to_scalar::<f32>().unwrap(), expected);
        close(parts.clip_fraction, 0.5);
        // Negative advantage: the low ratio is clipped to 0.8, the high one kept.
        let adv = Tensor::new(&[-1.0f32], &Device::Cpu).unwrap();
        let parts = grpo_loss(&logp, &old, None, None, &adv, &weights, &settings).unwrap();
        let expected = 0.5 * 0.5f32.exp() + 0.5 * 0.8; // −(0.5·e^0.5·(−1) + 0.5·0.8·(−1))
        close(parts.loss.to_scalar::<f32>().unwrap(), expected);

        // k3 KL with β and an entropy bonus; ratio 1 (on-policy).
        let settings = LossSettings::grpo(0.2, 0.2, 0.04, 0.01);
        let logp = t(&[&[-1.0, -2.0]]);
        let reference = t(&[&[-1.5, -2.0]]);
        let entropy = t(&[&[3.0, 1.0]]);
        let weights = t(&[&[1.0, 0.0]]); // the second token is padding
        let adv = Tensor::new(&[0.5f32], &Device::Cpu).unwrap();
        let parts = grpo_loss(&logp, &logp, Some(&reference), Some(&entropy), &adv, &weights, &settings).unwrap();
        let k3 = (-0.5f32).exp() + 0.5 - 1.0;
        close(parts.kl, k3);
        close(parts.entropy, 3.0);
        close(parts.loss.to_scalar::<f32>().unwrap(), -0.5 + 0.04 * k3 - 0.01 * 3.0);
    }

    #[test]
    fn the_gradient_of_an_on_policy_step_is_the_policy_gradient() {
        // With ratio 1 and no KL, d loss / d logp = −A × weight.
        let var = candle_core::Var::new(&[[-1.0f32, -2.0]], &Device::Cpu).unwrap();
        let logp = var.as_tensor();
        let old = logp.detach();
        let weights = t(&[&[0.25, 0.75]]);
        let adv = Tensor::new(&[2.0f32], &Device::Cpu).unwrap();
        let settings = LossSettings::grpo(0.2, 0.2, 0.0, 0.0);
        let parts = grpo_loss(logp, &old, None, None, &adv, &weights, &settings).unwrap();
        let grads = parts.loss.backward().unwrap();
        let g: Vec<Vec<f32>> = grads.get(logp).unwrap().to_vec2().unwrap();
        close(g[0][0], -0.5);
        close(g[0][1], -1.5);
    }

    #[test]
    fn a_per_token_advantage_weights_each_tokens_gradient() {
        // Advantage 2 carried with importance weights 0.5 and 2: d loss / d logp = −A·w·weight.
        let var = candle_core::Var::new(&[[-1.0f32, -2.0]], &Device::Cpu).unwrap();
        let logp = var.as_tensor();
        let weights = t(&[&[0.25, 0.75]]);
        let adv = t(&[&[2.0 * 0.5, 2.0 * 2.0]]);
        let settings = LossSettings::grpo(0.2, 0.2, 0.0, 0.0);
        let parts = grpo_loss(logp, &logp.detach(), None, None, &adv, &weights, &settings).unwrap();
        let grads = parts.loss.backward().unwrap();
        let g: Vec<Vec<f32>> = grads.get(logp).unwrap().to_vec2().unwrap();
        close(g[0][0], -2.0 * 0.5 * 0.25);
        close(g[0][1], -2.0 * 2.0 * 0.75);
        close(parts.loss.to_scalar::<f32>().unwrap(), -(0.25 + 3.0));
    }

    #[test]
    fn a_loss_is_read_by_name_and_trl_names_say_what_they_are_here() {
        for (name, kind) in [("grpo", LossKind::Grpo), ("gspo", LossKind::Gspo), ("cispo", LossKind::Cispo)] {
            assert_eq!(LossKind::try_from(name.to_string()), Ok(kind));
        }
        for (name, said) in [
            ("dapo", "grpo.preset = \"dapo\""),
            ("dr_grpo", "grpo.preset = \"dr_grpo\""),
            ("bnpo", "grpo.aggregation = \"token-mean\""),
            ("GRPO", "unknown loss `GRPO`, expected one of"),
        ] {
            let err = LossKind::try_from(name.to_string()).unwrap_err().to_string();
            assert!(err.contains(said), "{name}: {err}");
        }
    }
}
