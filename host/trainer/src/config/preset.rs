//! `grpo.preset`: the papers' combinations of `[grpo]` keys under one name
//! (docs/ALGORITHMS.md). In a config file a preset fills the `[grpo]` keys the file does not
//! set itself; `--set grpo.preset=NAME` sets its keys (a later `--set` overrides them).

use super::*;

/// The presets' names, as a refusal lists them.
pub const PRESETS: [&str; 2] = ["dr_grpo", "dapo"];

/// Preset `name`'s `[grpo]` keys for a run of `max_tokens` new tokens a completion; `None`
/// for a name that is none.
pub fn keys(name: &str, max_tokens: usize) -> Option<toml::Table> {
    let text = match name {
        // Dr. GRPO (arXiv 2503.20783): no std normalisation, no length bias.
        "dr_grpo" => r#"advantage = "mean-only"
aggregation = "constant""#
            .to_string(),
        // DAPO (arXiv 2503.14476): clip-higher, token-mean, no KL, dynamic sampling, overlong
        // shaping over the last fifth of the limit (the paper's 4,096 of 20,480 tokens).
        "dapo" => format!(
            r#"clip_low = 0.2
clip_high = 0.28
beta = 0.0
aggregation = "token-mean"
dynamic_sampling = true
overlong_buffer = {}
overlong_penalty = 1.0"#,
            max_tokens / 5
        ),
        _ => return None,
    };
    Some(toml::from_str(&text).expect("a preset's keys are TOML"))
}

/// The refusal of an unknown preset `name`.
pub fn unknown(origin: &str, name: &str) -> crate::Error {
    crate::error::invalid!(
        "{origin}: `grpo.preset` = {name:?}: expected one of {}",
        PRESETS.map(|p| format!("{p:?}")).join(", ")
    )
}

/// `table` with its preset's keys filled into `[grpo]` where it does not set them; whether it
/// names a preset.
pub fn fill_table(table: &mut toml::Table, origin: &str) -> crate::error::Result<bool> {
    let Some(name) = table.get("grpo").and_then(|g| g.get("preset")).and_then(toml::Value::as_str).map(str::to_string)
    else {
        return Ok(false);
    };
    let max_tokens = table
        .get("sampling")
        .and_then(|s| s.get("max_tokens"))
        .and_then(toml::Value::as_integer)
        .map_or(SamplingSection::default().max_tokens, |n| n.max(0) as usize);
    let preset = keys(&name, max_tokens).ok_or_else(|| unknown(origin, &name))?;
    let Some(toml::Value::Table(grpo)) = table.get_mut("grpo") else { return Ok(false) };
    for (key, value) in preset {
        grpo.entry(key).or_insert(value);
    }
    Ok(true)
}
