//! `--set KEY=VALUE`: one key of a config changed from the command line, the whole config
//! checked again.

use super::*;

impl TrainConfig {
    /// Set one key from the command line: `grpo.group_size=4`, `sampling.max_tokens=16`,
    /// `tasks.1.weight=0` (an array's element by index). VALUE is a TOML value; a bare word
    /// is a string. The whole config is checked again, so a wrong key or value is refused
    /// with its name.
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
        // Plugin files are not required: a resumed run loads the bytes it keeps.
        self.check_with(&origin, false)
    }
}
