//! Model configuration, mirroring Hugging Face's `config.json` for Llama-family decoders.

use serde::{Deserialize, Serialize};

/// The fields of `config.json` this engine reads. Unknown fields are ignored (HF configs
/// carry many); missing required ones are an error naming the field.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Config {
    /// `llama` or `qwen2` (SmolLM2 is `llama`).
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
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2 has them; Llama does not).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<EosTokenId>,
}

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

    /// Check what the model code relies on; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !matches!(self.model_type.as_str(), "llama" | "qwen2" | "mistral") {
            return Err(format!(
                "model_type {:?} is not supported; this engine runs llama, qwen2 and mistral decoders",
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
