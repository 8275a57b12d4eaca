//! `--set KEY=VALUE`: keys of a config changed from the command line, the whole config
//! checked once they all are (checked after each, a valid final config was refused or not by
//! the order of its `--set`s: `grpo.overlong.buffer` before `sampling.max_tokens`, say).

use super::*;

impl TrainConfig {
    /// Set keys from the command line, in order, then check the whole config once, so that a
    /// wrong key or value is refused with its name (the assignments named as its origin).
    /// The objective's flat keys of earlier versions (`grpo.beta`, `grpo.loss=gspo`,
    /// `grpo.kl_in_reward`) are set too: the tables are written as flat keys while they are
    /// set, and read back once after the last (`spelling::lift`), so that their order does
    /// not matter either.
    pub fn set_all(&mut self, assignments: &[String]) -> crate::error::Result<()> {
        if assignments.is_empty() {
            return Ok(());
        }
        let origin = assignments.iter().map(|a| format!("--set {a}")).collect::<Vec<_>>().join(" ");
        let mut tree = toml::Value::try_from(&*self)?;
        let flat = assignments.iter().any(|a| sets_a_flat_key(a));
        if flat && let toml::Value::Table(table) = &mut tree {
            super::spelling::flatten(table, &origin)?;
        }
        for assignment in assignments {
            set_one(&mut tree, assignment, flat, self.sampling.max_tokens)?;
        }
        if let toml::Value::Table(table) = &mut tree {
            super::spelling::lift(table, &origin, false)?;
        }
        *self = tree.try_into().map_err(|e: toml::de::Error| crate::error::invalid!("{origin}: {}", e.message()))?;
        // Plugin files are not required: a resumed run loads the bytes it keeps.
        self.check_with(&origin, false)
    }
}

/// Whether `assignment` sets one of the objective's flat keys (`grpo.beta=0.1`,
/// `grpo.loss=gspo`; not `grpo.loss.kind=gspo`).
fn sets_a_flat_key(assignment: &str) -> bool {
    let key = assignment.split_once('=').map_or(assignment, |(key, _)| key);
    key.strip_prefix("grpo.").is_some_and(|rest| {
        let mut probe = toml::Table::new();
        probe.insert(rest.to_string(), toml::Value::Boolean(true));
        let config = toml::Table::from_iter([("grpo".to_string(), toml::Value::Table(probe))]);
        rest == "loss" || super::spelling::has_flat_keys(&config)
    })
}

/// Set one key of `tree`: `grpo.group_size=4`, `sampling.max_tokens=16`, `tasks.1.weight=0`
/// (an array's element by index). VALUE is a TOML value; a bare word is a string. Only its
/// place and type are checked here (`flat`: the objective is in flat keys, read back into
/// its tables after the last key): the whole config is checked once every key is set.
fn set_one(tree: &mut toml::Value, assignment: &str, flat: bool, max_tokens: usize) -> crate::error::Result<()> {
    let origin = format!("--set {assignment}");
    let Some((key, text)) = assignment.split_once('=') else {
        bail!("{origin}: expected KEY=VALUE, for example grpo.group_size=4");
    };
    let value = match toml::from_str::<toml::Table>(&format!("value = {text}")) {
        Ok(mut table) => table.remove("value").expect("the key just parsed"),
        Err(_) => toml::Value::String(text.to_string()),
    };
    let segments: Vec<&str> = key.split('.').collect();
    let (last, parents) = segments.split_last().expect("split yields one segment at least");
    let mut node = &mut *tree;
    for (depth, segment) in parents.iter().enumerate() {
        let here = segments[..=depth].join(".");
        node = match node {
            toml::Value::Table(table) => {
                table.get_mut(*segment).with_context(|| format!("{origin}: the config has no table `{here}`"))?
            }
            toml::Value::Array(items) => {
                let len = items.len();
                segment
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get_mut(i))
                    .with_context(|| format!("{origin}: `{here}`: give an index below {len}"))?
            }
            _ => bail!("{origin}: `{}` is a value, not a table", segments[..depth].join(".")),
        };
    }
    match node {
        toml::Value::Table(table) => {
            // A preset sets its keys (later `--set`s override them).
            if key == "grpo.preset" {
                let name = value.as_str().unwrap_or_default();
                let preset =
                    super::preset::keys(name, max_tokens).ok_or_else(|| super::preset::unknown(&origin, name))?;
                let mut keys = toml::Table::new();
                super::preset::fill(&mut keys, preset, flat, &origin)?;
                table.extend(keys);
            }
            table.insert(last.to_string(), value);
        }
        toml::Value::Array(items) => {
            let len = items.len();
            let item = last
                .parse::<usize>()
                .ok()
                .and_then(|i| items.get_mut(i))
                .with_context(|| format!("{origin}: `{key}`: give an index below {len}"))?;
            *item = value;
        }
        _ => bail!("{origin}: `{}` is a value, not a table", parents.join(".")),
    }
    // Its type, now (its combinations with the other keys are read after the last `--set`).
    let mut probe = tree.clone();
    let lifted = match &mut probe {
        toml::Value::Table(table) if flat => super::spelling::lift(table, &origin, false).is_ok(),
        _ => true,
    };
    if lifted {
        probe.try_into::<TrainConfig>().map_err(|e| crate::error::invalid!("{origin}: {}", e.message()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::TrainConfig;

    fn sets(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn the_final_config_is_checked_whatever_the_order_of_the_sets() {
        let buffer_first = sets(&["grpo.overlong_buffer=100", "sampling.max_tokens=128"]);
        let tokens_first = sets(&["sampling.max_tokens=128", "grpo.overlong_buffer=100"]);
        for order in [buffer_first, tokens_first] {
            let mut config = TrainConfig::embedded_default().unwrap();
            config.set_all(&order).unwrap_or_else(|e| panic!("{order:?}: {e}"));
            assert_eq!((config.grpo.overlong.map(|o| o.buffer), config.sampling.max_tokens), (Some(100), 128));
        }
        let mut config = TrainConfig::embedded_default().unwrap();
        let refused = config.set_all(&sets(&["grpo.overlong_buffer=100"])).unwrap_err().to_string();
        assert!(refused.contains("--set grpo.overlong_buffer=100") && refused.contains("overlong.buffer"), "{refused}");
    }

    #[test]
    fn finite_weights_whose_products_overflow_are_refused_by_key() {
        for (key, says) in [
            ("rewards.0.weight=-1e38", ["`rewards[0].weight` = -", "from -1e6 to 1e6"]),
            ("grpo.overlong_penalty=1e308", ["`grpo.overlong.penalty` = 1", "from 0 to 1e6"]),
        ] {
            let mut config = TrainConfig::embedded_default().unwrap();
            let refused = config.set_all(&sets(&["grpo.overlong_buffer=4", key])).unwrap_err().to_string();
            assert!(says.iter().all(|s| refused.contains(s)), "{key}: {refused}");
        }
    }

    /// The flat keys of earlier versions and the tables' own keys both set the objective, in
    /// any order; the flat keys keep the parameters they do not name.
    #[test]
    fn the_objective_is_set_by_its_flat_keys_or_its_tables() {
        use crate::config::{KlSpec, LossSpec};
        let mut config = TrainConfig::embedded_default().unwrap();
        let keys = ["grpo.kl_target=0.1", "grpo.kl_in_reward=true", "grpo.clip_high=0.3", "grpo.loss=gspo"];
        config.set_all(&sets(&keys)).unwrap();
        assert_eq!(config.grpo.loss, LossSpec::Gspo { clip_low: 0.2, clip_high: 0.3 });
        let KlSpec::Reward { beta, target, .. } = config.grpo.kl else { panic!("{:?}", config.grpo.kl) };
        assert_eq!((beta, target), (config_beta(), Some(0.1)));
        config.set_all(&sets(&["grpo.loss.kind=cispo", "grpo.kl={ where = \"off\" }"])).unwrap();
        assert_eq!((config.grpo.loss, config.grpo.kl), (LossSpec::Cispo { clip_high: 0.3 }, KlSpec::Off {}));
        let refused = config.set_all(&sets(&["grpo.loss.clip_low=0.1"])).unwrap_err().to_string();
        assert!(refused.contains("--set grpo.loss.clip_low=0.1") && refused.contains("clip_low"), "{refused}");
    }

    /// The embedded default's β.
    fn config_beta() -> f64 {
        TrainConfig::embedded_default().unwrap().grpo.kl.beta()
    }

    /// A run directory's config is written with the tables and read back to the same
    /// objective; one an earlier version wrote, with every flat key, reads as it did.
    #[test]
    fn a_saved_config_reads_back_in_either_spelling() {
        let mut config = TrainConfig::embedded_default().unwrap();
        let keys = ["grpo.loss=sapo", "grpo.kl_in_reward=true", "grpo.kl_target=0.2", "grpo.overlong_buffer=8"];
        config.set_all(&sets(&keys)).unwrap();
        let text = toml::to_string(&config).unwrap();
        assert!(text.contains("kind = \"sapo\"") && !text.contains("kl_in_reward"), "{text}");
        let back = TrainConfig::parse_resolved(&text, "config.toml").unwrap();
        assert_eq!(back.grpo.objective().to_string(), config.grpo.objective().to_string());
        let earlier =
            text.replace("[grpo]\n", "[grpo]\nbeta = 0.04\nclip_low = 0.2\nclip_high = 0.2\nkl_in_reward = false\n");
        let earlier = toml::from_str::<toml::Table>(&earlier).map(|mut table| {
            let grpo = table.get_mut("grpo").and_then(toml::Value::as_table_mut).unwrap();
            for key in ["loss", "kl", "overlong"] {
                grpo.remove(key);
            }
            grpo.insert("loss".into(), "gspo".into());
            grpo.insert("overlong_buffer".into(), 0.into());
            grpo.insert("overlong_penalty".into(), 1.0.into());
            toml::to_string(&table).unwrap()
        });
        let read = TrainConfig::parse_resolved(&earlier.unwrap(), "an earlier run's config.toml").unwrap();
        assert_eq!(read.grpo.loss, crate::config::LossSpec::Gspo { clip_low: 0.2, clip_high: 0.2 });
        assert_eq!(read.grpo.kl, crate::config::KlSpec::default());
        assert_eq!(read.grpo.overlong, None);
    }
}
