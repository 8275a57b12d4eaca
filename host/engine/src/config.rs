//! Model configuration, mirroring Hugging Face's `config.json` for Llama-family decoders.

use serde::{Deserialize, Serialize};

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
    /// `rope_scaling`; [`Config::from_json`] folds it into those (and export writes them).
    #[serde(default, skip_serializing)]
    pub rope_parameters: Option<RopeParameters>,
    /// Per layer, `full_attention` or `sliding_attention` (transformers ≥ 5): only full
    /// attention is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
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
}

/// The `model_type`s this engine runs.
pub const SUPPORTED: [&str; 4] = ["llama", "qwen2", "qwen3", "mistral"];

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

/// transformers ≥ 5's `rope_parameters`: the base, and the scaling in `rope_scaling`'s own
/// fields (`rope_type` "default": none).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RopeParameters {
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(flatten)]
    pub scaling: Option<RopeScaling>,
}

impl Config {
    /// A `config.json`'s text, with transformers ≥ 5's `rope_parameters` folded into
    /// `rope_theta` and `rope_scaling` (a config that only has `rope_parameters` would
    /// otherwise run with the default base of 10,000: wrong logits, no error).
    pub fn from_json(text: &str) -> Result<Config, String> {
        let mut config: Config = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(parameters) = config.rope_parameters.take() {
            if let Some(theta) = parameters.rope_theta {
                config.rope_theta = theta;
            }
            config.rope_scaling = parameters.scaling.filter(|s| s.rope_type != "default").or(config.rope_scaling);
        }
        Ok(config)
    }

    /// The HF names of every tensor a Llama-family model of this config stores (what loading
    /// reads and export writes).
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names = vec!["model.embed_tokens.weight".to_string()];
        for i in 0..self.num_hidden_layers {
            let p = format!("model.layers.{i}");
            for part in [
                "input_layernorm",
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
                "self_attn.o_proj",
                "post_attention_layernorm",
                "mlp.gate_proj",
                "mlp.up_proj",
                "mlp.down_proj",
            ] {
                names.push(format!("{p}.{part}.weight"));
            }
            if self.qkv_bias() {
                for part in ["q_proj", "k_proj", "v_proj"] {
                    names.push(format!("{p}.self_attn.{part}.bias"));
                }
            }
            if self.qk_norm() {
                for part in ["q_norm", "k_norm"] {
                    names.push(format!("{p}.self_attn.{part}.weight"));
                }
            }
        }
        names.push("model.norm.weight".into());
        if !self.tie_word_embeddings {
            names.push("lm_head.weight".into());
        }
        names
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    pub fn qkv_bias(&self) -> bool {
        self.attention_bias.unwrap_or(self.model_type == "qwen2")
    }

    /// Queries and keys RMS-normed per head (over `head_dim`) before the rotary embedding:
    /// Qwen3's `q_norm` and `k_norm`.
    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// Check what the model code relies on; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !SUPPORTED.contains(&self.model_type.as_str()) {
            return Err(format!(
                "model_type {:?} is not supported; this engine runs these decoders: {}",
                self.model_type,
                SUPPORTED.join(", ")
            ));
        }
        if let Some(kind) = self.layer_types.iter().flatten().find(|kind| *kind != "full_attention") {
            return Err(format!(
                "layer_types has {kind:?}: only full-attention layers are supported (this engine attends to every \
                 earlier position)"
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Err(format!(
                "use_sliding_window is true: {} with sliding-window attention is not supported (this engine \
                 attends to every earlier position); a config with use_sliding_window = false loads",
                self.model_type
            ));
        }
        if self.num_attention_heads == 0
            || self.num_kv_heads() == 0
            || !self.num_attention_heads.is_multiple_of(self.num_kv_heads())
        {
            return Err(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!("head_dim ({}) must be even for rotary embeddings", self.head_dim()));
        }
        if let Some(scaling) = &self.rope_scaling
            && !matches!(scaling.rope_type.as_str(), "llama3" | "default")
        {
            return Err(format!(
                "rope_scaling.rope_type {:?} is not supported (llama3 and default are)",
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
            hidden.saturating_mul(2),
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
        let head = if self.tie_word_embeddings { 0 } else { embeddings };
        [embeddings, n(self.num_hidden_layers).saturating_mul(layer), hidden, head]
            .into_iter()
            .fold(0, u64::saturating_add)
    }

    /// Inverse frequencies of the rotary embedding, with Llama 3 scaling when configured.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let dim = self.head_dim();
        let base: Vec<f64> = (0..dim / 2).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / dim as f64)).collect();
        let Some(scaling) = self.rope_scaling.as_ref().filter(|s| s.rope_type == "llama3") else {
            return base.into_iter().map(|f| f as f32).collect();
        };
        let factor = scaling.factor.unwrap_or(8.0);
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
        for model_type in ["gemma3_text", "qwen3_moe", "llava"] {
            let error = config(serde_json::json!({"model_type": model_type})).validate().unwrap_err();
            assert!(error.contains(model_type) && error.contains("llama, qwen2, qwen3, mistral"), "{error}");
        }
        let error = config(serde_json::json!({"use_sliding_window": true})).validate().unwrap_err();
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
        let error = Config::from_json(&sliding).unwrap().validate().unwrap_err();
        assert!(error.contains("sliding_attention"), "{error}");
    }
}
