//! `--set KEY=VALUE`: keys of a config changed from the command line, the whole config
//! checked once they all are (checked after each, a valid final config was refused or not by
//! the order of its `--set`s: `grpo.overlong_buffer` before `sampling.max_tokens`, say).

use super::*;

impl TrainConfig {
    /// Set keys from the command line, in order, then check the whole config once, so that a
    /// wrong key or value is refused with its name (the assignments named as its origin).
    pub fn set_all(&mut self, assignments: &[String]) -> crate::error::Result<()> {
        for assignment in assignments {
            self.set(assignment)?;
        }
        if assignments.is_empty() {
            return Ok(());
        }
        let origin = assignments.iter().map(|a| format!("--set {a}")).collect::<Vec<_>>().join(" ");
        // Plugin files are not required: a resumed run loads the bytes it keeps.
        self.check_with(&origin, false)
    }

    /// Set one key: `grpo.group_size=4`, `sampling.max_tokens=16`, `tasks.1.weight=0` (an
    /// array's element by index). VALUE is a TOML value; a bare word is a string. Only its
    /// place and type are checked here: the whole config is checked by [`TrainConfig::set_all`]
    /// once every key is set.
    pub fn set(&mut self, assignment: &str) -> crate::error::Result<()> {
        let origin = format!("--set {assignment}");
        let Some((key, text)) = assignment.split_once('=') else {
            bail!("{origin}: expected KEY=VALUE, for example grpo.group_size=4");
        };
        let value = match toml::from_str::<toml::Table>(&format!("value = {text}")) {
            Ok(mut table) => table.remove("value").expect("the key just parsed"),
            Err(_) => toml::Value::String(text.to_string()),
        };
        let mut tree = toml::Value::try_from(&*self)?;
        let segments: Vec<&str> = key.split('.').collect();
        let (last, parents) = segments.split_last().expect("split yields one segment at least");
        let mut node = &mut tree;
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
                    let preset = super::preset::keys(name, self.sampling.max_tokens)
                        .ok_or_else(|| super::preset::unknown(&origin, name))?;
                    table.extend(preset);
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
        *self = tree.try_into().map_err(|e: toml::de::Error| crate::error::invalid!("{origin}: {}", e.message()))?;
        Ok(())
    }
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
            assert_eq!((config.grpo.overlong_buffer, config.sampling.max_tokens), (100, 128));
        }
        let mut config = TrainConfig::embedded_default().unwrap();
        let refused = config.set_all(&sets(&["grpo.overlong_buffer=100"])).unwrap_err().to_string();
        assert!(refused.contains("--set grpo.overlong_buffer=100") && refused.contains("overlong_buffer"), "{refused}");
    }

    #[test]
    fn finite_weights_whose_products_overflow_are_refused_by_key() {
        for (key, says) in [
            ("rewards.0.weight=-1e38", ["`rewards[0].weight` = -", "from -1e6 to 1e6"]),
            ("grpo.overlong_penalty=1e308", ["`grpo.overlong_penalty` = 1", "from 0 to 1e6"]),
        ] {
            let mut config = TrainConfig::embedded_default().unwrap();
            let refused = config.set_all(&sets(&[key])).unwrap_err().to_string();
            assert!(says.iter().all(|s| refused.contains(s)), "{key}: {refused}");
        }
    }
}
