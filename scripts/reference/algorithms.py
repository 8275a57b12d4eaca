"""Reference values for wirl's objectives (docs/ALGORITHMS.md), from the peers' own code.

Writes `tests/fixtures/algorithms.json`: fixed inputs (per-token log-probs of the policy, of
the policy that sampled and of the reference; a mask of the trained tokens with ragged
lengths; advantages; rewards) and, per case, the loss and its gradient with respect to the
policy's log-probs as the peer computes them:

- the losses TRL has — `loss_type` grpo / dr_grpo / dapo (three aggregations of the clipped
  token ratio), `importance_sampling_level = "sequence"` (GSPO) and `loss_type = "cispo"`,
  all with TRL's k3 KL — by TRL's own `GRPOTrainer._compute_loss` (installed TRL, called on
  an object that carries only the settings it reads; the model's forward replaced by the
  fixed log-probs, which are the leaf the gradient is taken with respect to);
- the KL estimators TRL lacks (k1, k2) as verl's `kl_penalty` writes them
  (`verl/trainer/ppo/core_algos.py`: "kl"/k1 `logprob − ref`, "mse"/k2 `½(logprob − ref)²`),
  added to TRL's grpo loss (its k3 term replaced by them, as TRL's code adds it);
- REINFORCE++'s advantages as verl's `compute_reinforce_plus_plus_outcome_advantage` (γ = 1)
  and `compute_reinforce_plus_plus_baseline_outcome_advantage` compute them: the outcome
  reward (less the group's mean) on every token, whitened over the batch's tokens by
  `masked_whiten` (Bessel-corrected variance, `rsqrt(var + 1e-8)`);
- DAPO's overlong shaping as verl's DAPO reward manager computes it
  (`verl/workers/reward_manager/dapo.py`: `min(−(length − (max − buffer)) / buffer · factor, 0)`);
- pass@k's advantages as verl's `compute_grpo_passk_outcome_advantage` (only the best of a
  group: its margin over the next best, over the group's std + 1e-6);
- advantages: GRPO's and Dr. GRPO's as TRL computes them (`(r − mean) / (std + 1e-4)`, `r −
  mean`), RLOO's as verl's `compute_rloo_outcome_advantage` does
  (`r·n/(n−1) − mean·n/(n−1)`).

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/algorithms.py

TRL 1.16.0 (the peers' venv); the version is written into the fixture.
"""
import collections
import json
import os
import types

import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "algorithms.json")

torch.manual_seed(0)
ROWS, WIDTH = 4, 6
LENGTHS = [6, 3, 5, 1]
MASK = torch.tensor([[1.0 if t < n else 0.0 for t in range(WIDTH)] for n in LENGTHS], dtype=torch.float64)
# Log-probs around −2, the sampler's within ±0.4 of them (ratios from 0.67 to 1.5: some
# clipped at 0.2 / 0.28, some not), the reference's within ±0.5.
LOGP = (-2.0 + 0.8 * torch.randn(ROWS, WIDTH, dtype=torch.float64)).clamp(max=-0.05)
OLD = LOGP + 0.4 * (2 * torch.rand(ROWS, WIDTH, dtype=torch.float64) - 1)
REF = LOGP + 0.5 * (2 * torch.rand(ROWS, WIDTH, dtype=torch.float64) - 1)
ADVANTAGES = torch.tensor([1.5, -0.5, 0.75, -1.25], dtype=torch.float64)
REWARDS = [1.0, 0.0, 0.5, 1.0]
MAX_TOKENS = 8


def trl_loss(loss_type, level, beta, eps_low, eps_high, sapo=(1.0, 1.05)):
    """TRL's loss and d loss / d log π for the fixed inputs (`sapo`: its temperatures for
    positive advantages and the rest)."""
    logp = LOGP.clone().requires_grad_(True)

    def forward(_self, *args, **kwargs):
        return logp, torch.zeros_like(logp), None

    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=types.MethodType(forward, object()),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, loss_type=loss_type, beta=beta,
        epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1,
                                   sapo_temperature_pos=sapo[0], sapo_temperature_neg=sapo[1]),
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=MAX_TOKENS,
        accelerator=types.SimpleNamespace(num_processes=1, gather=lambda x: x,
                                          reduce=lambda x, reduction: x),
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        _entropy_bonus_enabled=False, use_adaptive_entropy=False,
    )
    trainer.get_high_entropy_mask = None
    inputs = {
        "prompt_ids": torch.zeros(ROWS, 1, dtype=torch.long), "prompt_mask": torch.ones(ROWS, 1),
        "completion_ids": torch.zeros(ROWS, WIDTH, dtype=torch.long), "completion_mask": MASK,
        "advantages": ADVANTAGES, "old_per_token_logps": OLD, "ref_per_token_logps": REF,
        "num_items_in_batch": MASK.sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist()


def aggregate(per_token, aggregation):
    """TRL's aggregations of a per-token loss over MASK (grpo, dapo, dr_grpo's)."""
    if aggregation == "sequence-mean":
        return ((per_token * MASK).sum(-1) / MASK.sum(-1).clamp(min=1.0)).mean()
    if aggregation == "token-mean":
        return (per_token * MASK).sum() / MASK.sum()
    return (per_token * MASK).sum() / (ROWS * MAX_TOKENS)


def with_verl_kl(estimator, beta, aggregation, loss_type):
    """TRL's loss without KL (beta 0) plus β × verl's KL estimate, aggregated as TRL's
    loss_type aggregates (its KL is added per token before aggregating)."""
    base, base_grad = trl_loss(loss_type, "token", 0.0, 0.2, 0.2)
    logp = LOGP.clone().requires_grad_(True)
    if estimator == "k1":  # verl kl_penalty "kl" / "k1"
        kl = logp - REF
    elif estimator == "k2":  # verl kl_penalty "mse" / "k2"
        kl = 0.5 * (logp - REF).square()
    else:
        raise ValueError(estimator)
    term = beta * aggregate(kl, aggregation)
    term.backward()
    grad = (torch.tensor(base_grad, dtype=torch.float64) + logp.grad).tolist()
    return base + float(term.detach()), grad


def advantages(rewards, mode):
    r = torch.tensor(rewards, dtype=torch.float64)
    n = len(rewards)
    if mode == "grpo":  # TRL: (r − mean) / (std + 1e-4), std with Bessel's correction
        return ((r - r.mean()) / (r.std() + 1e-4)).tolist()
    if mode == "mean-only":  # TRL scale_rewards="none" (Dr. GRPO)
        return (r - r.mean()).tolist()
    if mode == "rloo":  # verl compute_rloo_outcome_advantage
        return (r * n / (n - 1) - r.mean() * n / (n - 1)).tolist()
    if mode == "pass@k":  # verl compute_grpo_passk_outcome_advantage (norm_adv_by_std_in_grpo)
        top, at = torch.topk(r, 2)
        out = torch.zeros_like(r)
        out[at[0]] = (top[0] - top[1]) / (torch.std(r) + 1e-6)
        return out.tolist()
    raise ValueError(mode)


# Pass@k's groups: a unique best, one best among zeros, the best two tied (no advantage).
PASSK_GROUPS = [[0.0, 1.0, 0.5, 0.25], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0.3, 0.9, 0.9, 0.1]]


cases = []
for name, loss_type, level, aggregation in [
    ("grpo", "grpo", "token", "sequence-mean"),
    ("dr_grpo", "dr_grpo", "token", "constant"),
    ("dapo", "dapo", "token", "token-mean"),
    ("gspo", "grpo", "sequence", "sequence-mean"),
    ("gspo-token-mean", "dapo", "sequence", "token-mean"),
]:
    for beta in (0.0, 0.04):
        for eps_high in (0.2, 0.28):
            loss, grad = trl_loss(loss_type, level, beta, 0.2, eps_high)
            cases.append({"name": name, "loss": "gspo" if level == "sequence" else "grpo", "aggregation": aggregation,
                          "beta": beta, "kl": "k3", "clip_low": 0.2, "clip_high": eps_high,
                          "value": loss, "grad": grad, "peer": f"trl {trl.__version__} {loss_type}/{level}"})
for name, loss_type, aggregation in [("gspo", "grpo", "sequence-mean"), ("gspo-token-mean", "dapo", "token-mean")]:
    # Narrow clips, so that whole sequences are clipped (the geometric mean of a sequence's
    # ratios stays nearer 1 than its tokens' do).
    loss, grad = trl_loss(loss_type, "sequence", 0.04, 0.02, 0.02)
    cases.append({"name": f"{name}-narrow", "loss": "gspo", "aggregation": aggregation, "beta": 0.04, "kl": "k3",
                  "clip_low": 0.02, "clip_high": 0.02, "value": loss, "grad": grad,
                  "peer": f"trl {trl.__version__} {loss_type}/sequence"})
for eps_high in (0.2, 4.0):
    # TRL's epsilon_high for CISPO is the cap of the weight itself: wirl's 1 + clip_high.
    loss, grad = trl_loss("cispo", "token", 0.04, 0.2, 1.0 + eps_high)
    cases.append({"name": "cispo", "loss": "cispo", "aggregation": "token-mean", "beta": 0.04, "kl": "k3",
                  "clip_low": 0.2, "clip_high": eps_high, "value": loss, "grad": grad,
                  "peer": f"trl {trl.__version__} cispo"})
for beta, sapo in [(0.0, (1.0, 1.05)), (0.04, (1.0, 1.05)), (0.04, (0.5, 3.0))]:
    # TRL aggregates SAPO as its grpo (per sequence); the temperatures as TRL's defaults and
    # far apart (a steeper gate for negative advantages).
    loss, grad = trl_loss("sapo", "token", beta, 0.2, 0.2, sapo)
    cases.append({"name": "sapo", "loss": "sapo", "aggregation": "sequence-mean", "beta": beta, "kl": "k3",
                  "clip_low": 0.2, "clip_high": 0.2, "sapo_temperatures": list(sapo), "value": loss, "grad": grad,
                  "peer": f"trl {trl.__version__} sapo"})
for estimator in ("k1", "k2"):
    loss, grad = with_verl_kl(estimator, 0.04, "sequence-mean", "grpo")
    cases.append({"name": f"grpo-{estimator}", "loss": "grpo", "aggregation": "sequence-mean", "beta": 0.04,
                  "kl": estimator, "clip_low": 0.2, "clip_high": 0.2, "value": loss, "grad": grad,
                  "peer": f"trl {trl.__version__} grpo + verl kl_penalty {estimator}"})

def masked_whiten(values, mask):
    """verl.utils.torch_functional.masked_whiten (shift_mean=True)."""
    mean = (values * mask).sum() / mask.sum()
    centered = values - mean
    variance = (centered.square() * mask).sum() / mask.sum()
    variance = variance * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def reinforce_pp(groups, baseline):
    """Per group, per completion: its advantage (every token of it carries the same)."""
    rows = [(g, r, n) for g, (rewards, lengths) in enumerate(groups) for r, n in zip(rewards, lengths)]
    width = max(n for _, _, n in rows)
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(width)] for _, _, n in rows], dtype=torch.float64)
    scores = torch.tensor([r for _, r, _ in rows], dtype=torch.float64)
    if baseline:
        means = [sum(rewards) / len(rewards) for rewards, _ in groups]
        scores = scores - torch.tensor([means[g] for g, _, _ in rows], dtype=torch.float64)
    # γ = 1 and the reward on the last token: every token's return is the reward.
    whitened = masked_whiten(scores.unsqueeze(-1) * mask, mask) * mask
    out, i = [], 0
    for rewards, _ in groups:
        out.append([float(whitened[i + k, 0]) for k in range(len(rewards))])
        i += len(rewards)
    return out


WHITEN_GROUPS = [([1.0, 0.0, 0.0, 1.0], [5, 3, 8, 2]), ([0.5, 0.5, 0.5], [4, 6, 1]), ([2.0, 0.0], [7, 7])]


def kl_in_reward(scores, estimator, beta, old):
    """verl's apply_kl_penalty (use_kl_in_reward) with its outcome score at the last token,
    summed per row as its outcome advantage estimators sum token_level_rewards: the scores
    the group's advantages are then taken of. ref = REF, the response mask MASK."""
    if estimator == "k1":  # kl_penalty "kl"
        kld = old - REF
    elif estimator == "k2":  # "mse"
        kld = 0.5 * (old - REF).square()
    else:  # "low_var_kl" (k3)
        kl = REF - old
        kld = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    token_scores = torch.zeros_like(old)
    lengths = MASK.sum(-1).long()
    token_scores[torch.arange(len(scores)), lengths - 1] = torch.tensor(scores, dtype=torch.float64)
    token_rewards = token_scores - beta * kld * MASK
    return token_rewards.sum(-1).tolist()


class AdaptiveKLController:
    """verl's adaptive controller (`core_algos.AdaptiveKLController`, Ziegler et al. 2019)."""

    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl, n_steps):
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def kl_controller(estimator, old, beta, target, horizon, later_kls):
    """verl's apply_kl_penalty's controller: the step's current_kl is the batch mean of each
    row's masked_mean of kld (verl_F.masked_mean: sum / (mask sum + 1e-8)), n_steps the batch
    size; then one update per KL of `later_kls` over the same batch. Returns the step's
    current_kl and β after each update."""
    if estimator == "k1":
        kld = old - REF
    elif estimator == "k2":
        kld = 0.5 * (old - REF).square()
    else:
        kl = REF - old
        kld = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    kld = kld * MASK
    current_kl = ((kld * MASK).sum(-1) / (MASK.sum(-1) + 1e-8)).mean(0).item()
    controller = AdaptiveKLController(beta, target, horizon)
    values = []
    for kl in [current_kl] + later_kls:
        controller.update(current_kl=kl, n_steps=ROWS)
        values.append(controller.value)
    return current_kl, values


def overlong(length, max_tokens, buffer, factor):
    """verl's DAPO reward manager's overlong reward."""
    expected_len = max_tokens - buffer
    exceed_len = length - expected_len
    return min(-exceed_len / buffer * factor, 0)


LATER_KLS = [0.0, 0.004, 0.01, 0.0105, 0.03, 2.0]

fixture = {
    "about": "scripts/reference/algorithms.py: losses and d loss / d logp from TRL's GRPOTrainer._compute_loss "
             "and verl's kl_penalty and advantage estimators, float64",
    "trl": trl.__version__, "torch": torch.__version__,
    "logp": LOGP.tolist(), "old_logp": OLD.tolist(), "ref_logp": REF.tolist(), "mask": MASK.tolist(),
    "advantages": ADVANTAGES.tolist(), "max_tokens": MAX_TOKENS, "cases": cases,
    "rewards": REWARDS,
    "advantage_cases": [{"mode": m, "advantages": advantages(REWARDS, m)} for m in ("grpo", "mean-only", "rloo")],
    "passk_cases": [{"rewards": g, "advantages": advantages(g, "pass@k")} for g in PASSK_GROUPS],
    "whitening_groups": [{"rewards": r, "tokens": n} for r, n in WHITEN_GROUPS],
    "whitening_cases": [{"mode": "reinforce++", "advantages": reinforce_pp(WHITEN_GROUPS, False)},
                        {"mode": "reinforce++-baseline", "advantages": reinforce_pp(WHITEN_GROUPS, True)}],
    # π_old as OLD, and 12 times as far from π_ref (k3 past verl's clamp of ±10 there).
    "kl_in_reward_cases": [{"estimator": e, "beta": b, "scores": REWARDS[:ROWS], "old_logp": old.tolist(),
                            "shaped": kl_in_reward(REWARDS[:ROWS], e, b, old)}
                           for old in (OLD, REF + 12 * (OLD - REF))
                           for e in ("k1", "k2", "k3") for b in (0.04, 0.5)],
    # The step's KL from the fixture's rows, then KLs below, at and past the target (the
    # error clipped at ±0.2), a horizon short enough for β to move visibly.
    "kl_controller_cases": [dict(zip(("estimator", "beta", "target", "horizon", "later_kls", "current_kl", "values"),
                                     (e, 0.04, t, 40, LATER_KLS, *kl_controller(e, OLD, 0.04, t, 40, LATER_KLS))))
                            for e in ("k1", "k2", "k3") for t in (0.01, 0.5)],
    "overlong_cases": [{"length": n, "max_tokens": 16, "buffer": b, "factor": f, "penalty": overlong(n, 16, b, f)}
                       for b in (4, 10) for f in (1.0, 0.5) for n in range(17)],
}
with open(OUT, "w") as f:
    json.dump(fixture, f, indent=1)
print(f"{len(cases)} loss cases, 3 advantage cases -> {OUT}")
