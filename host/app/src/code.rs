//! SandboxFusion's `/run_code` as the application serves it: its languages' runners loaded
//! into worker processes, its bounds (flags over a config's `[sandbox]` table), and the
//! model-less server of `wirl sandbox serve`.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The languages and bounds of `/run_code`, for `wirl sandbox serve` and `wirl serve`.
#[derive(clap::Args, Clone, Default)]
pub struct RunnerOptions {
    /// A language and the code-runner component that runs it, `LANG=WASM`; repeat for more
    /// languages. scripts/build-plugins builds `python` (which serves `pytest` too) as
    /// plugins/target/python/code_runner.wasm, `nodejs` as plugins/target/js/code_runner.wasm,
    /// `lua` as plugins/target/c/lua_runner.wasm; `pip install wirl` carries them.
    #[arg(long = "runner", value_name = "LANG=WASM")]
    pub runners: Vec<String>,
    /// Worker processes the programs run in, each one program at a time [default: the
    /// number of cores].
    #[arg(long, value_name = "N")]
    pub run_workers: Option<usize>,
    /// Requests that may wait for a worker; one more is answered 503 with Retry-After.
    #[arg(long, value_name = "N")]
    pub max_queued: Option<usize>,
    /// The longest `run_timeout` a request may ask for, in seconds (longer asks are lowered).
    #[arg(long, value_name = "SECONDS")]
    pub max_run_timeout_s: Option<f64>,
    /// The most memory a program may have, in MiB (`memory_limit_MB` is lowered to it).
    #[arg(long, value_name = "MIB")]
    pub max_run_memory_mib: Option<u64>,
}

/// A config's `[sandbox]` table for `wirl serve`: the same settings as the flags
/// (`runners = { python = "…/code_runner.wasm" }`, `run_workers`, `max_queued`,
/// `max_run_timeout_s`, `max_run_memory_mib`), runner paths relative to the config's
/// directory. A flag given wins; a `--runner` for a language replaces the table's.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    #[serde(default)]
    runners: std::collections::BTreeMap<String, PathBuf>,
    run_workers: Option<usize>,
    max_queued: Option<usize>,
    max_run_timeout_s: Option<f64>,
    max_run_memory_mib: Option<u64>,
}

impl SandboxSection {
    /// Read the table (`origin` names the file in errors); runner paths resolved against `base`.
    pub fn read(value: toml::Value, origin: &str, base: &Path) -> anyhow::Result<Self> {
        let mut section: SandboxSection = value.try_into().map_err(|e: toml::de::Error| {
            anyhow::anyhow!(
                "{origin}: [sandbox]: {} (its keys: runners = {{ LANG = \"WASM\" }}, run_workers, max_queued, \
                 max_run_timeout_s, max_run_memory_mib: the flags of `wirl serve`)",
                e.message()
            )
        })?;
        for path in section.runners.values_mut() {
            *path = base.join(&*path);
        }
        Ok(section)
    }
}

impl RunnerOptions {
    /// These flags over a config's `[sandbox]` table: a flag given wins, and a `--runner` for
    /// a language replaces the table's runner for it.
    pub fn over(&self, section: SandboxSection) -> RunnerOptions {
        let given: Vec<&str> =
            self.runners.iter().filter_map(|pair| pair.split_once('=')).map(|(language, _)| language).collect();
        let mut runners: Vec<String> = section
            .runners
            .into_iter()
            .filter(|(language, _)| {
                let canonical = wirl_server::canonical_language(language);
                !given.iter().any(|flag| wirl_server::canonical_language(flag) == canonical)
            })
            .map(|(language, path)| format!("{language}={}", path.display()))
            .collect();
        runners.extend(self.runners.iter().cloned());
        RunnerOptions {
            runners,
            run_workers: self.run_workers.or(section.run_workers),
            max_queued: self.max_queued.or(section.max_queued),
            max_run_timeout_s: self.max_run_timeout_s.or(section.max_run_timeout_s),
            max_run_memory_mib: self.max_run_memory_mib.or(section.max_run_memory_mib),
        }
    }

    /// The code service these options describe; none when no runner is given.
    pub fn service(&self) -> anyhow::Result<Option<Arc<wirl_server::CodeService>>> {
        if self.runners.is_empty() {
            return Ok(None);
        }
        let defaults = wirl_server::CodeLimits::default();
        let max_run_timeout = match self.max_run_timeout_s {
            None => defaults.max_run_timeout,
            Some(s) if s.is_finite() && s > 0.0 && s <= 3600.0 => Duration::from_secs_f64(s),
            Some(s) => bail!("--max-run-timeout-s {s}: give a number of seconds above 0, at most 3600"),
        };
        let max_memory_mib = match self.max_run_memory_mib {
            None => defaults.max_memory_mib,
            Some(m) if (16..=wirl_sandbox::MAX_MEMORY_MIB).contains(&m) => m,
            Some(m) => bail!("--max-run-memory-mib {m}: give 16 to {} MiB", wirl_sandbox::MAX_MEMORY_MIB),
        };
        let workers = self.run_workers.unwrap_or(defaults.max_in_flight);
        if workers == 0 || workers > wirl_sandbox::MAX_WORKERS {
            bail!("--run-workers {workers}: give 1 to {}", wirl_sandbox::MAX_WORKERS);
        }
        let limits = wirl_server::CodeLimits {
            max_in_flight: workers,
            max_queued: self.max_queued.unwrap_or(defaults.max_queued),
            max_run_timeout,
            max_memory_mib,
            ..defaults
        };
        let sandbox = wirl_sandbox::Sandbox::new(wirl_sandbox::SandboxSettings::default())?;
        let mut languages = Vec::new();
        for pair in &self.runners {
            let Some((language, path)) = pair.split_once('=') else {
                bail!("--runner {pair:?}: expected LANG=WASM, for example python=code_runner.wasm");
            };
            let canonical = wirl_server::canonical_language(language);
            if languages
                .iter()
                .any(|l: &wirl_server::CodeLanguage| wirl_server::canonical_language(&l.name) == canonical)
            {
                bail!(
                    "--runner {pair:?}: {canonical} is given twice (js, javascript, node and nodejs are one language)"
                );
            }
            let path = PathBuf::from(path);
            if !path.is_file() {
                bail!(
                    "--runner {pair:?}: {} is not a file (scripts/build-plugins builds the Python runner as \
                     plugins/target/python/code_runner.wasm)",
                    path.display()
                );
            }
            let spec = wirl_sandbox::PluginSpec {
                name: format!("{language}-runner"),
                limits: wirl_sandbox::Limits {
                    deadline_ms: u64::try_from(max_run_timeout.as_millis()).unwrap_or(u64::MAX),
                    memory_bytes: max_memory_mib << 20,
                    max_print_bytes: limits.max_output_bytes,
                    ..wirl_sandbox::Limits::code_runner()
                },
                ..wirl_sandbox::PluginSpec::new(&path)
            };
            let what = format!("compiling {} (once: the compiled runner is cached)", path.display());
            let plugin = crate::notices::said_if_slow(&what, || sandbox.load(spec))
                .with_context(|| format!("--runner {pair:?}"))?;
            let runner = wirl_sandbox::CodeRunnerPlugin::new(plugin)
                .and_then(|runner| runner.in_workers(&sandbox, workers))
                .with_context(|| format!("--runner {pair:?}"))?;
            languages.push(wirl_server::CodeLanguage { name: language.to_string(), runner: Arc::new(runner) });
        }
        let service = wirl_server::CodeService::new(languages, limits).context("starting the code service")?;
        Ok(Some(Arc::new(service)))
    }
}
