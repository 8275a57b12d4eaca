//! Reading a config or a task set: parse, resolve relative paths (from the file's
//! directory), check, and make them absolute for the run directory.

use super::*;

impl TrainConfig {
    /// The embedded default ([`DEFAULT_TOML`]): its plugins are built in, so it runs from any
    /// folder.
    pub fn embedded_default() -> crate::error::Result<Self> {
        Self::parse(DEFAULT_TOML, "the embedded default config (examples/train/default.toml)", Path::new("."))
    }

    /// Parse `text` (from `origin`), resolve plugin paths against `base`, and check it.
    pub fn parse(text: &str, origin: &str, base: &Path) -> crate::error::Result<Self> {
        let invalid = || "the training config is not valid; see examples/train/default.toml for every key";
        // A preset's keys filled in, then older configs' flat objective keys read into the
        // tables: through a table then; as the text otherwise, keeping the parser's line
        // numbers in errors.
        let syntax =
            |e: toml::de::Error| crate::error::invalid!("{origin}: {}", e.to_string().trim_end()).context(invalid());
        let table = match toml::from_str::<toml::Table>(text) {
            Ok(table) => table,
            // A value TOML's tables cannot hold (an integer past i64) may still read as the
            // config's own type (u64); otherwise the parser's error, with its line.
            Err(error) => match toml::from_str::<TrainConfig>(text) {
                Ok(config) => return config.resolved(origin, base),
                Err(_) => return Err(syntax(error)),
            },
        };
        let table = Some(table).filter(|table| {
            super::spelling::has_flat_keys(table)
                || table.get("grpo").and_then(|g| g.get("preset")).is_some_and(toml::Value::is_str)
        });
        let config: TrainConfig = match table {
            Some(mut table) => {
                super::preset::fill_table(&mut table, origin)?;
                super::spelling::lift(&mut table, origin, true)?;
                table.try_into().map_err(|e: toml::de::Error| {
                    crate::error::invalid!("{origin}: {}", e.to_string().trim_end().replace('\n', " "))
                        .context(invalid())
                })?
            }
            None => toml::from_str(text).map_err(syntax)?,
        };
        config.resolved(origin, base)
    }

    /// Files (not built-ins) joined to `base`, checked, then absolute: the run directory
    /// keeps the config for `--resume`.
    fn resolved(mut self, origin: &str, base: &Path) -> crate::error::Result<Self> {
        for path in self.paths() {
            *path = base.join(&*path);
        }
        self.check(origin)?;
        for path in self.paths() {
            *path = std::fs::canonicalize(&*path).with_context(|| format!("{origin}: {}", path.display()))?;
        }
        Ok(self)
    }

    /// The run's tasks as a task set: `[[tasks]]` as given, or the one task of the
    /// single-source keys as a `[[tasks]]` entry (same name, same specs).
    pub fn task_set(&self) -> TaskSet {
        if !self.tasks.is_empty() {
            return TaskSet { tasks: self.tasks.clone(), rewards: self.rewards.clone() };
        }
        let view = &self.task_views()[0];
        let task = TaskSection {
            name: view.name.clone(),
            weight: 1.0,
            eval_only: false,
            environment: self.environment.clone(),
            dataset: self.dataset.clone(),
            agent: None,
            remote: None,
            openenv: None,
            rewards: Vec::new(),
            sampling: SamplingOverrides::default(),
            on_failure: None,
            max_turns: 1,
            pass_reward: None,
        };
        TaskSet { tasks: vec![task], rewards: self.rewards.clone() }
    }

    /// This config with its tasks replaced by `set` (read from `origin`; its relative paths
    /// from `base`), checked as a whole.
    pub fn with_task_set(&self, set: TaskSet, origin: &str, base: &Path) -> crate::error::Result<Self> {
        if set.tasks.is_empty() {
            bail!("{origin}: no [[tasks]]: a task set names every task of the run as a [[tasks]] table");
        }
        let config =
            TrainConfig { tasks: set.tasks, rewards: set.rewards, environment: None, dataset: None, ..self.clone() };
        config.resolved(origin, base)
    }

    /// A run directory's resolved config (absolute paths): its plugin files need not exist
    /// any more, the run keeps their bytes.
    pub fn parse_resolved(text: &str, origin: &str) -> crate::error::Result<Self> {
        let invalid = |e: toml::de::Error| crate::error::invalid!("{origin}: {}", e.to_string().trim_end());
        // A run of an earlier version wrote the objective's flat keys.
        let mut table: toml::Table = toml::from_str(text).map_err(invalid)?;
        super::spelling::lift(&mut table, origin, true)?;
        let config: TrainConfig = table.try_into().map_err(invalid)?;
        config.check_with(origin, false)?;
        Ok(config)
    }

    /// This config with the task set of a run manifest (absolute paths; its plugins are the
    /// bytes the run keeps, so their files need not exist any more).
    pub fn with_manifest_tasks(&self, set: &TaskSet) -> crate::error::Result<Self> {
        let config = TrainConfig {
            tasks: set.tasks.clone(),
            rewards: set.rewards.clone(),
            environment: None,
            dataset: None,
            ..self.clone()
        };
        config.check_with("the run manifest", false)?;
        Ok(config)
    }

    /// Read a task set file (`[[tasks]]`, shared `[[rewards]]`; paths relative to it).
    pub fn read_task_set(path: &Path) -> crate::error::Result<TaskSet> {
        let text = read_config_text(path)?;
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Self::parse_task_set(&text, &path.display().to_string(), parent)
    }

    /// A task set's text (from `origin`), its relative paths from `parent`.
    pub fn parse_task_set(text: &str, origin: &str, parent: &Path) -> crate::error::Result<TaskSet> {
        let mut set: TaskSet = toml::from_str(text).map_err(|e| {
            crate::error::invalid!("{origin}: {}", e.to_string().trim_end())
                .context("not a task set: [[tasks]] tables (and shared [[rewards]]), as in a training config")
        })?;
        // Relative paths from the file's directory, as in a config; built-ins stay names.
        let base = std::fs::canonicalize(parent).with_context(|| format!("{}", parent.display()))?;
        let mut probe = TrainConfig {
            tasks: std::mem::take(&mut set.tasks),
            rewards: std::mem::take(&mut set.rewards),
            ..Self::minimal()
        };
        for path in probe.paths() {
            *path = base.join(&*path);
        }
        Ok(TaskSet { tasks: probe.tasks, rewards: probe.rewards })
    }

    /// A config with no task, for path handling.
    pub(super) fn minimal() -> Self {
        TrainConfig {
            model: ModelSection {
                path: String::new(),
                device: None,
                prefix_cache_mib: None,
                inference_dtype: None,
                train_dtype: None,
                device_sampling: None,
                tf32: None,
                chat_template_kwargs: Default::default(),
            },
            tasks: Vec::new(),
            environment: None,
            dataset: None,
            rewards: Vec::new(),
            sampling: SamplingSection::default(),
            grpo: GrpoSection::default(),
            eval: EvalSection::default(),
            swap: SwapSection::default(),
            lora: None,
            distill: None,
        }
    }

    /// Every file the config names (not the built-in plugins it names).
    pub(super) fn paths(&mut self) -> Vec<&mut PathBuf> {
        fn of<'a>(
            paths: &mut Vec<&'a mut PathBuf>,
            environment: Option<&'a mut PluginSection>,
            dataset: Option<&'a mut DatasetSection>,
            rewards: &'a mut [RewardSection],
        ) {
            for reward in rewards {
                paths.extend(reward.plugin.as_mut());
                paths.extend(reward.model.as_mut());
                paths.extend(reward.code_runner.as_mut().map(|r| &mut r.plugin));
                paths.extend(
                    reward.judge_model.as_mut().filter(|p| !super::JUDGE_WORDS.iter().any(|w| p.as_os_str() == *w)),
                );
            }
            paths.extend(environment.map(|e| &mut e.plugin));
            if let Some(dataset) = dataset {
                paths.extend(dataset.train.as_mut());
                paths.extend(dataset.eval.as_mut());
            }
        }
        let mut paths: Vec<&mut PathBuf> = Vec::new();
        paths.extend(self.distill.as_mut().map(|d| &mut d.teacher));
        of(&mut paths, self.environment.as_mut(), self.dataset.as_mut(), &mut self.rewards);
        for task in &mut self.tasks {
            of(&mut paths, task.environment.as_mut(), task.dataset.as_mut(), &mut task.rewards);
            paths.extend(task.agent.as_mut().map(|a| &mut a.plugin));
        }
        paths.retain(|path| !wirl_builtins::is_builtin(path));
        paths
    }

    /// Load from a TOML file.
    pub fn load(path: &Path) -> crate::error::Result<Self> {
        Ok(Self::load_with_text(path)?.0)
    }

    /// Load from a TOML file, with the text it was read from (read once: what the run
    /// directory keeps is what was checked).
    pub fn load_with_text(path: &Path) -> crate::error::Result<(Self, String)> {
        let text = read_config_text(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Ok((Self::parse(&text, &path.display().to_string(), base)?, text))
    }
}

/// The most bytes read from a config or a task set a user names: real ones are kilobytes.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The text of a config or task set file: a regular file (a link is followed, then checked)
/// of at most [`MAX_CONFIG_BYTES`], as UTF-8. A FIFO would block the start for ever and
/// `/dev/zero` would never end; the error names the file and what it is instead.
pub fn read_config_text(path: &Path) -> crate::error::Result<String> {
    use std::io::Read;
    let cannot_read = || format!("cannot read {}", path.display());
    let metadata = std::fs::metadata(path).with_context(cannot_read)?;
    if !metadata.is_file() {
        let what = if metadata.is_dir() { "a directory" } else { "not a regular file (a FIFO, device or socket)" };
        crate::error::bail!("{}: {what}; a config is a TOML file", path.display());
    }
    let file = std::fs::File::open(path).with_context(cannot_read)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).with_context(cannot_read)?;
    crate::error::ensure!(
        bytes.len() as u64 <= MAX_CONFIG_BYTES,
        "{}: over {MAX_CONFIG_BYTES} bytes; a config is a TOML file of kilobytes",
        path.display()
    );
    String::from_utf8(bytes)
        .map_err(|e| crate::error::invalid!("{}: not UTF-8 text ({e}); a config is a TOML file", path.display()))
}
