//! Writing a model out as a Hugging Face directory (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`) that transformers
//! and wirl load. Used by `wirl model export` (GGUF → HF) and by checkpoints.

use crate::config::Config;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// Write `dir` (which must not exist yet) from a config, a tokenizer and HF-named tensors.
/// The directory appears whole or not at all: it is written beside `dir` and renamed.
pub fn write_hf_dir(
    dir: &Path,
    config: &Config,
    tokenizer: &Tokenizer,
    tensors: &HashMap<String, Tensor>,
) -> Result<()> {
    crate::files::write_dir_atomically(dir, |partial| {
        let write = |name: &str, text: String| -> Result<()> {
            let path = partial.join(name);
            Ok(std::fs::write(&path, text).map_err(|e| crate::files::io(&path, e))?)
        };
        let json = |value: &serde_json::Value| serde_json::to_string_pretty(value).expect("JSON values serialize");

        let mut config_json = serde_json::to_value(config).expect("the config serializes");
        // Spell out what wirl derives, so that readers with other defaults agree.
        config_json["num_key_value_heads"] = config.num_kv_heads().into();
        config_json["head_dim"] = config.head_dim().into();
        config_json["attention_bias"] = config.qkv_bias().into();
        config_json["torch_dtype"] = "float32".into();
        // transformers types this one as an integer and refuses `256.0` (Gemma 3's own
        // configs write 256); GGUF metadata carries no such key, wirl derives a float.
        if let Some(scalar) = config.query_pre_attn_scalar
            && scalar.fract() == 0.0
            && scalar.abs() < 1e15
        {
            config_json["query_pre_attn_scalar"] = (scalar as i64).into();
        }
        if let Some(object) = config_json.as_object_mut() {
            object.retain(|_, value| !value.is_null());
        }
        write("config.json", json(&config_json))?;
        let mut tokenizer_config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": config.max_position_embeddings,
            "clean_up_tokenization_spaces": false,
        });
        if let Some(template) = tokenizer.chat_template() {
            tokenizer_config["chat_template"] = template.into();
        }
        if let Some(bos) = tokenizer.bos_token() {
            tokenizer_config["bos_token"] = bos.into();
        }
        if let Some(eos) = tokenizer.eos_token() {
            tokenizer_config["eos_token"] = eos.into();
        }
        write("tokenizer_config.json", json(&tokenizer_config))?;
        write("tokenizer.json", tokenizer.tokenizer_json().to_string())?;
        let mut generation = serde_json::json!({ "eos_token_id": tokenizer.eos_ids() });
        if let Some(bos) = config.bos_token_id {
            generation["bos_token_id"] = bos.into();
        }
        write("generation_config.json", json(&generation))?;
        Ok(crate::files::save_safetensors(tensors, &partial.join("model.safetensors"))?)
    })
}

/// `wirl model export`: a GGUF file as an HF directory, weights dequantized to f32 and q/k
/// in HF's row order.
pub fn gguf_to_hf_dir(gguf: &Path, dir: &Path) -> Result<()> {
    if !gguf.is_file() {
        return Err(Error::Format { file: gguf.display().to_string(), message: "not a GGUF file".into() });
    }
    let options = crate::LoadOptions { dtype: Some(candle_core::DType::F32), ..Default::default() };
    let (config, tokenizer, tensors) = crate::load::load_tensors(gguf, &options)?;
    write_hf_dir(dir, &config, &tokenizer, &tensors)
}

/// `wirl model merge`: the model at `base` (HF directory or GGUF) with the PEFT adapter at
/// `adapter` merged into its weights (`W + (alpha / rank)·B·A`, f32), written as a plain HF
/// directory that needs no adapter.
pub fn merge_to_hf_dir(base: &Path, adapter: &Path, dir: &Path) -> Result<()> {
    let options = crate::LoadOptions { dtype: Some(candle_core::DType::F32), ..Default::default() };
    let (config, tokenizer, mut tensors) = crate::load::load_tensors(base, &options)?;
    let adapter = crate::lora::read(adapter, &config)?;
    crate::lora::merge(&mut tensors, &adapter, &config)?;
    write_hf_dir(dir, &config, &tokenizer, &tensors)
}
