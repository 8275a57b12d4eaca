//! Loading a model: a Hugging Face directory (`config.json`, `*.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`) or a GGUF file.

use crate::block_matmul::{self, BlockMatrix, Format};
use crate::comm::{Comm, Solo};
use crate::config::Config;
use crate::family::{self, Family, Part};
use crate::llama::{LoraPair, Model, Weight, WeightSource};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result, files};
use candle_core::quantized::{GgmlDType, QMatMul, gguf_file};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wirl_model::weights::WeightMirror;

/// How to load.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub device: Device,
    /// Keep a GGUF file's matrices quantized (fast inference, not trainable). Otherwise they
    /// are dequantized to `dtype`.
    pub quantized: bool,
    /// The dtype of dense weights and activations; `None` picks f32 on the CPU and bf16 on
    /// CUDA (what each runs fastest without losing training precision on the CPU).
    pub dtype: Option<DType>,
    /// The dtype the linear layers' matrices (and a tied head's) are stored in, when it
    /// differs from `dtype`: bf16 matrices beside f32 activations on the CPU halve the bytes
    /// every decoding step streams, and the products stay f32 (the decoding kernels widen
    /// bf16 as they load it; larger products widen the matrix per call). `None`: `dtype`.
    pub matrix_dtype: Option<DType>,
    /// The tensor-parallel group this process's shard belongs to ([`Solo`]: the whole model).
    pub comm: Arc<dyn Comm>,
    /// A LoRA adapter directory (PEFT's format, as LoRA runs checkpoint it) merged into the
    /// weights as they load: the model computes as base + adapter, at the base's speed.
    pub adapter: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: Device::Cpu,
            quantized: false,
            dtype: None,
            matrix_dtype: None,
            comm: Arc::new(Solo),
            adapter: None,
        }
    }
}

impl LoadOptions {
    /// The dtype dense weights are loaded in.
    pub fn dense_dtype(&self) -> DType {
        self.dtype.unwrap_or(if self.device.is_cuda() { DType::BF16 } else { DType::F32 })
    }

    /// Weights kept in `dtype` the way the device runs them best: on the CPU the linear
    /// layers' matrices only (the arithmetic stays f32: bf16 pays there as bytes streamed,
    /// not as arithmetic); elsewhere every weight and the activations.
    pub fn weights_in(mut self, dtype: DType) -> Self {
        if self.device.is_cpu() {
            self.matrix_dtype = Some(dtype);
        } else {
            self.dtype = Some(dtype);
        }
        self
    }

    /// The dtype linear layers' matrices are loaded in.
    pub fn matrix_dtype(&self) -> DType {
        self.matrix_dtype.unwrap_or(self.dense_dtype())
    }
}

/// A model with its tokenizer.
pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub config: Config,
    /// Where it came from.
    pub path: PathBuf,
}

/// Load the model at `path`: a directory in HF layout, or a `.gguf` file.
pub fn load(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    if let Some(adapter) = &options.adapter {
        return load_adapted(path, adapter, options);
    }
    let (config, tokenizer, mut source) = open(path, options, Kind::LanguageModel)?;
    let model = Model::load_shard(&config, source.as_mut(), &options.device, options.comm.clone())?;
    Ok(LoadedModel { model, tokenizer, config, path: path.to_path_buf() })
}

/// Load the sequence classifier at `path` (a reward model: [`crate::reward_model`]); a
/// language model is refused.
pub fn load_classifier(path: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    let (config, tokenizer, mut source) = open(path, options, Kind::Classifier)?;
    let model = Model::load_shard(&config, source.as_mut(), &options.device, options.comm.clone())?;
    Ok(LoadedModel { model, tokenizer, config, path: path.to_path_buf() })
}

/// What a caller needs the checkpoint to be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A language model: it generates, and trains as a policy.
    LanguageModel,
    /// A sequence classifier: it scores texts.
    Classifier,
}

/// Refuse a checkpoint whose head is not the one `wanted` (`classifier`: it is a sequence
/// classifier, of `architectures`), before its weights are read.
fn check_head(path: &Path, architectures: &[String], classifier: bool, wanted: Kind) -> Result<()> {
    let message = match wanted {
        Kind::LanguageModel if classifier => format!(
            "{} is a sequence classifier ({}: a `score` head, no vocabulary logits): it scores texts and cannot \
             generate or train as a policy. Use it as a reward: `[[rewards]] model = \"{}\"`",
            path.display(),
            architectures.join(", "),
            path.display()
        ),
        Kind::Classifier if !classifier => format!(
            "{} is not a sequence classifier (its config.json's `architectures` names no \
             `...ForSequenceClassification`): a reward model is one, saved with its `score` head",
            path.display()
        ),
        _ => return Ok(()),
    };
    Err(Error::Config { field: "architectures".into(), message })
}

/// The model at `path` with the LoRA adapter at `adapter` merged into its dense weights (each
/// adapted matrix `W + scale·B·A`, computed in f32, then kept in the matrices' dtype).
fn load_adapted(path: &Path, adapter: &Path, options: &LoadOptions) -> Result<LoadedModel> {
    if options.quantized {
        return Err(Error::Input(format!(
            "the adapter {} is merged into dense weights, and quantized ones are not: load the model without \
             --quantized (or `wirl model merge` it, and quantize the merged model)",
            adapter.display()
        )));
    }
    let (config, tokenizer, mut tensors) = load_tensors(path, options)?;
    let lora = crate::lora::read(adapter, &config)?;
    crate::lora::merge(&mut tensors, &lora, &config)?;
    for (module, _, _) in lora.spec.modules(&config) {
        let name = format!("{module}.weight");
        let merged = tensors[&name].to_dtype(options.matrix_dtype())?;
        tensors.insert(name, merged);
    }
    let model = Model::load_shard(&config, &mut TensorSource::new(&tensors), &options.device, options.comm.clone())?;
    Ok(LoadedModel { model, tokenizer, config, path: path.to_path_buf() })
}

/// Every weight of the model at `path` as a dense tensor under its HF name (what the trainer
/// turns into variables, and checkpoints write back): the layers' projection matrices in
/// `matrix_dtype` (a frozen LoRA base kept in bf16), every other tensor in `dtype` — the
/// head too, which the trainer's fused head reads in f32.
pub fn load_tensors(path: &Path, options: &LoadOptions) -> Result<(Config, Tokenizer, HashMap<String, Tensor>)> {
    let options = LoadOptions { quantized: false, ..options.clone() };
    let (config, tokenizer, mut source) = open(path, &options, Kind::LanguageModel)?;
    let dtype = options.dense_dtype();
    let mut tensors = HashMap::new();
    for name in config.tensor_names() {
        // Matrices through `linear_weight` (GGUF: q/k rows back in HF order), the rest
        // through `dense` (GGUF Gemma: norms stored as 1 + w made w again).
        let projection = config.family().is_projection_weight(&name);
        let tensor = if projection || name == family::OUTPUT_WEIGHT {
            let Weight::Dense(tensor) = source.linear_weight(&name)? else {
                unreachable!("opened without quantization")
            };
            if projection { tensor } else { tensor.to_dtype(dtype)? }
        } else {
            source.dense(&name)?
        };
        tensors.insert(name, tensor);
    }
    Ok((config, tokenizer, tensors))
}

/// The config, tokenizer and weights of the model at `path`, not yet assembled.
fn open(path: &Path, options: &LoadOptions, wanted: Kind) -> Result<(Config, Tokenizer, Box<dyn WeightSource>)> {
    if path.is_dir() {
        open_hf_dir(path, options, wanted)
    } else if path.is_file() {
        // A GGUF file holds a language model.
        check_head(path, &[], false, wanted)?;
        let (config, tokenizer, mut source) = open_gguf(path, &options.device, options.quantized)?;
        source.dtype = options.dense_dtype();
        source.matrix_dtype = options.matrix_dtype();
        Ok((config, tokenizer, Box::new(source)))
    } else {
        Err(Error::Format { file: path.display().to_string(), message: "no such file or directory".into() })
    }
}

/// Weights already in memory, under HF names (the trainer's variables). Tensors are shared,
/// not copied: a model built from them sees every in-place update. With a LoRA scale, the
/// adapters' A and B under their in-memory names (`crate::lora`) are applied beside the
/// weights they adapt. [`TensorSource::copied_as`]: the model gets its own copies in another
/// dtype instead (a GPU's bf16 inference weights beside the trainer's f32), which a
/// [`WeightMirror`] refreshes after each update.
pub struct TensorSource<'a> {
    pub tensors: &'a HashMap<String, Tensor>,
    pub lora_scale: Option<f64>,
    /// The dtype of the model's own copies; `None`: the tensors themselves.
    copy_as: Option<DType>,
    /// The copies made, by name (a tied table asked for twice is copied once).
    copies: HashMap<String, Tensor>,
    /// Copies fused into one tensor ([`WeightSource::fuse`]): each source's name, the fused
    /// tensor and the row it starts at.
    fused: Vec<(String, Tensor, usize)>,
}

impl<'a> TensorSource<'a> {
    pub fn new(tensors: &'a HashMap<String, Tensor>) -> Self {
        TensorSource { tensors, lora_scale: None, copy_as: None, copies: HashMap::new(), fused: Vec::new() }
    }

    /// With the LoRA adapters among `tensors` applied at `scale` (`None`: none).
    pub fn with_lora_scale(mut self, scale: Option<f64>) -> Self {
        self.lora_scale = scale;
        self
    }

    /// The model gets its own copy of every tensor, converted to `dtype` (the tensors' own
    /// dtype: shared, as without this).
    pub fn copied_as(mut self, dtype: DType) -> Self {
        self.copy_as = Some(dtype);
        self
    }

    /// What refreshes the copies of the tensors that `trained` names from their sources
    /// (the others, frozen, were copied once). Empty when nothing was copied.
    pub fn mirror(self, trained: impl Fn(&str) -> bool) -> WeightMirror {
        let whole = self.copies.into_iter().map(|(name, copy)| (name, copy, 0));
        let pairs = whole
            .chain(self.fused)
            .filter(|(name, _, _)| trained(name))
            .map(|(name, copy, row)| (self.tensors[&name].detach(), copy, row))
            .collect();
        WeightMirror::new(pairs)
    }
}

impl WeightSource for TensorSource<'_> {
    fn linear_weight(&mut self, name: &str) -> Result<Weight> {
        Ok(Weight::Dense(self.dense(name)?))
    }

    fn dense(&mut self, name: &str) -> Result<Tensor> {
        // Detached: the same storage (a trainer's updates are seen), but inference builds no
        // gradient graph through a trainer's variables — else every cached key and value
        // would keep the whole history of activations that made it alive.
        let tensor = self
            .tensors
            .get(name)
            .map(Tensor::detach)
            .ok_or_else(|| Error::Format { file: "weights".into(), message: format!("no tensor `{name}`") })?;
        match self.copy_as {
            Some(dtype) if dtype != tensor.dtype() => {
                if let Some(copy) = self.copies.get(name) {
                    return Ok(copy.clone());
                }
                let copy = tensor.to_dtype(dtype)?;
                self.copies.insert(name.to_owned(), copy.clone());
                Ok(copy)
            }
            _ => Ok(tensor),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Only copies are fused (the model's own; a shared tensor stays where the trainer
    /// updates it), each part the whole copy made of its name; the mirror then refreshes
    /// each part's rows of the fused tensor.
    fn fuse(&mut self, names: &[String], parts: &[&Tensor]) -> Result<Option<Tensor>> {
        let whole_copies = names.len() == parts.len()
            && names
                .iter()
                .zip(parts)
                .all(|(name, part)| self.copies.get(name).is_some_and(|copy| copy.id() == part.id()));
        if !whole_copies {
            return Ok(None);
        }
        let fused = Tensor::cat(parts, 0)?;
        let mut row = 0;
        for (name, part) in names.iter().zip(parts) {
            self.copies.remove(name);
            self.fused.push((name.clone(), fused.clone(), row));
            row += part.dim(0)?;
        }
        Ok(Some(fused))
    }

    fn adapter(&mut self, module: &str) -> Result<Option<LoraPair>> {
        let Some(scale) = self.lora_scale else { return Ok(None) };
        let (a, b) = (LoraPair::a_name(module), LoraPair::b_name(module));
        if !self.contains(&a) {
            return Ok(None);
        }
        Ok(Some(LoraPair { a: self.dense(&a)?, b: self.dense(&b)?, scale }))
    }
}

/// The config of the model at `path` (an HF directory's `config.json`, or a GGUF file's
/// metadata), checked: what the engine would run, without reading any weight.
pub fn read_config(path: &Path) -> Result<Config> {
    let origin = path.display().to_string();
    let format_error = |crate::Refused(message)| Error::Format { file: origin.clone(), message };
    if path.is_dir() {
        let config_path = path.join("config.json");
        let format_error = |crate::Refused(message)| Error::Format { file: config_path.display().to_string(), message };
        let config = Config::from_json(&read_text(&config_path)?).map_err(format_error)?;
        config.validate().map_err(format_error)?;
        return Ok(config);
    }
    let mut file = files::open_regular(path)?;
    let content = read_gguf(&mut file).map_err(format_error)?;
    let config = config_from_gguf(&content.metadata).map_err(format_error)?;
    config.validate().map_err(format_error)?;
    Ok(config)
}

/// A model's small text file (a config, a template), as a dataset is read: regular files
/// only, within [`files::MAX_CONFIG_BYTES`].
fn read_text(path: &Path) -> Result<String> {
    Ok(files::read_text_within(path, files::MAX_CONFIG_BYTES)?)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(&read_text(path)?)
        .map_err(|e| Error::Format { file: path.display().to_string(), message: format!("not valid JSON: {e}") })
}

fn open_hf_dir(dir: &Path, options: &LoadOptions, wanted: Kind) -> Result<(Config, Tokenizer, Box<dyn WeightSource>)> {
    let config = read_config(dir)?;
    check_head(dir, &config.architectures, config.classifier_labels().is_some(), wanted)?;

    let index = dir.join("model.safetensors.index.json");
    let shards: Vec<PathBuf> = if index.exists() {
        let map = read_json(&index)?;
        let weight_map = map.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::Format {
            file: index.display().to_string(),
            message: "missing field `weight_map`".into(),
        })?;
        let mut names: Vec<String> = weight_map.values().filter_map(|v| v.as_str().map(str::to_string)).collect();
        names.sort();
        names.dedup();
        names.iter().map(|name| files::inside(dir, name, &index)).collect::<wirl_model::Result<_>>()?
    } else {
        vec![dir.join("model.safetensors")]
    };
    for shard in &shards {
        if !shard.exists() {
            return Err(Error::Format { file: shard.display().to_string(), message: "weights file missing".into() });
        }
        // A FIFO would block the memory map for ever; a device would map without end.
        files::open_regular(shard)?;
    }
    // SAFETY: the files are memory-mapped read-only; wirl does not modify model files while
    // they are loaded, and the tensors are copied out before the map is dropped.
    let tensors =
        unsafe { candle_core::safetensors::MmapedSafetensors::multi(&shards) }.map_err(|e| Error::Format {
            file: shards.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
            message: format!("not valid safetensors: {}", crate::without_backtrace(&e)),
        })?;
    let source = SafetensorsSource {
        config: config.clone(),
        tensors,
        device: options.device.clone(),
        dtype: options.dense_dtype(),
        matrix_dtype: options.matrix_dtype(),
        dir: dir.to_path_buf(),
    };

    let tokenizer = read_tokenizer(dir, &config)?;
    Ok((config, tokenizer, Box::new(source)))
}

/// The tokenizer of the HF files in `dir` (`tokenizer.json`, `tokenizer_config.json` or
/// `chat_template.jinja` for the template), its end tokens those of `config` and of
/// `generation_config.json` too.
fn read_tokenizer(dir: &Path, config: &Config) -> Result<Tokenizer> {
    let tokenizer_config = dir.join("tokenizer_config.json");
    let mut tokenizer_config = if tokenizer_config.exists() { Some(read_json(&tokenizer_config)?) } else { None };
    // transformers (4.43 on) writes the template to a file of its own beside the config;
    // it is the one in force when both are there.
    let template_file = dir.join("chat_template.jinja");
    if template_file.exists() {
        let template = read_text(&template_file)?;
        let config = tokenizer_config.get_or_insert_with(|| serde_json::json!({}));
        if let Some(config) = config.as_object_mut() {
            config.insert("chat_template".into(), template.into());
        }
    }
    let tokenizer_path = dir.join("tokenizer.json");
    let mut tokenizer = Tokenizer::from_json(
        files::read_text_within(&tokenizer_path, files::MAX_TOKENIZER_BYTES)?,
        tokenizer_config.as_ref(),
        &tokenizer_path.display().to_string(),
    )?;
    if let Some(eos) = &config.eos_token_id {
        tokenizer.add_eos_ids(eos.ids());
    }
    let generation_config = dir.join("generation_config.json");
    if generation_config.exists()
        && let Some(eos) = read_json(&generation_config)?.get("eos_token_id")
    {
        let ids: Vec<u32> = match eos {
            serde_json::Value::Array(list) => list.iter().filter_map(|v| v.as_u64().map(|n| n as u32)).collect(),
            other => other.as_u64().map(|n| n as u32).into_iter().collect(),
        };
        tokenizer.add_eos_ids(ids);
    }
    Ok(tokenizer)
}

struct SafetensorsSource {
    /// What each tensor's shape is checked against.
    config: Config,
    tensors: candle_core::safetensors::MmapedSafetensors,
    device: Device,
    dtype: DType,
    matrix_dtype: DType,
    dir: PathBuf,
}

impl WeightSource for SafetensorsSource {
    fn linear_weight(&mut self, name: &str) -> Result<Weight> {
        Ok(Weight::Dense(self.read(name, self.matrix_dtype)?))
    }

    fn dense(&mut self, name: &str) -> Result<Tensor> {
        self.read(name, self.dtype)
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.get(name).is_ok()
    }

    /// The model's weights are its own: fused.
    fn fuse(&mut self, _names: &[String], parts: &[&Tensor]) -> Result<Option<Tensor>> {
        Ok(Some(Tensor::cat(parts, 0)?))
    }
}

impl SafetensorsSource {
    /// The tensor `name` in `dtype`, checked finite.
    fn read(&self, name: &str, dtype: DType) -> Result<Tensor> {
        // The shape first, from the header: a config that does not describe the weights is
        // named here, not as a shape error inside the first forward.
        if let Ok(view) = self.tensors.get(name) {
            self.config
                .check_shape(name, view.shape())
                .map_err(|crate::Refused(message)| Error::Format { file: self.dir.display().to_string(), message })?;
            if !matches!(view.dtype(), safetensors::Dtype::F32 | safetensors::Dtype::F16 | safetensors::Dtype::BF16) {
                return Err(Error::Format {
                    file: self.dir.display().to_string(),
                    message: format!(
                        "weight `{name}` is stored as {:?}: model weights must be F32, F16 or BF16",
                        view.dtype()
                    ),
                });
            }
        }
        let tensor = self.tensors.load(name, &self.device).map_err(|e| Error::Format {
            file: self.dir.display().to_string(),
            message: format!("weight `{name}`: {}", crate::without_backtrace(&e)),
        })?;
        // Weights with NaN or infinity (a diverged run's) would sample garbage silently.
        if !crate::finite::all_finite(&tensor)? {
            return Err(Error::Format {
                file: self.dir.display().to_string(),
                message: format!("weight `{name}` holds NaN or infinite values; this model is unusable"),
            });
        }
        Ok(tensor.to_dtype(dtype)?)
    }
}

/// A GGUF file's HF config, its tokenizer, and its tensors under HF names.
pub(crate) fn open_gguf(path: &Path, device: &Device, quantized: bool) -> Result<(Config, Tokenizer, GgufSource)> {
    let origin = path.display().to_string();
    let format_error = |crate::Refused(message)| Error::Format { file: origin.clone(), message };
    let mut file = files::open_regular(path)?;
    let content = read_gguf(&mut file).map_err(format_error)?;
    let config = config_from_gguf(&content.metadata).map_err(format_error)?;
    config.validate().map_err(format_error)?;
    let tokenizer = gguf_tokenizer(path, &content.metadata, &config, &origin)?;
    let source = GgufSource {
        config: config.clone(),
        family: config.family(),
        content,
        file,
        origin: origin.clone(),
        device: device.clone(),
        quantized,
        dtype: DType::F32,
        matrix_dtype: DType::F32,
        heads: config.num_attention_heads,
        kv_heads: config.num_kv_heads(),
    };
    Ok((config, tokenizer, source))
}

/// A GGUF's tokenizer: from its metadata (GPT-2 byte-level BPE), or — for SentencePiece
/// vocabularies (`tokenizer.ggml.model` "llama", as Gemma's), which wirl reads from
/// Hugging Face's `tokenizer.json` — from a `tokenizer.json` beside the file (with its
/// `tokenizer_config.json` for the chat template).
fn gguf_tokenizer(
    path: &Path,
    metadata: &HashMap<String, gguf_file::Value>,
    config: &Config,
    origin: &str,
) -> Result<Tokenizer> {
    let model = metadata.get("tokenizer.ggml.model").and_then(|v| v.to_string().ok()).cloned();
    let beside = path.parent().map(|dir| dir.join("tokenizer.json")).filter(|p| p.is_file());
    match (model.as_deref(), beside) {
        (Some("gpt2") | None, _) => Tokenizer::from_gguf(metadata, origin),
        (_, Some(tokenizer_path)) => {
            let dir = tokenizer_path.parent().expect("a file's directory");
            read_tokenizer(dir, config)
        }
        (Some(other), None) => Err(Error::Format {
            file: origin.to_string(),
            message: format!(
                "its tokenizer is {other:?} (SentencePiece), which wirl reads from Hugging Face's tokenizer.json: put \
                 the model's tokenizer.json (and tokenizer_config.json, for its chat template) beside the GGUF file"
            ),
        }),
    }
}

/// A GGUF file's metadata and tensor table, what candle's reader trusts checked first
/// ([`crate::gguf_check`]).
pub fn read_gguf(file: &mut std::fs::File) -> std::result::Result<gguf_file::Content, crate::Refused> {
    crate::gguf_check::alignment(file).map_err(|e| format!("not a usable GGUF file: {e}"))?;
    let content =
        gguf_file::Content::read(file).map_err(|e| format!("not a GGUF file: {}", crate::without_backtrace(&e)))?;
    crate::gguf_check::tensor_dims(&content).map_err(|e| format!("not a usable GGUF file: {e}"))?;
    Ok(content)
}

/// An HF `config.json` for a GGUF, from its `<arch>.*` metadata (llama, gemma3).
pub fn config_from_gguf(metadata: &HashMap<String, gguf_file::Value>) -> std::result::Result<Config, crate::Refused> {
    let arch = metadata
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .ok_or("missing metadata key `general.architecture`")?
        .clone();
    let Some(family) = family::by_gguf_architecture(&arch) else {
        return Err(crate::refused!(
            "general.architecture {arch:?} is not supported in GGUF files yet ({} are)",
            family::gguf_architectures().join(", ")
        ));
    };
    let number = |key: &str| -> std::result::Result<f64, crate::Refused> {
        let value = metadata.get(&format!("{arch}.{key}")).ok_or(format!("missing metadata key `{arch}.{key}`"))?;
        value
            .to_u64()
            .map(|v| v as f64)
            .or_else(|_| value.to_u32().map(f64::from))
            .or_else(|_| value.to_f32().map(f64::from))
            .or_else(|_| value.to_f64())
            .map_err(|e| crate::refused!("metadata key `{arch}.{key}`: {}", crate::without_backtrace(&e)))
    };
    let tokens = metadata.get("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()).map(Vec::len);
    let heads = number("attention.head_count")? as usize;
    let gemma = family.model_type == family::GEMMA3.model_type;
    let head_dim = number("attention.key_length").ok().map(|v| v as usize);
    let mut config = Config {
        model_type: family.model_type.into(),
        architectures: vec![if gemma { "Gemma3ForCausalLM" } else { "LlamaForCausalLM" }.into()],
        vocab_size: number("vocab_size").map(|v| v as usize).ok().or(tokens).ok_or("missing vocabulary size")?,
        hidden_size: number("embedding_length")? as usize,
        intermediate_size: number("feed_forward_length")? as usize,
        num_hidden_layers: number("block_count")? as usize,
        num_attention_heads: heads,
        num_key_value_heads: Some(number("attention.head_count_kv").map(|v| v as usize).unwrap_or(heads)),
        head_dim,
        rms_norm_eps: number("attention.layer_norm_rms_epsilon")?,
        rope_theta: number("rope.freq_base").unwrap_or(10_000.0),
        rope_scaling: None,
        rope_parameters: None,
        partial_rotary_factor: None,
        layer_types: None,
        sliding_window: None,
        sliding_window_pattern: None,
        rope_local_base_freq: None,
        query_pre_attn_scalar: None,
        final_logit_softcapping: None,
        attn_logit_softcapping: None,
        hidden_act: None,
        hidden_activation: None,
        use_bidirectional_attention: None,
        max_position_embeddings: number("context_length")? as usize,
        // llama.cpp omits `output.weight` when the embeddings are tied.
        tie_word_embeddings: true,
        attention_bias: Some(false),
        use_sliding_window: None,
        bos_token_id: metadata.get("tokenizer.ggml.bos_token_id").and_then(|v| v.to_u32().ok()),
        eos_token_id: metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(|v| v.to_u32().ok())
            .map(crate::config::EosTokenId::One),
        pad_token_id: metadata.get("tokenizer.ggml.padding_token_id").and_then(|v| v.to_u32().ok()).map(Into::into),
        // A GGUF file holds a language model.
        id2label: None,
    };
    if gemma {
        gemma3_fixed_choices(&mut config, metadata, &number)?;
    }
    Ok(config)
}

/// What llama.cpp's gemma3 graph fixes rather than stores, set on `config` (read from a
/// gemma3 GGUF's `metadata`; `number` reads a `gemma3.*` key).
fn gemma3_fixed_choices(
    config: &mut Config,
    metadata: &HashMap<String, gguf_file::Value>,
    number: &dyn Fn(&str) -> std::result::Result<f64, crate::Refused>,
) -> std::result::Result<(), crate::Refused> {
    let (heads, head_dim) = (config.num_attention_heads, config.head_dim);
    // Every sixth layer global (unless the file says otherwise), the sliding layers' rope
    // base 10,000, GELU; scores scaled by head_dim^-1/2 (as transformers' Gemma 3 configs
    // below 27B set query_pre_attn_scalar).
    config.sliding_window = Some(number("attention.sliding_window")? as usize);
    config.sliding_window_pattern = Some(number("attention.sliding_window_pattern").map_or(6, |v| v as usize));
    config.rope_local_base_freq = Some(10_000.0);
    // llama.cpp scales scores by head_dim^-1/2, but 27B's by (hidden / heads)^-1/2.
    let size = metadata.get("general.size_label").and_then(|v| v.to_string().ok());
    config.query_pre_attn_scalar = if size.is_some_and(|s| s == "27B") {
        Some(config.hidden_size as f64 / heads as f64)
    } else {
        head_dim.map(|d| d as f64)
    };
    config.hidden_activation = Some("gelu_pytorch_tanh".into());
    config.final_logit_softcapping = number("final_logit_softcapping").ok();
    if let (Ok(factor), Some(kind)) =
        (number("rope.scaling.factor"), metadata.get("gemma3.rope.scaling.type").and_then(|v| v.to_string().ok()))
        && kind == "linear"
    {
        config.rope_scaling = Some(crate::config::RopeScaling {
            rope_type: "linear".into(),
            factor: Some(factor),
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: None,
        });
    }
    Ok(())
}

pub(crate) struct GgufSource {
    /// What each tensor's shape is checked against.
    config: Config,
    /// The family's names in llama.cpp's files and its conventions (Gemma's norms stored as
    /// `1 + w`, its q/k rows not permuted).
    family: &'static Family,
    content: gguf_file::Content,
    file: std::fs::File,
    origin: String,
    device: Device,
    quantized: bool,
    /// Of dequantized tensors.
    dtype: DType,
    /// Of dequantized matrices of linear layers.
    matrix_dtype: DType,
    heads: usize,
    kv_heads: usize,
}

impl GgufSource {
    /// llama.cpp's name for an HF tensor name.
    fn gguf_name(&self, name: &str) -> String {
        self.family.gguf_name(name)
    }

    fn qtensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor> {
        let gguf = self.gguf_name(name);
        if let Some(info) = self.content.tensor_infos.get(&gguf) {
            self.config.check_shape(name, info.shape.dims()).map_err(|message| Error::Format {
                file: self.origin.clone(),
                message: format!("{message} (GGUF tensor `{gguf}`)"),
            })?;
        }
        self.content.tensor(&mut self.file, &gguf, &self.device).map_err(|e| Error::Format {
            file: self.origin.clone(),
            message: format!("tensor `{gguf}` (for `{name}`): {}", crate::without_backtrace(&e)),
        })
    }

    /// Whether matrices stored as `dtype` go to wirl's CPU block kernel (`block_matmul.rs`).
    fn own_kernel(&self, dtype: GgmlDType) -> bool {
        self.device.is_cpu() && Format::of(dtype).is_some() && block_matmul::available()
    }

    /// Whether the matrix `name`, stored as `dtype`, is kept quantized. Q4_1 / Q8_0 on a CPU
    /// with wirl's kernel: all of them, computed as llama.cpp computes them (greedy tokens match its
    /// own; a test). Otherwise query projections stay dense: on the Q8_0 re-encoding, with
    /// their input activations quantized too, the default model's answers drifted from the
    /// f32 path's, and dense query projections alone restored them (docs/BENCHMARKS.md).
    fn stays_quantized(&self, name: &str, dtype: GgmlDType) -> bool {
        self.quantized
            && (self.own_kernel(dtype) || !self.is_matrix_of(name, Part::Query))
            && !matches!(dtype, GgmlDType::F32 | GgmlDType::F16)
    }

    /// Whether `name` is a layer's matrix of `part` alone (a q or k projection).
    fn is_matrix_of(&self, name: &str, part: Part) -> bool {
        let module = self.family.module_of(part);
        name.strip_suffix(".weight").is_some_and(|n| module.is_some_and(|m| n.ends_with(&format!(".{m}"))))
    }

    fn stored_dtype(&self, name: &str) -> GgmlDType {
        self.content.tensor_infos.get(&self.gguf_name(name)).map_or(GgmlDType::F32, |info| info.ggml_dtype)
    }

    /// Whether quantized matrices are re-encoded as Q8_0 (on the CPU).
    fn requantize(&self) -> bool {
        self.device.is_cpu()
    }

    /// The number of heads whose rows llama.cpp permuted in this matrix, if any (not
    /// Gemma's: its rope is NeoX's, the HF layout).
    fn permuted_heads(&self, name: &str) -> Option<usize> {
        if !self.family.gguf.is_some_and(|g| g.permuted_rope) {
            return None;
        }
        if self.is_matrix_of(name, Part::Query) {
            Some(self.heads)
        } else if self.is_matrix_of(name, Part::Key) {
            Some(self.kv_heads)
        } else {
            None
        }
    }
}

impl WeightSource for GgufSource {
    fn linear_weight(&mut self, name: &str) -> Result<Weight> {
        let tensor = self.qtensor(name)?;
        if self.stays_quantized(name, tensor.dtype()) {
            if self.own_kernel(tensor.dtype()) {
                let matrix =
                    BlockMatrix::from_qtensor(&tensor, self.permuted_heads(name)).map_err(|e| Error::Format {
                        file: self.origin.clone(),
                        message: format!("tensor `{}` (for `{name}`): {e}", self.gguf_name(name)),
                    })?;
                return Ok(Weight::Blocks(Arc::new(matrix)));
            }
            if !self.requantize() {
                return Ok(Weight::Quantized(Arc::new(QMatMul::from_qtensor(tensor)?)));
            }
            // Without wirl's block kernel (other types, or a CPU without AVX2 / F16C), a quantized
            // matrix on the CPU becomes Q8_0 (in HF row order): candle's CPU
            // dot products for Q4_1 and several other types are scalar code, Q8_0's is
            // vectorised; Q8_0 keeps a 4-bit type's levels to within half a step of 1/127 of
            // each block's largest weight. Decode ran 2.7× faster (docs/BENCHMARKS.md).
            let dense = tensor.dequantize(&self.device)?;
            let dense = match self.permuted_heads(name) {
                Some(heads) => unpermute_rows(&dense, heads)?,
                None => dense,
            };
            let requantized = candle_core::quantized::QTensor::quantize(&dense, GgmlDType::Q8_0)?;
            return Ok(Weight::Quantized(Arc::new(QMatMul::from_qtensor(requantized)?)));
        }
        let dense = tensor.dequantize(&self.device)?.to_dtype(self.matrix_dtype)?;
        Ok(Weight::Dense(match self.permuted_heads(name) {
            Some(heads) => unpermute_rows(&dense, heads)?,
            None => dense,
        }))
    }

    fn dense(&mut self, name: &str) -> Result<Tensor> {
        let tensor = self.qtensor(name)?.dequantize(&self.device)?;
        // llama.cpp stores Gemma's norm weights with the 1 of `1 + w` added; the model adds it.
        let offset = self.family.norms.offset;
        let tensor = if offset != 0.0 && name.ends_with("norm.weight") { (tensor - offset)? } else { tensor };
        Ok(tensor.to_dtype(self.dtype)?)
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(&self.gguf_name(name))
    }

    /// Dense matrices read from the file are the model's own: fused.
    fn fuse(&mut self, _names: &[String], parts: &[&Tensor]) -> Result<Option<Tensor>> {
        Ok(Some(Tensor::cat(parts, 0)?))
    }

    fn interleaved(&self, name: &str) -> bool {
        // Quantized q/k kept as stored have llama.cpp's row order; the model reorders their
        // outputs. Dense and requantized ones were put in HF order first.
        self.permuted_heads(name).is_some() && !self.requantize() && self.stays_quantized(name, self.stored_dtype(name))
    }
}

/// Undo llama.cpp's q/k row permutation (`[heads, 2, dim/2, in]` stored as
/// `[heads, dim/2, 2, in]`), giving the HF (rotate-half) layout.
pub fn unpermute_rows(weight: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, cols) = weight.dims2()?;
    let head_dim = rows / heads;
    Ok(weight.reshape((heads, head_dim / 2, 2, cols))?.transpose(1, 2)?.reshape((rows, cols))?.contiguous()?)
}

#[cfg(test)]
mod tests {
    use super::config_from_gguf;
    use candle_core::quantized::gguf_file::Value;
    use std::collections::HashMap;

    /// A gemma3 GGUF's metadata as Gemma-3-270M's file has it.
    fn gemma3() -> HashMap<String, Value> {
        let mut metadata: HashMap<String, Value> = [
            ("context_length", 32768u32),
            ("embedding_length", 640),
            ("block_count", 18),
            ("feed_forward_length", 2048),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 1),
            ("attention.key_length", 256),
            ("attention.sliding_window", 512),
            ("vocab_size", 262144),
        ]
        .into_iter()
        .map(|(key, value)| (format!("gemma3.{key}"), Value::U32(value)))
        .collect();
        metadata.insert("general.architecture".into(), Value::String("gemma3".into()));
        metadata.insert("gemma3.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-6));
        metadata.insert("gemma3.rope.freq_base".into(), Value::F32(1e6));
        metadata
    }

    #[test]
    fn a_gemma3_gguf_gives_llama_cpps_fixed_choices() {
        let config = config_from_gguf(&gemma3()).unwrap();
        config.validate().unwrap();
        assert_eq!(config.model_type, "gemma3_text");
        let global: Vec<usize> = (0..18).filter(|&i| !config.layer_is_sliding(i)).collect();
        assert_eq!(global, [5, 11, 17], "every sixth layer is global");
        assert_eq!((config.window(), config.rope_local_base_freq), (Some(512), Some(10_000.0)));
        assert_eq!(config.attention_scale(), 1.0 / 16.0, "head_dim^-1/2");
        assert!(config.logit_softcap().is_none());
        let mut big = gemma3();
        big.insert("general.size_label".into(), Value::String("27B".into()));
        big.insert("gemma3.embedding_length".into(), Value::U32(5376));
        big.insert("gemma3.attention.head_count".into(), Value::U32(32));
        assert_eq!(config_from_gguf(&big).unwrap().query_pre_attn_scalar, Some(168.0));
    }

    #[test]
    fn a_gguf_missing_what_its_architecture_needs_is_refused_by_key() {
        let mut metadata = gemma3();
        metadata.remove("gemma3.attention.sliding_window");
        let error = config_from_gguf(&metadata).unwrap_err().0;
        assert!(error.contains("gemma3.attention.sliding_window"), "{error}");
        let mut zero = gemma3();
        zero.insert("gemma3.attention.sliding_window".into(), Value::U32(0));
        let error = config_from_gguf(&zero).unwrap().validate().unwrap_err().0;
        assert!(error.contains("sliding_window"), "{error}");
        let mut other = gemma3();
        other.insert("general.architecture".into(), Value::String("qwen3".into()));
        let error = config_from_gguf(&other).unwrap_err().0;
        assert!(error.contains("\"qwen3\"") && error.contains("llama, gemma3"), "{error}");
    }
}
