//! Model configuration, mirroring Hugging Face's `config.json` for Llama-family decoders.

use serde::{Deserialize, Serialize};

pub use crate::family::Activation;
use crate::family::{self, Family, Head, Sizes, Windows};

/// The fields of `config.json` this engine reads. Unknown fields are ignored (HF configs
/// carry many); missing required ones are an error naming the field.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Config {
    /// `llama`, `qwen2`, `qwen3` or `mistral` (SmolLM2 is `llama`).
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Grouped-query attention: fewer key/value heads than query heads. Defaults to
    /// `num_attention_heads` (plain multi-head attention).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// transformers ≥ 5 writes the rope's base and scaling here instead of `rope_theta` and
    /// `rope_scaling` (Gemma 3: one such table per layer type); [`Config::from_json`] folds
    /// it into those (and export writes them).
    #[serde(default, skip_serializing)]
    pub rope_parameters: Option<serde_json::Value>,
    /// The share of each head the rope turns (Phi-4-mini: 0.75, the rest passed through):
    /// this engine turns whole heads, so anything but 1 is refused rather than run wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    /// Per layer, `full_attention` or `sliding_attention` (transformers ≥ 5): sliding layers
    /// are Gemma 3's only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3: the keys a sliding layer's query attends to (itself and the positions
    /// before it); other families' `sliding_window` is ignored unless switched on (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// Gemma 3 before `layer_types`: every `sliding_window_pattern`-th layer is global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<usize>,
    /// Gemma 3: the rope base of sliding layers (global layers use `rope_theta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 3: attention scores are scaled by `query_pre_attn_scalar^-1/2` instead of
    /// `head_dim^-1/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_pre_attn_scalar: Option<f64>,
    /// Logits become `cap · tanh(logits / cap)` (Gemma 2 sets it; Gemma 3 leaves it null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 2's soft-capped attention scores: refused (not Gemma 3's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_logit_softcapping: Option<f64>,
    /// The MLP's activation: `silu` (Llama, Qwen) or `gelu_pytorch_tanh` (Gemma).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_activation: Option<String>,
    /// Gemma 3 embedding models attend both ways: refused (this engine decodes causally).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_bidirectional_attention: Option<bool>,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2 has them; Llama does not).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// Qwen2/Qwen3's switch for sliding-window attention (refused when on: this engine
    /// attends to every earlier position).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<EosTokenId>,
    /// Kept as it is written so that export writes it back: transformers' defaults differ by
    /// family (Phi-3's is 32000, outside a small vocabulary, where loading then fails). Never
    /// read: any value loads (early Llama conversions wrote -1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<serde_json::Value>,
    /// A sequence classifier's labels by index (transformers writes `id2label`, and reads
    /// their count as `num_labels`): how many scores its `score` head gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id2label: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The most positions the engine runs a model over, whatever its config claims: rope
/// tables and key/value caches are sized by it (a config claiming 10^7 positions asked for
/// gigabytes of tables before a weight was read). 128 Ki positions; [`Config::context`].
pub const MAX_CONTEXT: usize = 1 << 17;
/// The largest context a config may claim at all (Llama 4 claims 10 M).
pub const MAX_CLAIMED_CONTEXT: usize = 1 << 30;
/// Bounds on a config's sizes, each far above any released decoder's (vocabularies reach
/// 262,144, widths 16,384, layers 126, heads 128, head dims 256, parameters 4 × 10^11).
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_WIDTH: usize = 1 << 16;
pub const MAX_LAYERS: usize = 1 << 10;
pub const MAX_HEADS: usize = 1 << 10;
pub const MAX_HEAD_DIM: usize = 1 << 12;
pub const MAX_PARAMETERS: u64 = 1 << 42;

fn default_rope_theta() -> f64 {
    10_000.0
}

/// `eos_token_id` is a number or a list of numbers in HF configs.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum EosTokenId {
    One(u32),
    Many(Vec<u32>),
}

impl EosTokenId {
    pub fn ids(&self) -> Vec<u32> {
        match self {
            EosTokenId::One(id) => vec![*id],
            EosTokenId::Many(ids) => ids.clone(),
        }
    }
}

/// Llama 3's frequency-dependent rope scaling (`rope_type: llama3`); other types are refused
/// at load rather than silently ignored.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: String,
    #[serde(default)]
    pub factor: Option<f64>,
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
}

impl Config {
    /// A `config.json`'s text, with transformers ≥ 5's `rope_parameters` folded into
    /// `rope_theta` and `rope_scaling` (a config that only has `rope_parameters` would
    /// otherwise run with the default base of 10,000: wrong logits, no error).
    pub fn from_json(text: &str) -> Result<Config, crate::Refused> {
        let mut config: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(parameters) = config.rope_parameters.take() {
            // Gemma 3 writes a table per layer type; the others one table.
            let (global, local) = match parameters.get("full_attention") {
                Some(full) => (full.clone(), parameters.get("sliding_attention").cloned()),
                None => (parameters, None),
            };
            let theta = |table: &serde_json::Value| table.get("rope_theta").and_then(serde_json::Value::as_f64);
            if let Some(theta) = theta(&global) {
                config.rope_theta = theta;
            }
            if let Some(base) = local.as_ref().and_then(theta) {
                config.rope_local_base_freq = Some(base);
            }
            if let Some(factor) = global.get("partial_rotary_factor").and_then(serde_json::Value::as_f64) {
                config.partial_rotary_factor = Some(factor);
            }
            if global.get("rope_type").is_some_and(|t| t != "default") {
                let scaling: RopeScaling =
                    serde_json::from_value(global).map_err(|e| format!("rope_parameters: {e}"))?;
                config.rope_scaling = Some(scaling);
            }
        }
        Ok(config)
    }

    /// This config's family (`model_type`'s declaration). A `model_type` this engine does not
    /// run reads as Llama until [`Config::validate`] refuses it.
    pub fn family(&self) -> &'static Family {
        family::by_model_type(&self.model_type).unwrap_or(&family::LLAMA)
    }

    /// What RMS norms add to their weights: Gemma scales by `1 + w`, the others by `w`.
    pub fn norm_offset(&self) -> f64 {
        self.family().norms.offset
    }

    /// What the embeddings are multiplied by (Gemma: `√hidden_size`).
    pub fn embed_scale(&self) -> Option<f64> {
        self.family().scaled_embedding.then(|| (self.hidden_size as f64).sqrt())
    }

    /// What attention scores are multiplied by (`query_pre_attn_scalar` is Gemma's key:
    /// ignored for other families, as transformers does).
    pub fn attention_scale(&self) -> f64 {
        let scalar = self.query_pre_attn_scalar.filter(|_| self.family().gemma_scaling);
        1.0 / scalar.unwrap_or(self.head_dim() as f64).sqrt()
    }

    /// The cap of the logits' soft-capping (Gemma's key: ignored for other families, and for
    /// a classifier's scores, which transformers does not cap).
    pub fn logit_softcap(&self) -> Option<f64> {
        self.final_logit_softcapping.filter(|_| self.family().gemma_scaling && self.classifier_labels().is_none())
    }

    /// How many scores the checkpoint's head gives when it is a sequence classifier
    /// (`architectures` names a `...ForSequenceClassification`: a `score` head read at a
    /// text's last token, as reward models are), `None` for a causal language model. The
    /// count is `id2label`'s, two without one (transformers' default `num_labels`).
    pub fn classifier_labels(&self) -> Option<usize> {
        let classifier = self.architectures.iter().any(|a| a.ends_with("ForSequenceClassification"));
        classifier.then(|| self.id2label.as_ref().map_or(2, serde_json::Map::len))
    }

    /// Norms after attention and after the MLP as well as before each (Gemma's four).
    pub fn sandwich_norms(&self) -> bool {
        self.family().norms.attention_out.is_some()
    }

    /// The MLP's activation (checked by [`Config::validate`]).
    pub fn activation(&self) -> Activation {
        let named = self.hidden_activation.as_deref().or(self.hidden_act.as_deref());
        match named {
            Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_tanh") => Activation::GeluTanh,
            None => self.family().activation,
            _ => Activation::Silu,
        }
    }

    /// Whether layer `i` attends through a sliding window ([`Config::sliding_window`]).
    pub fn layer_is_sliding(&self, i: usize) -> bool {
        if self.family().windows != Windows::ByLayer {
            return false;
        }
        match &self.layer_types {
            Some(types) => types.get(i).is_some_and(|t| t == "sliding_attention"),
            None => !(i + 1).is_multiple_of(self.sliding_window_pattern.unwrap_or(6).max(1)),
        }
    }

    /// The sliding layers' window, if any layer slides.
    pub fn window(&self) -> Option<usize> {
        (0..self.num_hidden_layers).any(|i| self.layer_is_sliding(i)).then(|| self.sliding_window.unwrap_or(usize::MAX))
    }

    /// The HF names of every tensor a checkpoint of this config stores (what loading reads
    /// and export writes): [`Family::tensor_names`].
    pub fn tensor_names(&self) -> Vec<String> {
        self.family().tensor_names(&self.sizes())
    }

    /// The sizes names and shapes depend on ([`Family::tensor_names`] and the rest).
    pub fn sizes(&self) -> Sizes {
        Sizes {
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            kv_heads: self.num_kv_heads(),
            head_dim: self.head_dim(),
            head: match self.classifier_labels() {
                Some(labels) => Head::Scores { labels },
                None => Head::Vocabulary { tied: self.tie_word_embeddings },
            },
            qkv_bias: self.qkv_bias(),
        }
    }

    /// The shape a tensor of [`Config::tensor_names`] has in an HF checkpoint of this config
    /// (`None`: a name it does not describe).
    pub fn expected_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.family().expected_shape(&self.sizes(), name)
    }

    /// An error naming `name` when `dims` (as stored) is not the shape the config gives it.
    pub fn check_shape(&self, name: &str, dims: &[usize]) -> Result<(), crate::Refused> {
        match self.expected_shape(name) {
            Some(expected) if expected != dims => Err(crate::refused!(
                "tensor `{name}` has shape {dims:?}, but config.json's sizes give it {expected:?}: the config does \
                 not describe these weights"
            )),
            _ => Ok(()),
        }
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size.checked_div(self.num_attention_heads).unwrap_or(0))
    }

    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.family().qkv_bias)
    }

    /// Queries and keys RMS-normed per head (over `head_dim`) before the rotary embedding:
    /// Qwen3's `q_norm` and `k_norm`.
    pub fn qk_norm(&self) -> bool {
        self.family().norms.query_key.is_some()
    }

    /// The positions this engine runs the model over: the claimed context
    /// (`max_position_embeddings`), no more than [`MAX_CONTEXT`] (rope tables and caches are
    /// sized by it), and for Mistral no more than its `sliding_window` (within the window,
    /// attending to every earlier position is exactly what the window does; past it, it is
    /// not, and this engine does not slide).
    pub fn context(&self) -> usize {
        let mut context = self.max_position_embeddings.min(MAX_CONTEXT);
        if self.family().windows == Windows::CapsContext
            && let Some(window) = self.sliding_window.filter(|&w| w > 0)
        {
            context = context.min(window);
        }
        context
    }

    /// Every size, count and parameter a model file gives, checked before anything is
    /// sized by it: positive, finite, within what any real model has, consistent with each
    /// other. The message names the field and the limit.
    ///
    /// Over ~80 lines on purpose: one rule per field the file gives, in the config's order, each
    /// naming its field and limit; a list of rules reads best whole.
    fn check_numbers(&self) -> Result<(), crate::Refused> {
        let within = |field: &str, value: usize, max: usize| -> Result<(), crate::Refused> {
            if value == 0 || value > max {
                return Err(crate::refused!("{field} is {value}: it must be between 1 and {max}"));
            }
            Ok(())
        };
        within("vocab_size", self.vocab_size, MAX_VOCAB)?;
        within("hidden_size", self.hidden_size, MAX_WIDTH)?;
        within("intermediate_size", self.intermediate_size, MAX_WIDTH * 16)?;
        within("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS)?;
        within("num_attention_heads", self.num_attention_heads, MAX_HEADS)?;
        within("num_key_value_heads", self.num_kv_heads(), MAX_HEADS)?;
        within("head_dim", self.head_dim(), MAX_HEAD_DIM)?;
        within("max_position_embeddings", self.max_position_embeddings, MAX_CLAIMED_CONTEXT)?;
        if let Some(labels) = self.classifier_labels() {
            within("id2label's count of labels", labels, MAX_VOCAB)?;
        }
        if let Some(types) = &self.layer_types
            && types.len() != self.num_hidden_layers
        {
            return Err(crate::refused!(
                "layer_types has {} entries for num_hidden_layers {}: one per layer",
                types.len(),
                self.num_hidden_layers
            ));
        }
        let positive = |field: &str, value: f64| -> Result<(), crate::Refused> {
            if !(value.is_finite() && value > 0.0) {
                return Err(crate::refused!("{field} is {value}: it must be a positive, finite number"));
            }
            Ok(())
        };
        positive("rms_norm_eps", self.rms_norm_eps)?;
        if self.rms_norm_eps >= 1.0 {
            return Err(crate::refused!(
                "rms_norm_eps is {}: it must be below 1 (real models use 1e-6 to 1e-5)",
                self.rms_norm_eps
            ));
        }
        positive("rope_theta", self.rope_theta)?;
        if self.rope_theta <= 1.0 {
            return Err(crate::refused!("rope_theta is {}: the rope's base must be above 1", self.rope_theta));
        }
        if let Some(base) = self.rope_local_base_freq {
            positive("rope_local_base_freq", base)?;
            if base <= 1.0 {
                return Err(crate::refused!("rope_local_base_freq is {base}: the rope's base must be above 1"));
            }
        }
        if let Some(scaling) = &self.rope_scaling {
            if let Some(factor) = scaling.factor {
                positive("rope_scaling.factor", factor)?;
            }
            if scaling.rope_type == "llama3" {
                let low = scaling.low_freq_factor.unwrap_or(1.0);
                let high = scaling.high_freq_factor.unwrap_or(4.0);
                positive("rope_scaling.low_freq_factor", low)?;
                positive("rope_scaling.high_freq_factor", high)?;
                if high <= low {
                    return Err(crate::refused!(
                        "rope_scaling.high_freq_factor ({high}) must be above rope_scaling.low_freq_factor ({low})"
                    ));
                }
                if scaling.original_max_position_embeddings == Some(0) {
                    return Err("rope_scaling.original_max_position_embeddings must be at least 1".into());
                }
            }
        }
        if let Some(window) = self.sliding_window
            && window > MAX_CLAIMED_CONTEXT
        {
            return Err(crate::refused!("sliding_window is {window}: it must be at most {MAX_CLAIMED_CONTEXT}"));
        }
        if self.parameter_count() > MAX_PARAMETERS {
            return Err(crate::refused!(
                "the config describes {} parameters: more than this engine loads ({MAX_PARAMETERS})",
                self.parameter_count()
            ));
        }
        Ok(())
    }

    /// The model's family and the variants of it the engine runs (layer kinds, windows,
    /// attention, activation); the message names the field.
    fn check_variants(&self) -> Result<(), crate::Refused> {
        let Some(family) = family::by_model_type(&self.model_type) else {
            return Err(crate::refused!(
                "model_type {:?} is not supported; this engine runs these decoders: {}",
                self.model_type,
                family::model_types().join(", ")
            ));
        };
        let allowed = family.layer_types;
        if let Some(kind) = self.layer_types.iter().flatten().find(|kind| !allowed.contains(&kind.as_str())) {
            return Err(crate::refused!(
                "layer_types has {kind:?}: {} runs {} layers only",
                self.model_type,
                allowed.join(" and ")
            ));
        }
        if family.windows == Windows::ByLayer && self.window().is_some() && self.sliding_window.is_none_or(|w| w == 0) {
            return Err("sliding_window must be a positive number of positions for Gemma 3's sliding layers".into());
        }
        if self.use_bidirectional_attention == Some(true) {
            return Err("use_bidirectional_attention is true (an embedding model): this engine decodes causally".into());
        }
        if let Some(cap) = self.attn_logit_softcapping {
            return Err(crate::refused!(
                "attn_logit_softcapping is {cap}: soft-capped attention scores (Gemma 2) are not supported"
            ));
        }
        if let Some(cap) = self.final_logit_softcapping
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(crate::refused!("final_logit_softcapping ({cap}) must be a positive number"));
        }
        if let Some(scalar) = self.query_pre_attn_scalar
            && !(scalar.is_finite() && scalar > 0.0)
        {
            return Err(crate::refused!("query_pre_attn_scalar ({scalar}) must be a positive number"));
        }
        let named = self.hidden_activation.as_deref().or(self.hidden_act.as_deref());
        if let Some(name) = named
            && !["silu", "gelu_pytorch_tanh", "gelu_new", "gelu_tanh"].contains(&name)
        {
            return Err(crate::refused!(
                "hidden activation {name:?} is not supported (silu and gelu_pytorch_tanh are)"
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Err(crate::refused!(
                "use_sliding_window is true: {} with sliding-window attention is not supported (this engine \
                 attends to every earlier position); a config with use_sliding_window = false loads",
                self.model_type
            ));
        }
        Ok(())
    }

    /// Check what the model code relies on; the message names the field.
    pub fn validate(&self) -> Result<(), crate::Refused> {
        self.check_variants()?;
        if self.num_attention_heads == 0
            || self.num_kv_heads() == 0
            || !self.num_attention_heads.is_multiple_of(self.num_kv_heads())
        {
            return Err(crate::refused!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        self.check_numbers()?;
        if !self.head_dim().is_multiple_of(2) {
            return Err(crate::refused!("head_dim ({}) must be even for rotary embeddings", self.head_dim()));
        }
        if let Some(factor) = self.partial_rotary_factor.filter(|&f| f != 1.0) {
            return Err(crate::refused!(
                "partial_rotary_factor is {factor}: a rope over part of each head is not supported (this engine \
                 turns whole heads; 1.0 loads)"
            ));
        }
        if let Some(scaling) = &self.rope_scaling
            && !matches!(scaling.rope_type.as_str(), "llama3" | "linear" | "default")
        {
            return Err(crate::refused!(
                "rope_scaling.rope_type {:?} is not supported (llama3, linear and default are)",
                scaling.rope_type
            ));
        }
        Ok(())
    }

    /// Parameters of the model (every tensor of [`Config::tensor_names`], by its shape);
    /// saturating, so that absurd sizes in a hostile config count as `u64::MAX`, not wrap.
    pub fn parameter_count(&self) -> u64 {
        let n = |x: usize| x as u64;
        let (hidden, ffn, vocab) = (n(self.hidden_size), n(self.intermediate_size), n(self.vocab_size));
        let head_dim = n(self.head_dim());
        let (q, kv) =
            (n(self.num_attention_heads).saturating_mul(head_dim), n(self.num_kv_heads()).saturating_mul(head_dim));
        let projections = q.saturating_add(kv.saturating_mul(2));
        let mut layer = [
            hidden.saturating_mul(projections),
            q.saturating_mul(hidden),
            hidden.saturating_mul(ffn).saturating_mul(3),
            hidden.saturating_mul(if self.sandwich_norms() { 4 } else { 2 }),
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add);
        if self.qkv_bias() {
            layer = layer.saturating_add(projections);
        }
        if self.qk_norm() {
            layer = layer.saturating_add(head_dim.saturating_mul(2));
        }
        let embeddings = vocab.saturating_mul(hidden);
        let head = match self.sizes().head {
            Head::Vocabulary { tied: true } => 0,
            Head::Vocabulary { tied: false } => embeddings,
            Head::Scores { labels } => n(labels).saturating_mul(hidden),
        };
        [embeddings, n(self.num_hidden_layers).saturating_mul(layer), hidden, head]
            .into_iter()
            .fold(0, u64::saturating_add)
    }

    /// Inverse frequencies of the rotary embedding, with Llama 3 or linear scaling when
    /// configured.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let base = self.base_inv_freq(self.rope_theta);
        let Some(scaling) = self.rope_scaling.as_ref() else {
            return base.into_iter().map(|f| f as f32).collect();
        };
        let factor = scaling.factor.unwrap_or(8.0);
        if scaling.rope_type == "linear" {
            return base.into_iter().map(|f| (f / factor) as f32).collect();
        }
        if scaling.rope_type != "llama3" {
            return base.into_iter().map(|f| f as f32).collect();
        }
        let low = scaling.low_freq_factor.unwrap_or(1.0);
        let high = scaling.high_freq_factor.unwrap_or(4.0);
        let original = scaling.original_max_position_embeddings.unwrap_or(8192) as f64;
        let (low_wavelen, high_wavelen) = (original / low, original / high);
        base.into_iter()
            .map(|freq| {
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let scaled = if wavelen < high_wavelen {
                    freq
                } else if wavelen > low_wavelen {
                    freq / factor
                } else {
                    let smooth = (original / wavelen - low) / (high - low);
                    (1.0 - smooth) * freq / factor + smooth * freq
                };
                scaled as f32
            })
            .collect()
    }

    /// The sliding layers' inverse frequencies (Gemma 3's local base, never scaled), if any
    /// layer slides.
    pub fn local_rope_inv_freq(&self) -> Option<Vec<f32>> {
        self.window()?;
        let base = self.rope_local_base_freq.unwrap_or(10_000.0);
        Some(self.base_inv_freq(base).into_iter().map(|f| f as f32).collect())
    }

    fn base_inv_freq(&self, theta: f64) -> Vec<f64> {
        let dim = self.head_dim();
        (0..dim / 2).map(|i| 1.0 / theta.powf(2.0 * i as f64 / dim as f64)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Config;

    fn config(extra: serde_json::Value) -> Config {
        let mut base = serde_json::json!({
            "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64,
        });
        base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn qwen3_has_its_own_head_dim_norms_and_no_bias() {
        let qwen3 = config(serde_json::json!({}));
        qwen3.validate().unwrap();
        assert_eq!(qwen3.head_dim(), 16, "given apart from hidden_size / heads (8)");
        assert!(qwen3.qk_norm() && !qwen3.qkv_bias());
        let names = qwen3.tensor_names();
        assert!(names.contains(&"model.layers.1.self_attn.q_norm.weight".to_string()));
        assert!(names.contains(&"model.layers.0.self_attn.k_norm.weight".to_string()));
        assert!(!config(serde_json::json!({"model_type": "qwen2"})).qk_norm());
    }

    #[test]
    fn an_unsupported_family_or_variant_is_refused_by_name_with_the_list() {
        for model_type in ["gemma2", "qwen3_moe", "llava"] {
            let error = config(serde_json::json!({"model_type": model_type})).validate().unwrap_err().0;
            assert!(
                error.contains(model_type) && error.contains("llama, qwen2, qwen3, mistral, gemma3_text"),
                "{error}"
            );
        }
        let error = config(serde_json::json!({"use_sliding_window": true})).validate().unwrap_err().0;
        assert!(error.contains("use_sliding_window is true"), "{error}");
        config(serde_json::json!({"use_sliding_window": false})).validate().unwrap();
    }

    /// transformers ≥ 5 writes `rope_parameters`, not `rope_theta`: the base is read from
    /// there (it defaulted to 10,000 before: wrong logits, no error), its scaling too.
    #[test]
    fn transformers_5_rope_parameters_are_read() {
        let text = r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "layer_types": ["full_attention", "full_attention"]}"#;
        let config = Config::from_json(text).unwrap();
        assert_eq!(config.rope_theta, 1_000_000.0);
        assert!(config.rope_scaling.is_none());
        config.validate().unwrap();
        let scaled = text.replace(
            r#""rope_type": "default"}"#,
            r#""rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        );
        let scaling = Config::from_json(&scaled).unwrap().rope_scaling.unwrap();
        assert_eq!((scaling.rope_type.as_str(), scaling.factor), ("llama3", Some(32.0)));
        let sliding =
            text.replace(r#"["full_attention", "full_attention"]"#, r#"["sliding_attention", "full_attention"]"#);
        let error = Config::from_json(&sliding).unwrap().validate().unwrap_err().0;
        assert!(error.contains("sliding_attention"), "{error}");
    }
}
