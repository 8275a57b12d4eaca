//! The objective's typed spelling in `[grpo]`, each choice with only its own parameters:
//!
//! ```toml
//! [grpo]
//! loss = { kind = "gspo", clip_low = 3e-4, clip_high = 4e-4 }
//! kl = { where = "reward", beta = 0.05, estimator = "k2", target = 0.1 }
//! overlong = { buffer = 64, penalty = 1.0 }
//! ```
//!
//! A parameter its variant does not read cannot be written (`clip_low` under `cispo`, a
//! `target` for a KL in the loss): the table is refused naming it. The tables are read here
//! into the flat keys (`loss = "gspo"`, `clip_low`, `beta`, `kl_in_reward`, ...) that older
//! configs and saved runs write, which `GrpoSection::objective` lowers; writing a choice both
//! ways is refused. (Issue 63: the typed tables become `GrpoSection`'s own fields next, the
//! flat keys their compatibility form.)

use serde::Deserialize;
use wirl_grpo::KlEstimator;

/// `grpo.loss` as a table: the policy term and its parameters.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
enum LossTable {
    Grpo { clip_low: Option<f64>, clip_high: Option<f64> },
    Gspo { clip_low: Option<f64>, clip_high: Option<f64> },
    Cispo { clip_high: Option<f64> },
    Sapo { temperature_pos: Option<f64>, temperature_neg: Option<f64> },
}

/// `grpo.kl` as a table: where the KL applies, and its parameters.
#[derive(Debug, Deserialize)]
#[serde(tag = "where", rename_all = "lowercase", deny_unknown_fields)]
enum KlTable {
    Off {},
    Loss { beta: f64, estimator: Option<KlEstimator> },
    Reward { beta: f64, estimator: Option<KlEstimator>, target: Option<f64>, horizon: Option<u64> },
}

/// `grpo.overlong` as a table: DAPO's overlong shaping.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverlongTable {
    buffer: u64,
    penalty: Option<f64>,
}

/// Whether a config writes any choice of the objective as a table (then it is read through
/// [`flatten`]; otherwise as it is, keeping the TOML parser's line numbers in errors).
pub fn has_tables(table: &toml::Table) -> bool {
    let Some(toml::Value::Table(grpo)) = table.get("grpo") else { return false };
    ["loss", "kl", "overlong"].iter().any(|key| grpo.get(*key).is_some_and(toml::Value::is_table))
}

/// Read `[grpo]`'s objective tables into the flat keys, refusing a parameter its variant does
/// not read and a choice written both ways.
pub fn flatten(table: &mut toml::Table, origin: &str) -> crate::error::Result<()> {
    let Some(toml::Value::Table(grpo)) = table.get_mut("grpo") else { return Ok(()) };
    let mut flat: Vec<(&str, toml::Value)> = Vec::new();
    if let Some(toml::Value::Table(loss)) = grpo.get("loss") {
        let loss: LossTable = read(loss, origin, "grpo.loss", "kind = \"grpo\", \"gspo\", \"cispo\" or \"sapo\"")?;
        let (kind, parameters) = match loss {
            LossTable::Grpo { clip_low, clip_high } => ("grpo", [("clip_low", clip_low), ("clip_high", clip_high)]),
            LossTable::Gspo { clip_low, clip_high } => ("gspo", [("clip_low", clip_low), ("clip_high", clip_high)]),
            LossTable::Cispo { clip_high } => ("cispo", [("clip_high", clip_high), ("", None)]),
            LossTable::Sapo { temperature_pos, temperature_neg } => {
                ("sapo", [("sapo_temperature_pos", temperature_pos), ("sapo_temperature_neg", temperature_neg)])
            }
        };
        flat.push(("loss", kind.into()));
        flat.extend(parameters.into_iter().filter_map(|(key, value)| Some((key, value?.into()))));
        grpo.remove("loss");
    }
    if let Some(toml::Value::Table(kl)) = grpo.get("kl") {
        let kl: KlTable = read(kl, origin, "grpo.kl", "where = \"off\", \"loss\" or \"reward\"")?;
        let name = |e: KlEstimator| toml::Value::try_from(e).expect("an estimator's name");
        match kl {
            KlTable::Off {} => flat.push(("beta", 0.0.into())),
            KlTable::Loss { beta, estimator } => {
                flat.push(("beta", beta.into()));
                flat.extend(estimator.map(|e| ("kl_estimator", name(e))));
            }
            KlTable::Reward { beta, estimator, target, horizon } => {
                flat.push(("beta", beta.into()));
                flat.push(("kl_in_reward", true.into()));
                flat.extend(estimator.map(|e| ("kl_estimator", name(e))));
                flat.extend(target.map(|t| ("kl_target", t.into())));
                flat.extend(horizon.map(|h| ("kl_horizon", toml::Value::Integer(h.min(i64::MAX as u64) as i64))));
            }
        }
        grpo.remove("kl");
    }
    if let Some(toml::Value::Table(overlong)) = grpo.get("overlong") {
        let overlong: OverlongTable = read(overlong, origin, "grpo.overlong", "buffer = TOKENS, penalty = 0..1")?;
        flat.push(("overlong_buffer", toml::Value::Integer(overlong.buffer.min(i64::MAX as u64) as i64)));
        flat.extend(overlong.penalty.map(|p| ("overlong_penalty", p.into())));
        grpo.remove("overlong");
    }
    for (key, value) in flat {
        if grpo.contains_key(key) {
            crate::error::bail!(
                "{origin}: `grpo.{key}` is written both as a key and inside the objective's table (`grpo.loss`, \
                 `grpo.kl` or `grpo.overlong`): write it once, in the table"
            );
        }
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

    fn flat(text: &str) -> crate::error::Result<toml::Table> {
        let mut table: toml::Table = toml::from_str(text).unwrap();
        assert!(has_tables(&table));
        flatten(&mut table, "test.toml")?;
        Ok(table["grpo"].as_table().unwrap().clone())
    }

    #[test]
    fn each_table_reads_into_the_flat_keys() {
        let grpo = flat("[grpo]\nloss = { kind = \"gspo\", clip_low = 3e-4, clip_high = 4e-4 }\nsteps = 3").unwrap();
        assert_eq!(grpo["loss"].as_str(), Some("gspo"));
        assert_eq!((grpo["clip_low"].as_float(), grpo["clip_high"].as_float()), (Some(3e-4), Some(4e-4)));
        assert_eq!(grpo["steps"].as_integer(), Some(3));
        let grpo = flat("[grpo]\nkl = { where = \"reward\", beta = 0.05, estimator = \"k2\", target = 0.1 }").unwrap();
        assert_eq!(grpo["beta"].as_float(), Some(0.05));
        assert_eq!(grpo["kl_in_reward"].as_bool(), Some(true));
        assert_eq!(grpo["kl_estimator"].as_str(), Some("k2"));
        assert_eq!(grpo["kl_target"].as_float(), Some(0.1));
        assert!(!grpo.contains_key("kl_horizon") && !grpo.contains_key("kl"));
        let grpo = flat("[grpo]\nkl = { where = \"off\" }\nloss = { kind = \"sapo\", temperature_neg = 2.0 }").unwrap();
        assert_eq!((grpo["beta"].as_float(), grpo["sapo_temperature_neg"].as_float()), (Some(0.0), Some(2.0)));
        let grpo = flat("[grpo]\noverlong = { buffer = 16 }").unwrap();
        assert_eq!(grpo["overlong_buffer"].as_integer(), Some(16));
    }

    #[test]
    fn a_parameter_its_choice_does_not_read_or_a_choice_written_twice_is_refused() {
        for (text, expected) in [
            ("loss = { kind = \"cispo\", clip_low = 0.1 }", "`grpo.loss`: unknown field `clip_low`"),
            ("loss = { kind = \"ppo\" }", "unknown variant `ppo`"),
            ("loss = { clip_low = 0.1 }", "missing field `kind`"),
            ("kl = { where = \"loss\", beta = 0.1, target = 0.2 }", "unknown field `target`"),
            ("kl = { where = \"reward\" }", "missing field `beta`"),
            ("kl = { where = \"loss\", beta = 0.1, estimator = \"k9\" }", "`grpo.kl`"),
            ("overlong = { penalty = 1.0 }", "missing field `buffer`"),
            ("loss = { kind = \"grpo\", clip_low = 0.1 }\nclip_low = 0.2", "`grpo.clip_low` is written both"),
            ("kl = { where = \"off\" }\nbeta = 0.1", "`grpo.beta` is written both"),
        ] {
            let error = flat(&format!("[grpo]\n{text}")).unwrap_err().to_string();
            assert!(error.contains(expected) && error.starts_with("test.toml: "), "{text}: {error}");
        }
    }
}
