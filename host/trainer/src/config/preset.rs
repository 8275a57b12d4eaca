//! `grpo.preset`: the papers' combinations of `[grpo]` keys under one name
//! (docs/ALGORITHMS.md). In a config file a preset fills the `[grpo]` keys the file does not
//! set itself; `--set grpo.preset=NAME` sets its keys (a later `--set` overrides them).

use super::*;

/// The presets' names, as a refusal lists them.
pub const PRESETS: [&str; 2] = ["dr_grpo", "dapo"];

/// Preset `name`'s `[grpo]` keys for a run of `max_tokens` new tokens a completion, the
/// objective in its tables; `None` for a name that is none.
pub fn keys(name: &str, max_tokens: usize) -> Option<toml::Table> {
    let text = match name {
        // Dr. GRPO (arXiv 2503.20783): no std normalisation, no length bias.
        "dr_grpo" => r#"advantage = "mean-only"
aggregation = "constant""#
            .to_string(),
        // DAPO (arXiv 2503.14476): clip-higher, token-mean, no KL, dynamic sampling, overlong
        // shaping over the last fifth of the limit (the paper's 4,096 of 20,480 tokens).
        "dapo" => format!(
            r#"aggregation = "token-mean"
dynamic_sampling = true
loss = {{ kind = "grpo", clip_low = 0.2, clip_high = 0.28 }}
kl = {{ where = "off" }}
overlong = {{ buffer = {}, penalty = 1.0 }}"#,
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
/// names a preset. A config that writes the objective with the flat keys gets the preset's
/// as flat keys too (each filled where the config has none, as before the tables); one that
/// writes tables, or none, gets the preset's tables, a table the config writes itself
/// taking the preset's parameters its own choice reads and it leaves out.
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
    let flat = super::spelling::has_flat_keys(table);
    let Some(toml::Value::Table(grpo)) = table.get_mut("grpo") else { return Ok(false) };
    fill(grpo, preset, flat, origin)?;
    Ok(true)
}

/// Fill `grpo` with `preset`'s keys where it has none: as flat keys (`flat`) or as tables.
pub fn fill(grpo: &mut toml::Table, preset: toml::Table, flat: bool, origin: &str) -> crate::error::Result<()> {
    let mut preset = toml::Table::from_iter([("grpo".to_string(), toml::Value::Table(preset))]);
    if flat {
        super::spelling::flatten(&mut preset, origin)?;
    }
    let Some(toml::Value::Table(preset)) = preset.remove("grpo") else { return Ok(()) };
    for (key, value) in preset {
        match (grpo.get_mut(&key), value) {
            // The config's own choice, with the preset's parameters that choice reads.
            (Some(toml::Value::Table(own)), toml::Value::Table(theirs)) => {
                let choice = ["kind", "where"].iter().find_map(|tag| own.get(*tag)?.as_str()).map(str::to_string);
                for (parameter, value) in theirs {
                    if parameter != "kind" && parameter != "where" && reads(choice.as_deref(), &parameter) {
                        own.entry(parameter).or_insert(value);
                    }
                }
            }
            (Some(_), _) => {}
            (None, value) => {
                grpo.insert(key, value);
            }
        }
    }
    Ok(())
}

/// Whether the objective's `choice` (a loss's kind, a KL's place; none for the overlong
/// table) takes `parameter`.
fn reads(choice: Option<&str>, parameter: &str) -> bool {
    match choice {
        None => true,
        Some("grpo" | "gspo") => matches!(parameter, "clip_low" | "clip_high"),
        Some("cispo") => parameter == "clip_high",
        Some("sapo") => parameter.starts_with("temperature_"),
        Some("loss") => matches!(parameter, "beta" | "estimator"),
        Some("reward") => matches!(parameter, "beta" | "estimator" | "target" | "horizon"),
        Some(_) => false,
    }
}
