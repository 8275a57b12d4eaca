//! One plugin loaded from the command line's options (`wirl score`, `wirl tasks`): its
//! component or built-in, its config values, its limits, a grader's code runner.

/// Plugin options shared by the commands that load one plugin from the command line.
#[derive(clap::Args, Clone, Debug)]
pub struct PluginOptions {
    /// The plugin component (`.wasm`), or a built-in: `builtin:NAME` (`wirl plugin list`).
    #[arg(long)]
    pub plugin: std::path::PathBuf,
    /// A plugin config value, `KEY=VALUE`, where VALUE is JSON (a bare word is a string).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// Wall-clock deadline per call, in milliseconds.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Memory cap per instance, in MiB.
    #[arg(long)]
    memory_mib: Option<u64>,
    /// Fuel per call (turns fuel metering on).
    #[arg(long)]
    fuel: Option<u64>,
    /// Keep one instance across calls instead of a fresh one per call.
    #[arg(long)]
    reuse_instance: bool,
    /// Grant read-only access to this directory (seen by the plugin as /data).
    #[arg(long, value_name = "DIR")]
    read_only_dir: Option<std::path::PathBuf>,
    /// For a grader: the code-runner component its programs run in (default limits of a
    /// code runner: 10 s, 512 MiB per program).
    #[arg(long, value_name = "WASM")]
    code_runner: Option<std::path::PathBuf>,
    /// For a grader: run its programs in this many worker processes (0: in this process).
    /// Programs of concurrent calls then scale with cores as subprocesses do.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "code_runner")]
    code_workers: usize,
}

impl PluginOptions {
    /// The sandbox and the loaded plugin these options describe.
    pub fn load(&self) -> anyhow::Result<(wirl_sandbox::Sandbox, std::sync::Arc<wirl_sandbox::Plugin>)> {
        let mut spec = plugin_spec(&self.plugin)?;
        for pair in &self.config {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--config {pair:?}: expected KEY=VALUE, for example tolerance=0.01"))?;
            let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
            spec.config.insert(key.to_string(), value);
        }
        if let Some(ms) = self.deadline_ms {
            spec.limits.deadline_ms = ms;
        }
        if let Some(mib) = self.memory_mib {
            spec.limits.memory_bytes = mib.checked_mul(1 << 20).ok_or_else(|| {
                anyhow::anyhow!(
                    "--memory-mib {mib} is too large; the sandbox allows up to {}",
                    wirl_sandbox::MAX_MEMORY_MIB
                )
            })?;
        }
        spec.limits.fuel = self.fuel;
        spec.limits.reuse_instance = self.reuse_instance;
        spec.grants.read_only_dir = self.read_only_dir.clone();
        if let Some(path) = &self.code_runner {
            spec.code_runner = Some(Box::new(wirl_sandbox::PluginSpec {
                limits: wirl_sandbox::Limits::code_runner(),
                workers: self.code_workers,
                ..plugin_spec(path)?
            }));
        }
        let settings = wirl_sandbox::SandboxSettings { fuel: self.fuel.is_some(), ..Default::default() };
        let sandbox = wirl_sandbox::Sandbox::new(settings)?;
        let name = self.plugin.display().to_string();
        let plugin =
            crate::notices::said_if_slow(&format!("compiling {name} (once: the compiled plugin is cached)"), || {
                sandbox.load(spec)
            })?;
        Ok((sandbox, plugin))
    }
}

/// A plugin named on the command line: a `.wasm` file or `builtin:NAME`.
pub fn plugin_spec(reference: &std::path::Path) -> anyhow::Result<wirl_sandbox::PluginSpec> {
    wirl_builtins::spec(reference).map_err(|message| anyhow::anyhow!("--plugin: {message}"))
}
