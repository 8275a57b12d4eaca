//! LoRA adapters, in the format PEFT reads and writes: a directory with
//! `adapter_config.json` and `adapter_model.safetensors`, whose tensors are named
//! `base_model.model.<module>.lora_A.weight` (`[rank, in]`) and `.lora_B.weight`
//! (`[out, rank]`). An adapted projection computes `x·Wᵀ + (alpha / rank)·(x·Aᵀ)·Bᵀ`; the
//! base `W` is never changed (merging is a separate, explicit step: [`merge`]).
//!
//! In memory, adapter tensors go by their module's HF name plus `.lora_A.weight` /
//! `.lora_B.weight` (`model.layers.0.self_attn.q_proj.lora_A.weight`), beside the base's
//! tensors, so that the engine's loader and the trainer's forward find them by the same
//! names as the weights they adapt.
//!
//! What this module must not know: how adapters are trained (the trainer's concern) or
//! where a run keeps them.

use crate::config::Config;
use crate::family::{self, Family};
pub use crate::ops::LoraPair;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The projections an adapter may target, by PEFT's module names: every family's
/// ([`crate::family::Family::projections`]), each once, in declaration order.
pub fn targets() -> Vec<&'static str> {
    let mut targets: Vec<&'static str> = Vec::new();
    for module in family::FAMILIES.iter().flat_map(|f| f.projections()) {
        let target = Family::target_name(module);
        if !targets.contains(&target) {
            targets.push(target);
        }
    }
    targets
}

/// The most rank an adapter may have (beyond it an adapter is no longer low-rank for any
/// model this engine runs; a typo like 16000 would otherwise allocate gigabytes).
pub const MAX_RANK: usize = 1024;

/// PEFT's file names.
pub const CONFIG_FILE: &str = "adapter_config.json";
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The prefix PEFT puts before a module's HF name in its tensor names.
const PEFT_PREFIX: &str = "base_model.model.";

/// What an adapter is: its rank, scale and the projections it adapts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    /// Module names of [`targets`], each once.
    pub target_modules: Vec<String>,
}

impl LoraSpec {
    /// `alpha / rank`: what the adapter's product is multiplied by.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Check rank, alpha and targets; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), crate::Refused> {
        if self.rank == 0 || self.rank > MAX_RANK {
            return Err(crate::refused!("rank {} is out of range: 1 to {MAX_RANK}", self.rank));
        }
        if !self.alpha.is_finite() || self.alpha <= 0.0 || self.alpha > 1e6 {
            return Err(crate::refused!("alpha {} must be a positive finite number (at most 1e6)", self.alpha));
        }
        if self.target_modules.is_empty() {
            return Err(crate::refused!("target_modules is empty: name one or more of {}", targets().join(", ")));
        }
        let targets = targets();
        for (i, module) in self.target_modules.iter().enumerate() {
            if !targets.contains(&module.as_str()) {
                return Err(crate::refused!(
                    "target_modules has {module:?}, which is not a projection this engine adapts ({})",
                    targets.join(", ")
                ));
            }
            if self.target_modules[..i].contains(module) {
                return Err(crate::refused!("target_modules names {module:?} twice"));
            }
        }
        Ok(())
    }

    /// Whether every target is a projection of `config`'s family: Phi-3 has no `q_proj` (its
    /// query is a part of `qkv_proj`), and a target it lacks would adapt nothing, silently.
    /// The default list ([`targets`], every family's projections) means "every projection
    /// this model has".
    pub fn check_family(&self, config: &Config) -> std::result::Result<(), crate::Refused> {
        if self.target_modules == targets() {
            return Ok(());
        }
        let family = config.family();
        let own: Vec<&str> = family.projections().into_iter().map(Family::target_name).collect();
        match self.target_modules.iter().find(|m| !own.contains(&m.as_str())) {
            Some(missing) => Err(crate::refused!(
                "target_modules has {missing:?}, which {} ({}) does not have: its projections are {}",
                family.title,
                config.model_type,
                own.join(", ")
            )),
            None => Ok(()),
        }
    }

    /// Every adapted module of a model of `config`, by HF name, with its `(in, out)` sizes:
    /// the projections of `config`'s family that `target_modules` names, layer by layer.
    pub fn modules(&self, config: &Config) -> Vec<(String, usize, usize)> {
        let (family, sizes) = (config.family(), config.sizes());
        let adapted: Vec<&str> = family
            .projections()
            .into_iter()
            .filter(|m| self.target_modules.iter().any(|t| t == Family::target_name(m)))
            .collect();
        let mut modules = Vec::new();
        for i in 0..config.num_hidden_layers {
            for module in &adapted {
                let (output, input) = family.projection_shape(&sizes, module).unwrap_or_default();
                modules.push((format!("{}.{module}", family::layer(i)), input, output));
            }
        }
        modules
    }
}

/// An adapter: its spec and its tensors under in-memory names (see the module's doc).
#[derive(Clone, Debug)]
pub struct Adapter {
    pub spec: LoraSpec,
    pub tensors: HashMap<String, Tensor>,
}

/// The name of module `module`'s A (`[rank, in]`) or B (`[out, rank]`) matrix.
pub fn a_name(module: &str) -> String {
    LoraPair::a_name(module)
}

pub fn b_name(module: &str) -> String {
    LoraPair::b_name(module)
}

impl Adapter {
    /// A new adapter as PEFT starts one: A uniform in ±1/√in (Kaiming with a = √5), B zero,
    /// so that base + adapter starts equal to the base. Seeded: the same seed, the same A.
    pub fn init(spec: &LoraSpec, config: &Config, seed: u64, device: &Device) -> Result<Adapter> {
        spec.validate().map_err(|crate::Refused(message)| Error::Config { field: "lora".into(), message })?;
        spec.check_family(config)
            .map_err(|crate::Refused(message)| Error::Config { field: "lora.target_modules".into(), message })?;
        let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            // splitmix64: fast, seedable, and enough for an initialization.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut tensors = HashMap::new();
        for (module, input, output) in spec.modules(config) {
            let bound = 1.0 / (input as f32).sqrt();
            let a: Vec<f32> = (0..spec.rank * input).map(|_| (2.0 * next() - 1.0) * bound).collect();
            tensors.insert(a_name(&module), Tensor::from_vec(a, (spec.rank, input), device)?);
            tensors.insert(b_name(&module), Tensor::zeros((output, spec.rank), DType::F32, device)?);
        }
        Ok(Adapter { spec: spec.clone(), tensors })
    }

    /// Check that the tensors are exactly the spec's for a model of `config`, of the right
    /// shapes and finite: an adapter for another model or a damaged file is refused naming
    /// the tensor, never half-applied.
    pub fn check(&self, config: &Config, origin: &str) -> Result<()> {
        let bad = |message: String| Error::Format { file: origin.to_string(), message };
        let modules = self.spec.modules(config);
        for (module, input, output) in &modules {
            for (name, shape) in
                [(a_name(module), [self.spec.rank, *input]), (b_name(module), [*output, self.spec.rank])]
            {
                let Some(tensor) = self.tensors.get(&name) else {
                    return Err(bad(format!("no tensor `{PEFT_PREFIX}{name}` (target_modules names it)")));
                };
                if tensor.dims() != shape {
                    return Err(bad(format!(
                        "`{PEFT_PREFIX}{name}` has shape {:?}, the model needs {shape:?} (an adapter for another \
                         model, or another rank)",
                        tensor.dims()
                    )));
                }
                if !crate::finite::all_finite(tensor)? {
                    return Err(bad(format!("`{PEFT_PREFIX}{name}` holds NaN or infinite values")));
                }
            }
        }
        if self.tensors.len() != 2 * modules.len() {
            let extra = self
                .tensors
                .keys()
                .find(|name| !modules.iter().any(|(m, _, _)| **name == a_name(m) || **name == b_name(m)))
                .cloned()
                .unwrap_or_default();
            return Err(bad(format!(
                "tensor `{PEFT_PREFIX}{extra}` is not one of the adapter's (this engine reads LoRA A and B \
                 matrices of {} only)",
                targets().join(", ")
            )));
        }
        Ok(())
    }

    /// Module `module`'s pair, if the adapter targets it.
    pub fn pair(&self, module: &str) -> Option<LoraPair> {
        let a = self.tensors.get(&a_name(module))?;
        let b = self.tensors.get(&b_name(module))?;
        Some(LoraPair { a: a.clone(), b: b.clone(), scale: self.spec.scale() })
    }
}

/// `adapter_config.json` as PEFT writes it: the fields this engine reads, and those whose
/// other values it cannot honour (checked, so that such an adapter is refused by name).
#[derive(Debug, Deserialize, Serialize)]
struct PeftConfig {
    peft_type: String,
    r: usize,
    lora_alpha: f64,
    target_modules: TargetModules,
    #[serde(default)]
    lora_dropout: f64,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    rank_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    alpha_pattern: HashMap<String, serde_json::Value>,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    #[serde(default)]
    task_type: Option<String>,
    /// Every other field PEFT writes: those that change what the adapter computes are
    /// checked to be off ([`OFF_FIELDS`]).
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// Fields of newer PEFT versions that must be absent, null, false or empty for a plain LoRA
/// adapter (each changes which modules are adapted or how).
const OFF_FIELDS: [&str; 8] = [
    "lora_bias",
    "target_parameters",
    "exclude_modules",
    "layer_replication",
    "use_qalora",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "use_bdlora",
];

fn is_off(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null | serde_json::Value::Bool(false) => true,
        serde_json::Value::Array(items) => items.is_empty(),
        serde_json::Value::Object(fields) => fields.is_empty(),
        serde_json::Value::String(text) => text.is_empty(),
        serde_json::Value::Number(_) | serde_json::Value::Bool(true) => false,
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    /// A regular expression over module names (PEFT allows it); refused.
    Pattern(String),
}

/// Read a PEFT adapter directory, checked against the model it is for.
pub fn read(dir: &Path, config: &Config) -> Result<Adapter> {
    let spec = read_spec(dir, config)?;
    let weights_origin = dir.join(WEIGHTS_FILE).display().to_string();
    let tensors = read_weights(dir, &spec)?;
    let adapter = Adapter { spec, tensors };
    adapter.check(config, &weights_origin)?;
    Ok(adapter)
}

/// The adapter's `adapter_config.json`: plain LoRA (anything PEFT can add that this engine
/// does not compute is refused by name), on modules the model's family has.
fn read_spec(dir: &Path, config: &Config) -> Result<LoraSpec> {
    let config_path = dir.join(CONFIG_FILE);
    let origin = config_path.display().to_string();
    let text = crate::files::read_text_within(&config_path, crate::files::MAX_CONFIG_BYTES).map_err(|e| match e {
        Error::Io { file, source } => Error::Io { file: format!("{file} (a PEFT adapter directory has one)"), source },
        other => other,
    })?;
    let peft: PeftConfig =
        serde_json::from_str(&text).map_err(|e| Error::Format { file: origin.clone(), message: e.to_string() })?;
    let refuse = |message: String| Error::Format { file: origin.clone(), message };
    if peft.peft_type != "LORA" {
        return Err(refuse(format!("peft_type is {:?}: only LORA adapters are read", peft.peft_type)));
    }
    let unsupported = [
        (peft.use_rslora, "use_rslora is true (rank-stabilized scaling)"),
        (peft.use_dora, "use_dora is true (DoRA's magnitude vectors)"),
        (peft.fan_in_fan_out, "fan_in_fan_out is true (transposed Conv1D weights)"),
        (peft.bias.as_deref().is_some_and(|b| b != "none"), "bias is not \"none\" (trained biases)"),
        (peft.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()), "modules_to_save names whole modules"),
        (peft.layers_to_transform.as_ref().is_some_and(|l| !l.is_null()), "layers_to_transform picks layers"),
        (!peft.rank_pattern.is_empty() || !peft.alpha_pattern.is_empty(), "rank_pattern or alpha_pattern is set"),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(on, _)| *on) {
        return Err(refuse(format!("{what}: not supported; this engine reads plain LoRA on {}", targets().join(", "))));
    }
    if let Some(field) = OFF_FIELDS.iter().find(|f| peft.rest.get(**f).is_some_and(|v| !is_off(v))) {
        return Err(refuse(format!(
            "{field} is set: not supported; this engine reads plain LoRA on {}",
            targets().join(", ")
        )));
    }
    let target_modules = match peft.target_modules {
        TargetModules::List(list) => list,
        TargetModules::Pattern(pattern) => {
            return Err(refuse(format!(
                "target_modules is the pattern {pattern:?}: name the modules in a list (of {})",
                targets().join(", ")
            )));
        }
    };
    let spec = LoraSpec { rank: peft.r, alpha: peft.lora_alpha, target_modules };
    spec.validate().and_then(|()| spec.check_family(config)).map_err(|crate::Refused(message)| refuse(message))?;
    Ok(spec)
}

/// The adapter's tensors (`adapter_model.safetensors`), each checked before it is kept: its
/// shape before it is copied, its name, its values; in f32, by module name.
fn read_weights(dir: &Path, spec: &LoraSpec) -> Result<HashMap<String, Tensor>> {
    let weights_path = dir.join(WEIGHTS_FILE);
    let weights_origin = weights_path.display().to_string();
    // A link to a device or a FIFO would be read without end, or block.
    crate::files::open_regular(&weights_path)?;
    // Mapped, not read: the header is checked before any tensor is copied (a sparse 20 GB
    // file was once read whole before its header was looked at).
    // SAFETY: mapped read-only; wirl does not modify adapter files while it loads them, and
    // each tensor is copied out before the map is dropped.
    let mapped =
        unsafe { candle_core::safetensors::MmapedSafetensors::new(&weights_path) }.map_err(|e| Error::Format {
            file: weights_origin.clone(),
            message: format!("not valid safetensors: {}", crate::without_backtrace(&e)),
        })?;
    // Each tensor's declared shape is checked before it is copied: a LoRA matrix is 2-D, one
    // side the rank, the other no wider than a model's widest matrix.
    let mut names = Vec::new();
    for (name, view) in mapped.tensors() {
        let shape = view.shape();
        let plausible =
            shape.len() == 2 && shape.contains(&spec.rank) && shape.iter().all(|&d| d <= crate::config::MAX_WIDTH * 16);
        if !plausible {
            return Err(Error::Format {
                file: weights_origin,
                message: format!(
                    "tensor `{name}` has shape {shape:?}: a LoRA matrix of rank {} is [rank, in] or [out, rank]",
                    spec.rank
                ),
            });
        }
        names.push(name);
    }
    let mut stored = Vec::with_capacity(names.len());
    for name in names {
        let tensor = mapped
            .load(&name, &Device::Cpu)
            .map_err(|e| Error::Format { file: weights_origin.clone(), message: format!("tensor `{name}`: {e}") })?;
        stored.push((name, tensor));
    }
    let mut tensors = HashMap::new();
    for (name, tensor) in stored {
        // PEFT writes `base_model.model.<module>.lora_A.weight`; some writers keep the
        // adapter's name (`lora_A.default.weight`).
        let Some(inner) = name.strip_prefix(PEFT_PREFIX) else {
            return Err(Error::Format {
                file: weights_origin,
                message: format!("tensor `{name}` does not start with `{PEFT_PREFIX}` (not a PEFT adapter)"),
            });
        };
        let inner = inner
            .replace(".lora_A.default.weight", ".lora_A.weight")
            .replace(".lora_B.default.weight", ".lora_B.weight");
        // Non-finite adapter weights would sample garbage, train on it, or merge into a
        // model of NaN: refused as the base's are.
        if !crate::finite::all_finite(&tensor)? {
            return Err(Error::Format {
                file: weights_origin,
                message: format!("tensor `{name}` holds NaN or infinite values; this adapter is unusable"),
            });
        }
        tensors.insert(inner, tensor.to_dtype(DType::F32)?);
    }
    Ok(tensors)
}

/// Write `adapter` as a PEFT directory at `dir` (which must not exist): whole or not at
/// all, as [`crate::export::write_hf_dir`]. `base` names the base model for its readers.
pub fn write(dir: &Path, adapter: &Adapter, base: &str) -> Result<()> {
    let peft = PeftConfig {
        peft_type: "LORA".into(),
        r: adapter.spec.rank,
        lora_alpha: adapter.spec.alpha,
        target_modules: TargetModules::List(adapter.spec.target_modules.clone()),
        lora_dropout: 0.0,
        bias: Some("none".into()),
        use_rslora: false,
        use_dora: false,
        fan_in_fan_out: false,
        modules_to_save: None,
        layers_to_transform: None,
        rank_pattern: HashMap::new(),
        alpha_pattern: HashMap::new(),
        base_model_name_or_path: Some(base.to_string()),
        task_type: Some("CAUSAL_LM".into()),
        rest: serde_json::Map::new(),
    };
    let mut json = serde_json::to_value(&peft).expect("the adapter config serializes");
    json["inference_mode"] = true.into();
    let tensors: HashMap<String, Tensor> = adapter
        .tensors
        .iter()
        .map(|(name, t)| Ok((format!("{PEFT_PREFIX}{name}"), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<_>>()?;
    crate::files::write_dir_atomically(dir, |partial| {
        let path = partial.join(CONFIG_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(&json).expect("JSON values serialize"))
            .map_err(|e| crate::files::io(&path, e))?;
        crate::files::save_safetensors(&tensors, &partial.join(WEIGHTS_FILE))
    })
}

/// The base's tensors with every adapted weight replaced by `W + scale·B·A` (f32): a plain
/// model that needs no adapter.
pub fn merge(base: &mut HashMap<String, Tensor>, adapter: &Adapter, config: &Config) -> Result<()> {
    for (module, _, _) in adapter.spec.modules(config) {
        let name = format!("{module}.weight");
        let pair = adapter.pair(&module).ok_or_else(|| Error::Input(format!("the adapter has no `{module}`")))?;
        let weight = base.get(&name).ok_or_else(|| Error::Input(format!("the base model has no `{name}`")))?;
        let delta = (pair.b.matmul(&pair.a)? * pair.scale)?;
        let merged = (weight.to_dtype(DType::F32)? + delta.to_device(weight.device())?)?;
        // Finite adapters can still overflow f32 in `B·A`: a merged model of infinities is
        // refused, never written.
        if !crate::finite::all_finite(&merged)? {
            return Err(Error::Input(format!(
                "merging the adapter into `{name}` gives NaN or infinite weights (its product B·A · scale \
                 overflows f32): nothing is written"
            )));
        }
        base.insert(name, merged);
    }
    Ok(())
}
