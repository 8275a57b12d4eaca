//! The objective's spelling in `[grpo]`: a table per choice, each variant with only its own
//! parameters — `GrpoSection`'s own fields:
//!
//! ```toml
//! [grpo]
//! loss = { kind = "gspo", clip_low = 3e-4, clip_high = 4e-4 }
//! kl = { where = "reward", beta = 0.05, estimator = "k2", target = 0.1 }
//! overlong = { buffer = 64, penalty = 1.0 }
//! ```
//!
//! A parameter its variant does not read cannot be written (`clip_low` under `cispo`, a
//! `target` for a KL in the loss): the table is refused naming it. The flat keys that older
//! configs and saved runs write (`loss = "gspo"`, `clip_low`, `beta`, `kl_in_reward`,
//! `overlong_buffer`, ...) are read into the tables by [`lift`], which refuses by name the
//! combinations that mean nothing (a `kl_target` without `kl_in_reward`, SAPO's temperatures
//! under another loss) and tells the new spelling once; [`flatten`] is its inverse, which
//! `--set` of a flat key goes through.

use serde::{Deserialize, Serialize};
use wirl_grpo::{KlEstimator, LossKind};

/// ε of the clipped ratio, both sides, where a config sets none (TRL's, verl's).
pub const DEFAULT_CLIP: f64 = 0.2;
/// β of the KL penalty where a config sets none (TRL's former default).
pub const DEFAULT_BETA: f64 = 0.04;
/// The overlong penalty at the limit where a config sets none (DAPO's).
pub const DEFAULT_OVERLONG_PENALTY: f64 = 1.0;

fn clip() -> f64 {
    DEFAULT_CLIP
}
fn is_clip(x: &f64) -> bool {
    *x == DEFAULT_CLIP
}
fn temperature_pos() -> f64 {
    wirl_grpo::SAPO_TEMPERATURES[0]
}
fn is_temperature_pos(x: &f64) -> bool {
    *x == wirl_grpo::SAPO_TEMPERATURES[0]
}
fn temperature_neg() -> f64 {
    wirl_grpo::SAPO_TEMPERATURES[1]
}
fn is_temperature_neg(x: &f64) -> bool {
    *x == wirl_grpo::SAPO_TEMPERATURES[1]
}
fn is_k3(estimator: &KlEstimator) -> bool {
    *estimator == KlEstimator::K3
}
fn overlong_penalty() -> f64 {
    DEFAULT_OVERLONG_PENALTY
}
fn is_overlong_penalty(x: &f64) -> bool {
    *x == DEFAULT_OVERLONG_PENALTY
}

/// `grpo.loss`: the policy term and its parameters (docs/ALGORITHMS.md). A parameter at its
/// default is left out when a config is written.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum LossSpec {
    /// The clipped ratio per token, `−min(r·A, clip(r, 1 − clip_low, 1 + clip_high)·A)`.
    Grpo {
        #[serde(default = "clip", skip_serializing_if = "is_clip")]
        clip_low: f64,
        #[serde(default = "clip", skip_serializing_if = "is_clip")]
        clip_high: f64,
    },
    /// The clipped ratio of the sequence (its tokens' mean log-ratio).
    Gspo {
        #[serde(default = "clip", skip_serializing_if = "is_clip")]
        clip_low: f64,
        #[serde(default = "clip", skip_serializing_if = "is_clip")]
        clip_high: f64,
    },
    /// The importance weight clipped above at `1 + clip_high`, detached, times log π.
    Cispo {
        #[serde(default = "clip", skip_serializing_if = "is_clip")]
        clip_high: f64,
    },
    /// A soft gate on the ratio, its temperature for tokens of positive advantage (1.0,
    /// TRL's) and for the rest (1.05).
    Sapo {
        #[serde(default = "temperature_pos", skip_serializing_if = "is_temperature_pos")]
        temperature_pos: f64,
        #[serde(default = "temperature_neg", skip_serializing_if = "is_temperature_neg")]
        temperature_neg: f64,
    },
}

impl Default for LossSpec {
    fn default() -> Self {
        LossSpec::Grpo { clip_low: DEFAULT_CLIP, clip_high: DEFAULT_CLIP }
    }
}

impl LossSpec {
    /// Which policy term.
    pub fn kind(&self) -> LossKind {
        match self {
            LossSpec::Grpo { .. } => LossKind::Grpo,
            LossSpec::Gspo { .. } => LossKind::Gspo,
            LossSpec::Cispo { .. } => LossKind::Cispo,
            LossSpec::Sapo { .. } => LossKind::Sapo,
        }
    }
}

/// `grpo.kl`: the KL penalty to the reference — none, in the loss, or in the reward (verl's
/// `use_kl_in_reward`: each completion's reward less β × its summed estimate, before the
/// advantages; β adapting towards `target`, a mean KL per token, over `horizon`
/// completions, where a target is set).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "where", rename_all = "lowercase", deny_unknown_fields)]
pub enum KlSpec {
    /// No KL term, and no reference model kept.
    Off {},
    Loss {
        beta: f64,
        #[serde(default, skip_serializing_if = "is_k3")]
        estimator: KlEstimator,
    },
    Reward {
        beta: f64,
        #[serde(default, skip_serializing_if = "is_k3")]
        estimator: KlEstimator,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        horizon: Option<usize>,
    },
}

impl Default for KlSpec {
    fn default() -> Self {
        KlSpec::Loss { beta: DEFAULT_BETA, estimator: KlEstimator::K3 }
    }
}

impl KlSpec {
    /// β (0 when off).
    pub fn beta(&self) -> f64 {
        match self {
            KlSpec::Off {} => 0.0,
            KlSpec::Loss { beta, .. } | KlSpec::Reward { beta, .. } => *beta,
        }
    }
}

/// `grpo.overlong`: DAPO's overlong shaping — the last `buffer` tokens before a task's
/// `max_tokens` cost a completion's reward up to `penalty`, linearly.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongSpec {
    pub buffer: usize,
    #[serde(default = "overlong_penalty", skip_serializing_if = "is_overlong_penalty")]
    pub penalty: f64,
}

/// The truncation cap of a lagged group's importance weight where a config sets none.
pub const DEFAULT_TIS_CAP: f64 = 2.0;
/// The correction's upper bound where a config sets none (TRL's
/// `vllm_importance_sampling_clip_max`).
pub const DEFAULT_CORRECTION_MAX: f64 = 3.0;

fn tis_cap() -> f64 {
    DEFAULT_TIS_CAP
}
fn is_tis_cap(x: &f64) -> bool {
    *x == DEFAULT_TIS_CAP
}
fn correction_max() -> f64 {
    DEFAULT_CORRECTION_MAX
}
fn is_correction_max(x: &f64) -> bool {
    *x == DEFAULT_CORRECTION_MAX
}

/// `grpo.correction`: importance weights where the sampler's log-probs differ from the
/// learner's (a bf16 sampler copy, a generation lag) — TRL's `vllm_importance_sampling_mode`,
/// bounded by `max` and `min` — or `off`, where only a group sampled a step behind is
/// weighted, by min(π_old / π_sampler, `tis_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum CorrectionSpec {
    Off {
        #[serde(default = "tis_cap", skip_serializing_if = "is_tis_cap")]
        tis_cap: f64,
    },
    TokenTruncate {
        #[serde(default = "correction_max", skip_serializing_if = "is_correction_max")]
        max: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
    },
    TokenMask {
        #[serde(default = "correction_max", skip_serializing_if = "is_correction_max")]
        max: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
    },
    SequenceTruncate {
        #[serde(default = "correction_max", skip_serializing_if = "is_correction_max")]
        max: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
    },
    SequenceMask {
        #[serde(default = "correction_max", skip_serializing_if = "is_correction_max")]
        max: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
    },
}

impl Default for CorrectionSpec {
    fn default() -> Self {
        CorrectionSpec::Off { tis_cap: DEFAULT_TIS_CAP }
    }
}

impl CorrectionSpec {
    /// As the learner takes it: the mode and its bounds, and the lagged groups' cap.
    pub fn lowered(&self) -> wirl_grpo::Correction {
        use wirl_grpo::CorrectionMode as Mode;
        let (mode, min, max, tis_cap) = match *self {
            CorrectionSpec::Off { tis_cap } => (Mode::Off, None, DEFAULT_CORRECTION_MAX, tis_cap),
            CorrectionSpec::TokenTruncate { max, min } => (Mode::TokenTruncate, min, max, DEFAULT_TIS_CAP),
            CorrectionSpec::TokenMask { max, min } => (Mode::TokenMask, min, max, DEFAULT_TIS_CAP),
            CorrectionSpec::SequenceTruncate { max, min } => (Mode::SequenceTruncate, min, max, DEFAULT_TIS_CAP),
            CorrectionSpec::SequenceMask { max, min } => (Mode::SequenceMask, min, max, DEFAULT_TIS_CAP),
        };
        wirl_grpo::Correction { rollout: wirl_grpo::RolloutCorrection { mode, min, max: Some(max) }, tis_cap }
    }

    /// The bounds of a correction that is on: `(max, min)`.
    pub fn bounds(&self) -> Option<(f64, Option<f64>)> {
        match *self {
            CorrectionSpec::Off { .. } => None,
            CorrectionSpec::TokenTruncate { max, min }
            | CorrectionSpec::TokenMask { max, min }
            | CorrectionSpec::SequenceTruncate { max, min }
            | CorrectionSpec::SequenceMask { max, min } => Some((max, min)),
        }
    }
}

/// The flat keys of the objective that older configs and saved runs write (and `loss` as a
/// string), which [`lift`] reads into the tables.
const FLAT_KEYS: [&str; 15] = [
    "clip_low",
    "clip_high",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "beta",
    "kl_estimator",
    "kl_in_reward",
    "kl_target",
    "kl_horizon",
    "overlong_buffer",
    "overlong_penalty",
    "rollout_correction",
    "rollout_correction_max",
    "rollout_correction_min",
    "tis_cap",
];

/// Whether `[grpo]` writes any choice of the objective with the flat keys.
pub fn has_flat_keys(table: &toml::Table) -> bool {
    let Some(toml::Value::Table(grpo)) = table.get("grpo") else { return false };
    grpo.get("loss").is_some_and(toml::Value::is_str) || FLAT_KEYS.iter().any(|key| grpo.contains_key(*key))
}

/// A flat key's number (an integer reads as one).
fn number(origin: &str, key: &str, value: &toml::Value) -> crate::error::Result<f64> {
    match value {
        toml::Value::Float(x) => Ok(*x),
        toml::Value::Integer(n) => Ok(*n as f64),
        other => crate::error::bail!("{origin}: `grpo.{key}`: expected a number, found {}", other.type_str()),
    }
}

/// `[grpo]`'s flat objective keys as they were given.
#[derive(Default)]
struct Flat {
    loss: Option<String>,
    clip_low: Option<toml::Value>,
    clip_high: Option<toml::Value>,
    temperature_pos: Option<toml::Value>,
    temperature_neg: Option<toml::Value>,
    beta: Option<toml::Value>,
    estimator: Option<toml::Value>,
    in_reward: Option<toml::Value>,
    target: Option<toml::Value>,
    horizon: Option<toml::Value>,
    buffer: Option<toml::Value>,
    penalty: Option<toml::Value>,
    correction: Option<toml::Value>,
    correction_max: Option<toml::Value>,
    correction_min: Option<toml::Value>,
    tis_cap: Option<toml::Value>,
}

impl Flat {
    /// Take the flat keys out of `grpo`.
    fn take(grpo: &mut toml::Table) -> Flat {
        let loss = match grpo.get("loss") {
            Some(toml::Value::String(name)) => {
                let name = name.clone();
                grpo.remove("loss");
                Some(name)
            }
            _ => None,
        };
        let mut take = |key: &str| grpo.remove(key);
        Flat {
            loss,
            clip_low: take("clip_low"),
            clip_high: take("clip_high"),
            temperature_pos: take("sapo_temperature_pos"),
            temperature_neg: take("sapo_temperature_neg"),
            beta: take("beta"),
            estimator: take("kl_estimator"),
            in_reward: take("kl_in_reward"),
            target: take("kl_target"),
            horizon: take("kl_horizon"),
            buffer: take("overlong_buffer"),
            penalty: take("overlong_penalty"),
            correction: take("rollout_correction"),
            correction_max: take("rollout_correction_max"),
            correction_min: take("rollout_correction_min"),
            tis_cap: take("tis_cap"),
        }
    }
}

/// Read `[grpo]`'s flat objective keys into the tables (`loss`, `kl`, `overlong`), refusing
/// by name what the flat keys could say and the tables cannot: a parameter its choice does
/// not read, a choice written both ways. `tell`: say the new spelling once (a config file;
/// not `--set`). Whether anything was read.
pub fn lift(table: &mut toml::Table, origin: &str, tell: bool) -> crate::error::Result<bool> {
    if !has_flat_keys(table) {
        return Ok(false);
    }
    let Some(toml::Value::Table(grpo)) = table.get_mut("grpo") else { return Ok(false) };
    let flat = Flat::take(grpo);
    let both = |key: &str| {
        crate::error::invalid!(
            "{origin}: `grpo.{key}` is written both as a key and inside the objective's table (`grpo.loss`, \
             `grpo.kl` or `grpo.overlong`): write it once, in the table"
        )
    };
    let mut lifted = Vec::new();
    if let Some(loss) = lift_loss(&flat, origin)? {
        if grpo.contains_key("loss") {
            return Err(both(first_of(&flat, &["clip_low", "clip_high", "sapo_temperature_pos", "loss"])));
        }
        lifted.push(("loss", loss));
    }
    if let Some(kl) = lift_kl(&flat, origin)? {
        if grpo.contains_key("kl") {
            return Err(both(first_of(&flat, &["beta", "kl_estimator", "kl_in_reward", "kl_target", "kl_horizon"])));
        }
        lifted.push(("kl", kl));
    }
    if flat.buffer.is_some() || flat.penalty.is_some() {
        if grpo.contains_key("overlong") {
            return Err(both(if flat.buffer.is_some() { "overlong_buffer" } else { "overlong_penalty" }));
        }
        if let Some(overlong) = lift_overlong(&flat, origin)? {
            lifted.push(("overlong", overlong));
        }
    }
    if let Some(correction) = lift_correction(&flat, origin)? {
        if grpo.contains_key("correction") {
            return Err(both(if flat.correction.is_some() { "rollout_correction" } else { "tis_cap" }));
        }
        lifted.push(("correction", correction));
    }
    if tell {
        tell_once(origin, &lifted);
    }
    for (key, value) in lifted {
        grpo.insert(key.to_string(), toml::Value::Table(value));
    }
    Ok(true)
}

/// The first of `keys` the flat keys give, to name in a refusal.
fn first_of(flat: &Flat, keys: &[&'static str]) -> &'static str {
    let given = |key: &str| match key {
        "loss" => flat.loss.is_some(),
        "clip_low" => flat.clip_low.is_some(),
        "clip_high" => flat.clip_high.is_some(),
        "sapo_temperature_pos" => flat.temperature_pos.is_some() || flat.temperature_neg.is_some(),
        "beta" => flat.beta.is_some(),
        "kl_estimator" => flat.estimator.is_some(),
        "kl_in_reward" => flat.in_reward.is_some(),
        "kl_target" => flat.target.is_some(),
        _ => flat.horizon.is_some(),
    };
    keys.iter().copied().find(|key| given(key)).unwrap_or(keys[0])
}

/// `loss = "NAME"`, `clip_low`, `clip_high`, `sapo_temperature_*` as `grpo.loss`'s table.
fn lift_loss(flat: &Flat, origin: &str) -> crate::error::Result<Option<toml::Table>> {
    let given = [&flat.clip_low, &flat.clip_high, &flat.temperature_pos, &flat.temperature_neg];
    if flat.loss.is_none() && given.iter().all(|v| v.is_none()) {
        return Ok(None);
    }
    let kind = flat.loss.clone().unwrap_or_else(|| "grpo".into());
    // TRL's `loss_type` names that are not a loss here are answered with what they are.
    if let Err(unknown) = LossKind::try_from(kind.clone()) {
        crate::error::bail!("{origin}: `grpo.loss` = \"{kind}\": {unknown}");
    }
    let mut table = toml::Table::new();
    table.insert("kind".into(), toml::Value::String(kind.clone()));
    for (key, value) in
        [("sapo_temperature_pos", &flat.temperature_pos), ("sapo_temperature_neg", &flat.temperature_neg)]
    {
        let Some(value) = value else { continue };
        if kind != "sapo" {
            crate::error::bail!(
                "{origin}: `grpo.{key}` = {} with `grpo.loss` = \"{kind}\": it is SAPO's gate temperature (set loss = \
                 \"sapo\", or leave {key} out)",
                shown(value)
            );
        }
        table.insert(key.trim_start_matches("sapo_").into(), value.clone());
    }
    // A clip at its default under a loss that does not read it was always accepted (it is
    // what every saved run of such a loss writes); another value is refused as never read.
    for (key, value, read) in [
        ("clip_low", &flat.clip_low, matches!(kind.as_str(), "grpo" | "gspo")),
        ("clip_high", &flat.clip_high, kind != "sapo"),
    ] {
        let Some(value) = value else { continue };
        if read || !matches!(kind.as_str(), "cispo" | "sapo") {
            table.insert(key.into(), value.clone());
        } else if number(origin, key, value)? != DEFAULT_CLIP {
            let why = match key {
                "clip_low" => format!(
                    "is not read under grpo.loss = \"{kind}\" (CISPO's weight has no lower bound, SAPO's gate no \
                     clip): leave it out"
                ),
                _ => "is not read under grpo.loss = \"sapo\" (its gate has no clip; grpo.sapo_temperature_pos and \
                      _neg shape it): leave it out"
                    .to_string(),
            };
            crate::error::bail!("{origin}: `grpo.{key}` = {} {why}", shown(value));
        }
    }
    Ok(Some(table))
}

/// `beta`, `kl_estimator`, `kl_in_reward`, `kl_target`, `kl_horizon` as `grpo.kl`'s table.
fn lift_kl(flat: &Flat, origin: &str) -> crate::error::Result<Option<toml::Table>> {
    let given = [&flat.beta, &flat.estimator, &flat.in_reward, &flat.target, &flat.horizon];
    if given.iter().all(|v| v.is_none()) {
        return Ok(None);
    }
    let beta = match &flat.beta {
        Some(value) => number(origin, "beta", value)?,
        None => DEFAULT_BETA,
    };
    // Where the KL goes is read from β: a NaN or a negative β must not read as "off".
    if !(beta.is_finite() && beta >= 0.0) {
        crate::error::bail!("{origin}: `grpo.beta` = {beta}: it must be a number >= 0");
    }
    let in_reward = match &flat.in_reward {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(other) => {
            crate::error::bail!("{origin}: `grpo.kl_in_reward`: expected true or false, found {}", shown(other))
        }
    };
    if in_reward && beta == 0.0 {
        crate::error::bail!(
            "{origin}: `grpo.kl_in_reward` = true with `grpo.beta` = 0: there is no KL term to move into the reward \
             (set beta > 0, or leave kl_in_reward out)"
        );
    }
    if let Some(target) = &flat.target
        && !in_reward
    {
        crate::error::bail!(
            "{origin}: `grpo.kl_target` = {} without `grpo.kl_in_reward` = true: β adapts only for the KL in the \
             reward (as verl's adaptive kl_ctrl); set kl_in_reward, or leave kl_target out",
            shown(target)
        );
    }
    if let Some(horizon) = &flat.horizon
        && flat.target.is_none()
    {
        crate::error::bail!(
            "{origin}: `grpo.kl_horizon` = {} without `grpo.kl_target`: there is no adaptive β to pace (set \
             kl_target, or leave kl_horizon out)",
            shown(horizon)
        );
    }
    if let Some(estimator) = &flat.estimator
        && let Err(error) = estimator.clone().try_into::<KlEstimator>()
    {
        crate::error::bail!("{origin}: `grpo.kl_estimator` = {}: {}", shown(estimator), error.message());
    }
    if let Some(estimator) = &flat.estimator
        && beta == 0.0
    {
        crate::error::bail!(
            "{origin}: `grpo.kl_estimator` = {} with `grpo.beta` = 0: there is no KL term to estimate (set beta > 0, \
             or leave kl_estimator out)",
            estimator
        );
    }
    let mut table = toml::Table::new();
    let place = match (beta > 0.0, in_reward) {
        (false, _) => "off",
        (true, false) => "loss",
        (true, true) => "reward",
    };
    table.insert("where".into(), place.into());
    if beta > 0.0 {
        table.insert("beta".into(), beta.into());
    }
    let parameters = [("estimator", &flat.estimator), ("target", &flat.target), ("horizon", &flat.horizon)];
    for (key, value) in parameters {
        if let Some(value) = value {
            table.insert(key.into(), value.clone());
        }
    }
    Ok(Some(table))
}

/// `overlong_buffer`, `overlong_penalty` as `grpo.overlong`'s table (none for a buffer of 0).
fn lift_overlong(flat: &Flat, origin: &str) -> crate::error::Result<Option<toml::Table>> {
    // A buffer that is not a count stays in the table, for its reader to refuse by name.
    let off = flat.buffer.as_ref().is_none_or(|b| b.as_integer() == Some(0));
    if off {
        if let Some(penalty) = &flat.penalty
            && number(origin, "overlong_penalty", penalty)? != DEFAULT_OVERLONG_PENALTY
        {
            crate::error::bail!(
                "{origin}: `grpo.overlong_penalty` = {} is the penalty at the end of grpo.overlong_buffer tokens, \
                 which is 0: set overlong_buffer, or leave it out",
                shown(penalty)
            );
        }
        return Ok(None);
    }
    let mut table = toml::Table::new();
    table.insert("buffer".into(), flat.buffer.clone().expect("not off"));
    if let Some(penalty) = &flat.penalty {
        table.insert("penalty".into(), penalty.clone());
    }
    Ok(Some(table))
}

/// `rollout_correction`, `rollout_correction_max`, `_min` and `tis_cap` as
/// `grpo.correction`'s table: a bound of a correction that is off, or the lagged groups' cap
/// under one that is on, refused where it differs from its default (it would not be read).
fn lift_correction(flat: &Flat, origin: &str) -> crate::error::Result<Option<toml::Table>> {
    let given = [&flat.correction, &flat.correction_max, &flat.correction_min, &flat.tis_cap];
    if given.iter().all(|v| v.is_none()) {
        return Ok(None);
    }
    let mode = match &flat.correction {
        None => wirl_grpo::CorrectionMode::Off,
        Some(value) => value.clone().try_into().map_err(|e: toml::de::Error| {
            crate::error::invalid!("{origin}: `grpo.rollout_correction` = {}: {}", shown(value), e.message())
        })?,
    };
    let mut table = toml::Table::new();
    table.insert("mode".into(), toml::Value::try_from(mode).expect("a mode's name"));
    let off = mode == wirl_grpo::CorrectionMode::Off;
    let bound = "bounds grpo.rollout_correction, which is off: set it (token_truncate, token_mask, sequence_truncate, \
                 sequence_mask), or leave the bound out";
    for (key, value, default, parameter) in [
        ("rollout_correction_max", &flat.correction_max, Some(DEFAULT_CORRECTION_MAX), "max"),
        ("rollout_correction_min", &flat.correction_min, None, "min"),
    ] {
        let Some(value) = value else { continue };
        if !off {
            table.insert(parameter.into(), value.clone());
        } else if default.is_none_or(|d| number(origin, key, value).is_ok_and(|x| x != d)) {
            crate::error::bail!("{origin}: `grpo.{key}` = {} {bound}", shown(value));
        }
    }
    if let Some(cap) = &flat.tis_cap {
        if off {
            table.insert("tis_cap".into(), cap.clone());
        } else if number(origin, "tis_cap", cap)? != DEFAULT_TIS_CAP {
            crate::error::bail!(
                "{origin}: `grpo.tis_cap` = {} is not read under grpo.rollout_correction, which weighs lagged groups \
                 too (its bounds are grpo.rollout_correction_max and _min): leave it out",
                shown(cap)
            );
        }
    }
    Ok(Some(table))
}

/// A value as a message shows it (`0.5`, `"k2"`, `NaN`).
fn shown(value: &toml::Value) -> String {
    match value {
        toml::Value::Float(x) => x.to_string(),
        other => other.to_string(),
    }
}

/// Say once per file how its flat keys read in the tables' spelling.
fn tell_once(origin: &str, lifted: &[(&str, toml::Table)]) {
    static TOLD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut told = TOLD.lock().unwrap_or_else(|e| e.into_inner());
    if lifted.is_empty() || told.iter().any(|o| o == origin) {
        return;
    }
    told.push(origin.to_string());
    let spelled: Vec<String> =
        lifted.iter().map(|(key, table)| format!("{key} = {}", toml::Value::Table(table.clone()))).collect();
    tracing::warn!(
        "{origin}: [grpo] writes the objective with the flat keys of earlier versions, which read as {}; write \
         these tables instead (the flat keys keep working)",
        spelled.join(", ")
    );
}

/// The objective's tables of `[grpo]` written as the flat keys (what `--set` of a flat key
/// changes before [`lift`] reads them back); refused as the tables' reader refuses them.
pub fn flatten(table: &mut toml::Table, origin: &str) -> crate::error::Result<()> {
    let Some(toml::Value::Table(grpo)) = table.get_mut("grpo") else { return Ok(()) };
    let mut flat: Vec<(&str, toml::Value)> = Vec::new();
    if let Some(toml::Value::Table(loss)) = grpo.remove("loss") {
        let loss: LossSpec = read(&loss, origin, "grpo.loss", "kind = \"grpo\", \"gspo\", \"cispo\" or \"sapo\"")?;
        let (kind, parameters) = match loss {
            LossSpec::Grpo { clip_low, clip_high } => ("grpo", [("clip_low", clip_low), ("clip_high", clip_high)]),
            LossSpec::Gspo { clip_low, clip_high } => ("gspo", [("clip_low", clip_low), ("clip_high", clip_high)]),
            LossSpec::Cispo { clip_high } => ("cispo", [("clip_high", clip_high), ("", DEFAULT_CLIP)]),
            LossSpec::Sapo { temperature_pos, temperature_neg } => {
                ("sapo", [("sapo_temperature_pos", temperature_pos), ("sapo_temperature_neg", temperature_neg)])
            }
        };
        flat.push(("loss", kind.into()));
        flat.extend(parameters.into_iter().filter(|(key, _)| !key.is_empty()).map(|(key, value)| (key, value.into())));
    }
    if let Some(toml::Value::Table(kl)) = grpo.remove("kl") {
        let kl: KlSpec = read(&kl, origin, "grpo.kl", "where = \"off\", \"loss\" or \"reward\"")?;
        let name = |e: KlEstimator| toml::Value::try_from(e).expect("an estimator's name");
        match kl {
            KlSpec::Off {} => flat.push(("beta", 0.0.into())),
            // The estimator only where it is not the default: a later `--set grpo.beta=0`
            // must not meet an estimator nobody set.
            KlSpec::Loss { beta, estimator } => {
                flat.push(("beta", beta.into()));
                flat.extend((!is_k3(&estimator)).then(|| ("kl_estimator", name(estimator))));
            }
            KlSpec::Reward { beta, estimator, target, horizon } => {
                flat.push(("beta", beta.into()));
                flat.push(("kl_in_reward", true.into()));
                flat.extend((!is_k3(&estimator)).then(|| ("kl_estimator", name(estimator))));
                flat.extend(target.map(|t| ("kl_target", t.into())));
                flat.extend(horizon.map(|h| ("kl_horizon", toml::Value::Integer(h.min(i64::MAX as usize) as i64))));
            }
        }
    }
    if let Some(toml::Value::Table(overlong)) = grpo.remove("overlong") {
        let overlong: OverlongSpec = read(&overlong, origin, "grpo.overlong", "buffer = TOKENS, penalty = 0..1")?;
        flat.push(("overlong_buffer", toml::Value::Integer(overlong.buffer.min(i64::MAX as usize) as i64)));
        flat.push(("overlong_penalty", overlong.penalty.into()));
    }
    if let Some(toml::Value::Table(correction)) = grpo.remove("correction") {
        let correction: CorrectionSpec =
            read(&correction, origin, "grpo.correction", "mode = \"off\", \"token_truncate\", ... , with its bounds")?;
        let lowered = correction.lowered();
        flat.push(("rollout_correction", toml::Value::try_from(lowered.rollout.mode).expect("a mode's name")));
        match correction.bounds() {
            None if lowered.tis_cap != DEFAULT_TIS_CAP => flat.push(("tis_cap", lowered.tis_cap.into())),
            None => {}
            Some((max, min)) => {
                flat.push(("rollout_correction_max", max.into()));
                flat.extend(min.map(|min| ("rollout_correction_min", min.into())));
            }
        }
    }
    for (key, value) in flat {
        grpo.insert(key.to_string(), value);
    }
    Ok(())
}

fn read<T: serde::de::DeserializeOwned>(
    table: &toml::Table,
    origin: &str,
    key: &str,
    expected: &str,
) -> crate::error::Result<T> {
    toml::Value::Table(table.clone()).try_into().map_err(|e: toml::de::Error| {
        crate::error::invalid!(
            "{origin}: `{key}`: {} (it takes {expected}, and that choice's parameters)",
            e.message().trim_end()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifted(text: &str) -> crate::error::Result<toml::Table> {
        let mut table: toml::Table = toml::from_str(text).unwrap();
        lift(&mut table, "test.toml", false)?;
        Ok(table["grpo"].as_table().unwrap().clone())
    }

    #[test]
    fn the_flat_keys_read_into_the_tables() {
        let grpo = lifted("[grpo]\nloss = \"gspo\"\nclip_low = 3e-4\nclip_high = 4e-4\nsteps = 3").unwrap();
        let loss = |grpo: &toml::Table| -> LossSpec { grpo["loss"].clone().try_into().unwrap() };
        let kl = |grpo: &toml::Table| -> KlSpec { grpo["kl"].clone().try_into().unwrap() };
        assert_eq!(loss(&grpo), LossSpec::Gspo { clip_low: 3e-4, clip_high: 4e-4 });
        assert_eq!(grpo["steps"].as_integer(), Some(3));
        let grpo = lifted("[grpo]\nbeta = 0.05\nkl_in_reward = true\nkl_estimator = \"k2\"\nkl_target = 0.1").unwrap();
        let reward = KlSpec::Reward { beta: 0.05, estimator: KlEstimator::K2, target: Some(0.1), horizon: None };
        assert_eq!(kl(&grpo), reward);
        let grpo = lifted("[grpo]\nbeta = 0.0\nloss = \"sapo\"\nsapo_temperature_neg = 2.0").unwrap();
        assert_eq!(kl(&grpo), KlSpec::Off {});
        assert_eq!(loss(&grpo), LossSpec::Sapo { temperature_pos: 1.0, temperature_neg: 2.0 });
        let grpo = lifted("[grpo]\noverlong_buffer = 16").unwrap();
        assert_eq!(grpo["overlong"].to_string(), "{ buffer = 16 }");
        assert!(!lifted("[grpo]\noverlong_buffer = 0").unwrap().contains_key("overlong"));
        // A saved run's config writes every key, a loss's unread clip at its default too.
        let saved = lifted(
            "[grpo]\nloss = \"cispo\"\nclip_low = 0.2\nclip_high = 4.0\nbeta = 0.04\noverlong_buffer = 0\n\
                            overlong_penalty = 1.0\nkl_in_reward = false",
        )
        .unwrap();
        assert_eq!(loss(&saved), LossSpec::Cispo { clip_high: 4.0 });
        assert_eq!(kl(&saved), KlSpec::Loss { beta: 0.04, estimator: KlEstimator::K3 });
        assert!(!saved.contains_key("overlong"));
        let grpo =
            lifted("[grpo]\nrollout_correction = \"token_mask\"\nrollout_correction_min = 0.5\ntis_cap = 2.0").unwrap();
        let correction: CorrectionSpec = grpo["correction"].clone().try_into().unwrap();
        assert_eq!(correction, CorrectionSpec::TokenMask { max: 3.0, min: Some(0.5) });
        let grpo = lifted("[grpo]\ntis_cap = 3.0\nrollout_correction_max = 3.0").unwrap();
        let correction: CorrectionSpec = grpo["correction"].clone().try_into().unwrap();
        assert_eq!(correction, CorrectionSpec::Off { tis_cap: 3.0 });
    }

    #[test]
    fn combinations_that_mean_nothing_are_refused_by_name() {
        for (text, expected) in [
            ("sapo_temperature_pos = 2.0", "`grpo.sapo_temperature_pos` = 2 with `grpo.loss` = \"grpo\""),
            ("loss = \"cispo\"\nclip_low = 0.1", "`grpo.clip_low` = 0.1 is not read under grpo.loss = \"cispo\""),
            ("loss = \"sapo\"\nclip_high = 0.28", "`grpo.clip_high` = 0.28 is not read under grpo.loss = \"sapo\""),
            ("kl_in_reward = true\nbeta = 0", "`grpo.kl_in_reward` = true with `grpo.beta` = 0"),
            ("kl_target = 0.1\nbeta = 0.1", "`grpo.kl_target` = 0.1 without `grpo.kl_in_reward`"),
            ("kl_horizon = 9\nbeta = 0.1\nkl_in_reward = true", "`grpo.kl_horizon` = 9 without `grpo.kl_target`"),
            ("kl_estimator = \"k1\"\nbeta = 0.0", "`grpo.kl_estimator` = \"k1\" with `grpo.beta` = 0"),
            ("beta = nan", "`grpo.beta` = NaN: it must be a number >= 0"),
            ("beta = -1", "`grpo.beta` = -1: it must be a number >= 0"),
            ("overlong_penalty = 0.5", "`grpo.overlong_penalty` = 0.5 is the penalty at the end of"),
            ("loss = { kind = \"grpo\" }\nclip_low = 0.2", "`grpo.clip_low` is written both"),
            ("kl = { where = \"off\" }\nbeta = 0.1", "`grpo.beta` is written both"),
            ("rollout_correction_max = 2.0", "`grpo.rollout_correction_max` = 2 bounds grpo.rollout_correction"),
            ("rollout_correction_min = 0.5", "`grpo.rollout_correction_min` = 0.5 bounds grpo.rollout_correction"),
            ("rollout_correction = \"token_mask\"\ntis_cap = 3.0", "`grpo.tis_cap` = 3 is not read under"),
            ("rollout_correction = \"tis\"", "`grpo.rollout_correction` = \"tis\": unknown variant"),
            // Values of the wrong type, or none a number can be.
            ("beta = \"0.1\"", "`grpo.beta`: expected a number, found string"),
            ("kl_in_reward = 1\nbeta = 0.1", "`grpo.kl_in_reward`: expected true or false"),
            ("overlong_penalty = [1]", "`grpo.overlong_penalty`: expected a number, found array"),
            ("beta = inf", "`grpo.beta` = inf: it must be a number >= 0"),
        ] {
            let error = lifted(&format!("[grpo]\n{text}")).unwrap_err().to_string();
            assert!(error.contains(expected) && error.starts_with("test.toml: "), "{text}: {error}");
        }
    }

    #[test]
    fn the_tables_read_and_flatten_back() {
        let mut table: toml::Table = toml::from_str(
            "[grpo]\nloss = { kind = \"gspo\", clip_high = 4e-4 }\nkl = { where = \"reward\", beta = 0.05, target = 0.1 \
             }\noverlong = { buffer = 16 }",
        )
        .unwrap();
        flatten(&mut table, "test.toml").unwrap();
        let grpo = table["grpo"].as_table().unwrap().clone();
        assert_eq!((grpo["loss"].as_str(), grpo["clip_high"].as_float()), (Some("gspo"), Some(4e-4)));
        assert_eq!((grpo["beta"].as_float(), grpo["kl_in_reward"].as_bool()), (Some(0.05), Some(true)));
        assert_eq!(grpo["overlong_buffer"].as_integer(), Some(16));
        lift(&mut table, "test.toml", false).unwrap();
        let grpo = table["grpo"].as_table().unwrap();
        let loss: LossSpec = grpo["loss"].clone().try_into().unwrap();
        assert_eq!(loss, LossSpec::Gspo { clip_low: 0.2, clip_high: 4e-4 });
        for (text, expected) in [
            ("loss = { kind = \"cispo\", clip_low = 0.1 }", "`grpo.loss`: unknown field `clip_low`"),
            ("loss = { kind = \"ppo\" }", "unknown variant `ppo`"),
            ("kl = { where = \"loss\", beta = 0.1, target = 0.2 }", "unknown field `target`"),
            ("kl = { where = \"reward\" }", "missing field `beta`"),
            ("overlong = { penalty = 1.0 }", "missing field `buffer`"),
        ] {
            let mut table: toml::Table = toml::from_str(&format!("[grpo]\n{text}")).unwrap();
            let error = flatten(&mut table, "test.toml").unwrap_err().to_string();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
