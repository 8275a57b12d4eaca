//! Model files, chat templates, adapters and agents written by someone else: each hostile
//! one generated here, as the red team made them, is refused naming the file, the field and
//! the limit — never a panic, an abort, a hang or an unbounded read; `wirl serve` stays up
//! and stops on SIGTERM whatever its requests are doing.

use crate::engine::{write_tiny_model, write_tiny_tokenizer};
use crate::serve::Server;
use std::path::Path;
use std::time::{Duration, Instant};
use wirl_engine::{ChatMessage, LoadOptions};

fn load_error(dir: &Path) -> String {
    match wirl_engine::load(dir, &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// The tiny model's config.json with `edit` applied to its JSON.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

/// A tiny model whose chat template is `template` (in `chat_template.jinja`).
fn model_with_template(template: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    dir
}

const LOOPING: &str = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
                       {% endfor %}{% endfor %}{% endfor %}";

fn user(content: &str) -> Vec<ChatMessage> {
    vec![ChatMessage { role: "user".into(), content: content.into() }]
}

fn wirl(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(args).output().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Templates that loop, flood and double: each ends at its limit with a message naming the
/// model and the limit, quickly, and the template is refused from then on. (The memory
/// cases stop only under `BudgetAllocator`, which this test binary installs as wirl does.)
#[test]
fn chat_templates_end_at_their_limits_naming_them() {
    assert!(wirl_engine::memory_budget::BudgetAllocator::installed());
    let cases = [
        (LOOPING, "instructions"),
        ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "wrote more than"),
        (
            "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}\
             {% endfor %}{{ ns.s|length }}",
            "MiB of memory",
        ),
        (
            "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}\
             {{ ns.l|list|length }}",
            "MiB of memory",
        ),
    ];
    for (template, limit) in cases {
        let dir = model_with_template(template);
        let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
        // The limit named is the one that ended it (not the time limit, which would say so).
        let error = loaded.tokenizer.render_chat(&user("w3"), true).unwrap_err().to_string();
        assert!(error.contains(limit) && error.contains(&dir.path().display().to_string()), "{limit}: {error}");
        let again = loaded.tokenizer.render_chat(&user("w3"), true).unwrap_err().to_string();
        assert!(again.contains("refused"), "{again}");
    }
    // A real template over a long conversation stays within the limits that grow with it.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    let long: Vec<ChatMessage> = (0..2000)
        .map(|i| ChatMessage { role: "user".into(), content: format!("w{} ", 2 + i % 60).repeat(200) })
        .collect();
    let rendered = loaded.tokenizer.render_chat(&long, true).unwrap();
    assert!(rendered.len() > 2000 * 200 * 3, "{}", rendered.len());
}

/// `wirl generate --chat` with a looping template ends with the instruction limit (it
/// never returned).
#[test]
fn generate_with_a_looping_template_ends_naming_the_limit() {
    let dir = model_with_template(LOOPING);
    let out = wirl(&["generate", "--model", dir.path().to_str().unwrap(), "--chat", "w3", "--max-tokens", "2"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("instructions"), "{}", stderr(&out));
}

/// Three chat requests rendering a looping template: `/health` answers within a second the
/// whole time, each request gets a 422 naming the limit, and SIGTERM stops the server within
/// a bounded time even while requests are in flight.
#[test]
fn a_server_with_a_looping_template_stays_up_and_stops_on_sigterm() {
    let dir = model_with_template(LOOPING);
    let mut server = Server::start_model(dir.path(), &[]);
    let body = r#"{"messages": [{"role": "user", "content": "w3"}], "max_tokens": 2}"#;
    let chats: Vec<_> = (0..3)
        .map(|_| {
            let address = server.address.clone();
            std::thread::spawn(move || {
                crate::serve::http(&address, "POST", "/v1/chat/completions", &[], body.as_bytes())
            })
        })
        .collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        let asked = Instant::now();
        let (status, _, _) = server.http("GET", "/health", &[], b"");
        assert_eq!(status, 200);
        assert!(asked.elapsed() < Duration::from_secs(1), "/health took {:?}", asked.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    for chat in chats {
        let (status, _, said) = chat.join().unwrap();
        assert_eq!(status, 422, "{said}");
        assert!(said.contains("instructions") || said.contains("refused"), "{said}");
    }
    // Requests in flight when SIGTERM comes: the server still stops, within its drain bound.
    let address = server.address.clone();
    let late =
        std::thread::spawn(move || crate::serve::http(&address, "POST", "/v1/chat/completions", &[], body.as_bytes()));
    std::thread::sleep(Duration::from_millis(100));
    let stopped = Instant::now();
    // SAFETY: kill(2) on a child of this process.
    assert_eq!(unsafe { libc::kill(server.pid() as i32, libc::SIGTERM) }, 0);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(stopped.elapsed() < Duration::from_secs(20), "still running {:?} after SIGTERM", stopped.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let _ = late.join();
}

/// Numbers in config.json that crashed, aborted or silently broke the model: each refused
/// naming its field. A huge claimed context is run within the engine's bound instead.
#[test]
fn hostile_numbers_in_a_config_are_refused_naming_the_field() {
    let cases: [(&str, serde_json::Value); 12] = [
        ("max_position_embeddings", serde_json::json!(1u64 << 62)),
        ("num_hidden_layers", serde_json::json!(1_000_000_000_000u64)),
        ("hidden_size", serde_json::json!(1u64 << 40)),
        ("vocab_size", serde_json::json!(1u64 << 40)),
        ("intermediate_size", serde_json::json!(0)),
        ("rms_norm_eps", serde_json::json!(-1e-5)),
        ("rms_norm_eps", serde_json::json!(0.0)),
        ("rope_theta", serde_json::json!(0.0)),
        ("rope_theta", serde_json::json!(-10000.0)),
        ("rope_scaling", serde_json::json!({"rope_type": "linear", "factor": 0.0})),
        ("num_attention_heads", serde_json::json!(0)),
        ("head_dim", serde_json::json!(1u64 << 20)),
    ];
    for (field, value) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_model(dir.path(), false);
        edit_config(dir.path(), |c| c[field] = value.clone());
        let error = load_error(dir.path());
        assert!(error.contains(field) && error.contains("config.json"), "{field} = {value}: {error}");
    }
    // Sizes that are plausible but not these weights': the tensor and the file are named.
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    edit_config(dir.path(), |c| c["intermediate_size"] = 64.into());
    let error = load_error(dir.path());
    assert!(error.contains("mlp.gate_proj.weight") && error.contains("[48, 32]"), "{error}");
    // Ten million positions claimed: loads, with rope tables of the engine's bound.
    edit_config(dir.path(), |c| {
        c["intermediate_size"] = 48.into();
        c["max_position_embeddings"] = 10_000_000.into();
    });
    let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(loaded.config.context(), wirl_engine::config::MAX_CONTEXT);
    // A Mistral's sliding window bounds its context: past it, full attention would differ.
    edit_config(dir.path(), |c| {
        c["model_type"] = "mistral".into();
        c["sliding_window"] = 16.into();
        c["max_position_embeddings"] = 64.into();
    });
    let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(loaded.config.context(), 16);
    let long = wirl_engine::GenerateRequest { prompt: vec![5; 20], n: 1, sampling: wirl_engine::Sampling::greedy(2) };
    let error = wirl_engine::generate(&loaded.model, &loaded.tokenizer, &[long], |_, _, _| {}).unwrap_err();
    assert!(error.to_string().contains("context"), "{error}");
}

/// Weights that make every logit NaN (a value near f32's largest, finite itself): a
/// generation is an error, never empty text with exit 0; the server answers 5xx.
#[test]
fn non_finite_logits_are_an_error_not_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let path = dir.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let norm = tensors["model.norm.weight"].ones_like().unwrap().affine(3e38, 0.0).unwrap();
    tensors.insert("model.norm.weight".into(), norm);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let out = wirl(&["generate", "--model", dir.path().to_str().unwrap(), "--prompt", "w3 w4", "--max-tokens", "3"]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr(&out).contains("NaN or infinite"), "{}", stderr(&out));
    let server = Server::start_model(dir.path(), &[]);
    let (status, body) = server.post("/v1/completions", r#"{"prompt": "w3 w4", "max_tokens": 3}"#);
    assert!(status >= 500, "{status}: {body}");
    assert!(body.to_string().contains("NaN or infinite"), "{body}");
}

/// Model files that are FIFOs or links to `/dev/zero`, and an index naming files outside
/// the directory: refused at once, naming the file, never read without end or blocking, and
/// never quoting where a name outside the directory leads.
#[test]
fn model_files_are_regular_files_inside_the_model_directory() {
    for file in
        ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"]
    {
        for kind in ["zero", "fifo"] {
            let dir = tempfile::tempdir().unwrap();
            write_tiny_model(dir.path(), false);
            let path = dir.path().join(file);
            let _ = std::fs::remove_file(&path);
            if kind == "zero" {
                std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
            } else {
                let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                // SAFETY: mkfifo(3) on a path in a fresh temporary directory.
                assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
            }
            let (send, receive) = std::sync::mpsc::channel();
            let model = dir.path().to_path_buf();
            std::thread::spawn(move || send.send(load_error(&model)));
            let error = receive
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{file} as a {kind}: loading did not end"));
            assert!(error.contains(file) && error.contains("not a regular file"), "{file} ({kind}): {error}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let outside = tempfile::tempdir().unwrap();
    std::fs::rename(dir.path().join("model.safetensors"), outside.path().join("weights.safetensors")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("weights.safetensors"), dir.path().join("linked.safetensors"))
        .unwrap();
    for name in ["../../../../etc/passwd", "/etc/passwd", "linked.safetensors", ""] {
        let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": name}});
        std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
        let error = load_error(dir.path());
        assert!(error.contains("model.safetensors.index.json") && error.contains("inside"), "{name}: {error}");
        assert!(!error.contains(&outside.path().display().to_string()), "{name}: {error}");
    }
    let index = serde_json::json!({"weight_map": {"model.embed_tokens.weight": "shard.safetensors"}});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let c_path = std::ffi::CString::new(dir.path().join("shard.safetensors").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path in a fresh temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let error = load_error(dir.path());
    assert!(error.contains("shard.safetensors") && error.contains("not a regular file"), "{error}");
}

/// A hand-written GGUF v3 file: `metadata` (key, type, little-endian value bytes) and
/// tensor infos (name, dims, ggml type), no tensor data.
fn gguf(path: &Path, metadata: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32)]) {
    let string = |s: &str| [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat();
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend((tensors.len() as u64).to_le_bytes());
    bytes.extend((metadata.len() as u64).to_le_bytes());
    for (key, kind, value) in metadata {
        bytes.extend(string(key));
        bytes.extend(kind.to_le_bytes());
        bytes.extend(value);
    }
    for (name, dims, kind) in tensors {
        bytes.extend(string(name));
        bytes.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            bytes.extend(d.to_le_bytes());
        }
        bytes.extend(kind.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
    }
    bytes.extend([0u8; 64]);
    std::fs::write(path, bytes).unwrap();
}

/// A GGUF metadata entry: key, value type, the value's little-endian bytes.
type Entry = (String, u32, Vec<u8>);

/// A llama GGUF's metadata (as llama.cpp writes it, SmolLM2-135M's sizes) with `changed`.
fn llama_metadata(changed: &[(&str, u32, Vec<u8>)]) -> Vec<Entry> {
    const U32: u32 = 4;
    const F32: u32 = 6;
    let string = |s: &str| [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat();
    let mut metadata: Vec<Entry> = vec![("general.architecture".into(), 8, string("llama"))];
    for (key, value) in [
        ("context_length", 8192u32),
        ("embedding_length", 576),
        ("block_count", 30),
        ("feed_forward_length", 1536),
        ("attention.head_count", 9),
        ("attention.head_count_kv", 3),
        ("vocab_size", 49152),
    ] {
        metadata.push((format!("llama.{key}"), U32, value.to_le_bytes().to_vec()));
    }
    metadata.push(("llama.attention.layer_norm_rms_epsilon".into(), F32, 1e-5f32.to_le_bytes().to_vec()));
    metadata.push(("llama.rope.freq_base".into(), F32, 1e5f32.to_le_bytes().to_vec()));
    for (key, kind, value) in changed {
        metadata.retain(|(k, _, _)| k != key);
        metadata.push((key.to_string(), *kind, value.clone()));
    }
    metadata
}

/// GGUF files that panicked candle's reader or asked for terabytes: refused by
/// `wirl model inspect` (and so by every load) naming the key or the tensor.
#[test]
fn hostile_gguf_files_are_refused_naming_the_key_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let u64_value = |v: u64| v.to_le_bytes().to_vec();
    type TensorInfo<'a> = (&'a str, &'a [u64], u32);
    let cases: Vec<(Vec<Entry>, Vec<TensorInfo>, &str)> = vec![
        (llama_metadata(&[("general.alignment", 4, 0u32.to_le_bytes().to_vec())]), vec![], "general.alignment"),
        (llama_metadata(&[("llama.block_count", 10, u64_value(1 << 40))]), vec![], "num_hidden_layers"),
        (llama_metadata(&[("llama.context_length", 10, u64_value(1 << 62))]), vec![], "max_position_embeddings"),
        (
            llama_metadata(&[("llama.attention.layer_norm_rms_epsilon", 6, f32::NAN.to_le_bytes().to_vec())]),
            vec![],
            "rms_norm_eps",
        ),
        (llama_metadata(&[("llama.rope.freq_base", 6, 0f32.to_le_bytes().to_vec())]), vec![], "rope_theta"),
        (llama_metadata(&[]), vec![("token_embd.weight", &[1 << 32, 1 << 32, 1 << 16, 1], 0)], "token_embd.weight"),
    ];
    for (i, (metadata, tensors, named)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("case-{i}.gguf"));
        let metadata: Vec<(&str, u32, Vec<u8>)> =
            metadata.iter().map(|(k, t, v)| (k.as_str(), *t, v.clone())).collect();
        gguf(&path, &metadata, &tensors);
        let out = wirl(&["model", "inspect", path.to_str().unwrap()]);
        let said = stderr(&out);
        assert!(
            !out.status.success() && said.contains(named) && said.contains(&format!("case-{i}.gguf")),
            "{named}: {said}"
        );
        assert!(!said.contains("panicked"), "{said}");
    }
}

/// A GGUF tokenizer whose token kinds list is shorter than its tokens: refused, not chat
/// markers silently read as plain text.
#[test]
fn a_gguf_token_type_list_shorter_than_its_tokens_is_refused() {
    use candle_core::quantized::gguf_file::Value;
    let mut metadata = std::collections::HashMap::new();
    metadata.insert("tokenizer.ggml.model".to_string(), Value::String("gpt2".into()));
    let tokens = ["a", "b", "<|im_start|>", "<|im_end|>"];
    metadata.insert(
        "tokenizer.ggml.tokens".to_string(),
        Value::Array(tokens.iter().map(|t| Value::String(t.to_string())).collect()),
    );
    metadata.insert("tokenizer.ggml.merges".to_string(), Value::Array(vec![]));
    metadata.insert("tokenizer.ggml.token_type".to_string(), Value::Array(vec![Value::I32(1), Value::I32(1)]));
    let error = wirl_engine::Tokenizer::from_gguf(&metadata, "model.gguf").err().unwrap().to_string();
    assert!(error.contains("token_type") && error.contains("2 entries for 4 tokens"), "{error}");
}

/// A split pattern that backtracks past the regex engine's limit on some text: that text is
/// an error to tokenize, not a panic of the process.
#[test]
fn a_tokenizer_pattern_that_backtracks_without_end_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_tokenizer(dir.path());
    let path = dir.path().join("tokenizer.json");
    let mut tokenizer: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    tokenizer["pre_tokenizer"] =
        serde_json::json!({"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": false});
    let tokenizer = wirl_engine::Tokenizer::from_json(tokenizer.to_string(), None, "tokenizer.json").unwrap();
    let hostile = format!("{}b", "a".repeat(40));
    let error = tokenizer.encode(&hostile).unwrap_err().to_string();
    assert!(error.contains("tokenizing") && error.contains("retry-limit"), "{error}");
    assert!(tokenizer.encode("w3 w4").is_ok(), "ordinary text still tokenizes");
}

/// `wirl model merge` of finite adapters whose product overflows f32: refused, nothing
/// written (it wrote 106 M infinities and exited 0).
#[test]
fn a_merge_that_overflows_is_refused_and_writes_nothing() {
    let (model, _) = crate::families::tiny("qwen3");
    let adapter = tempfile::tempdir().unwrap();
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny-qwen3-lora"));
    std::fs::copy(fixture.join("adapter_config.json"), adapter.path().join("adapter_config.json")).unwrap();
    let tensors = candle_core::safetensors::load(fixture.join("adapter_model.safetensors"), &candle_core::Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(name, t)| (name, t.ones_like().unwrap().affine(1e30, 0.0).unwrap()))
        .collect::<std::collections::HashMap<_, _>>();
    candle_core::safetensors::save(&tensors, adapter.path().join("adapter_model.safetensors")).unwrap();
    let merged = adapter.path().join("merged");
    let merge = || {
        let paths = [model.path(), adapter.path(), &merged].map(|p| p.to_str().unwrap().to_string());
        wirl(&["model", "merge", &paths[0], &paths[1], &paths[2]])
    };
    let out = merge();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NaN or infinite"), "{}", stderr(&out));
    assert!(!merged.exists());
    // An adapter holding NaN is refused as it is read.
    let nan: std::collections::HashMap<_, _> =
        tensors.into_iter().map(|(name, t)| (name, t.affine(0.0, f64::NAN).unwrap())).collect();
    candle_core::safetensors::save(&nan, adapter.path().join("adapter_model.safetensors")).unwrap();
    let out = merge();
    assert!(stderr(&out).contains("NaN or infinite") && !merged.exists(), "{}", stderr(&out));
    // An adapter's config that is a link to /dev/zero: refused, not read without end.
    std::fs::remove_file(adapter.path().join("adapter_config.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", adapter.path().join("adapter_config.json")).unwrap();
    let out = merge();
    assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
}

/// An agent's `generate` call bounded within the call, before anything is tokenized: too
/// many conversations, an empty one, an unknown role, a message too long for the context,
/// an empty stop string and `max_tokens` 0 are refused by name.
#[test]
fn an_agents_generate_call_is_bounded_before_tokenizing() {
    use wirl_sandbox::{InferenceHost, Message, Sampling};
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let (_, engine, tokenizer) = crate::multiturn::policy_and_engine(dir.path());
    let host = wirl_rollout::EngineInference::new(
        engine,
        tokenizer,
        64,
        wirl_rollout::SamplingSpec { max_tokens: 4, temperature: 1.0, top_p: 1.0, top_k: 0 },
        1,
        wirl_rollout::AgentLimits { generate_calls: 100, tokens: 1000 },
    );
    let sampling =
        Sampling { max_tokens: 4, temperature: 1.0, top_p: 1.0, top_k: 0, min_p: 0.0, stop: vec![], seed: None };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let call = |conversations: Vec<Vec<Message>>, sampling: Sampling| {
        runtime.block_on(host.generate(conversations, sampling)).err().unwrap_or_default()
    };
    let say = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
    let error = call(vec![vec![say("user", "w3")]; 1000], sampling.clone());
    assert!(error.contains("1000 conversations") && error.contains("at most 64"), "{error}");
    let error = call(vec![vec![]], sampling.clone());
    assert!(error.contains("empty"), "{error}");
    let error = call(vec![vec![say("root\u{1b}[2J", "w3")]], sampling.clone());
    assert!(error.contains("role") && !error.contains('\u{1b}'), "{error}");
    let error = call(vec![vec![say("user", &"w3 ".repeat(7_000_000))]], sampling.clone());
    assert!(error.contains("bytes of text") && error.contains("context"), "{error}");
    let error = call(vec![vec![say("user", "w3")]], Sampling { stop: vec![String::new()], ..sampling.clone() });
    assert!(error.contains("stop"), "{error}");
    let error = call(vec![vec![say("user", "w3")]], Sampling { max_tokens: 0, ..sampling.clone() });
    assert!(error.contains("max_tokens"), "{error}");
    // The tokens a call may make are the rollouts' remaining share: 64 conversations of a
    // budget of 1,000 get at most 15 tokens each, and an ordinary call still works.
    assert_eq!(call(vec![vec![say("user", "w3")]; 2], sampling.clone()), "");
}

/// Settings the machine or the model refuse, refused before any model loads: tensor-
/// parallel ranks the heads do not divide, a prefix cache past its bound, data-parallel
/// copies that cannot fit in memory.
#[test]
fn rank_and_cache_settings_are_refused_before_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let model = dir.path().to_str().unwrap();
    let out = wirl(&["serve", "--model", model, "--port", "0", "--tp", "64"]);
    assert!(stderr(&out).contains("--tp 64") && stderr(&out).contains("num_attention_heads"), "{}", stderr(&out));
    let out = wirl(&["generate", "--model", model, "--tp", "3", "--prompt", "w3"]);
    assert!(stderr(&out).contains("--tp 3") && stderr(&out).contains("does not split"), "{}", stderr(&out));
    let out = wirl(&["serve", "--model", model, "--port", "0", "--prefix-cache-mib", "100000000000"]);
    assert!(stderr(&out).contains("--prefix-cache-mib"), "{}", stderr(&out));
    // A config claiming ~3 × 10^12 parameters: two copies cannot fit anywhere this runs.
    let big = tempfile::tempdir().unwrap();
    write_tiny_model(big.path(), false);
    edit_config(big.path(), |c| {
        c["hidden_size"] = 16384.into();
        c["intermediate_size"] = 65536.into();
        c["num_hidden_layers"] = 1000.into();
        c["num_attention_heads"] = 128.into();
        c["num_key_value_heads"] = 8.into();
    });
    // Refused by the config's size alone: its weights (the tiny model's) were never read
    // against it, which loading would have refused as the wrong shapes.
    let out = wirl(&["train", "--model", big.path().to_str().unwrap(), "--dp", "2", "--steps", "1"]);
    assert!(stderr(&out).contains("--dp 2") && stderr(&out).contains("available"), "{}", stderr(&out));
}

/// `wirl args`, killed (and the test failed) if it has not ended within `limit`: a config
/// read that blocks must fail the test, not hang the suite.
fn wirl_within(args: &[&str], limit: Duration) -> std::process::Output {
    let piped = std::process::Stdio::piped;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(args)
        .stdout(piped())
        .stderr(piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("wirl {args:?} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A training config, a task set or a `wirl serve` config that is a FIFO, a link to
/// `/dev/zero`, a directory, megabytes long or not UTF-8: refused at once naming the file
/// and what it is, never a start that blocks or reads without end.
#[test]
fn configs_a_user_names_are_bounded_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path in a fresh temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let zero = dir.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let folder = dir.path().join("folder.toml");
    std::fs::create_dir(&folder).unwrap();
    let huge = dir.path().join("huge.toml");
    std::fs::write(&huge, format!("# {}\n", "x".repeat(5 << 20))).unwrap();
    let binary = dir.path().join("binary.toml");
    std::fs::write(&binary, b"[model]\npath = \"\xff\xfe\"\n").unwrap();
    let over = format!("over {} bytes", wirl_trainer::config::MAX_CONFIG_BYTES);
    let cases = [
        (&fifo, "not a regular file"),
        (&zero, "not a regular file"),
        (&folder, "a directory"),
        (&huge, over.as_str()),
        (&binary, "not UTF-8"),
    ];
    let run = dir.path().join("run").display().to_string();
    for (path, expected) in cases {
        let file = path.display().to_string();
        for args in [vec!["train", file.as_str(), "--run-dir", run.as_str()], vec!["serve", "--config", file.as_str()]]
        {
            let out = wirl_within(&args, Duration::from_secs(60));
            let error = stderr(&out);
            assert!(!out.status.success() && error.contains(&file) && error.contains(expected), "{args:?}: {error}");
        }
        let error = wirl_engine::error_chain(&wirl_trainer::TrainConfig::read_task_set(path).unwrap_err());
        assert!(error.contains(&file) && error.contains(expected), "task set {file}: {error}");
    }
    assert!(!Path::new(&run).exists(), "a refused config left a run directory");
}

/// An adapter whose weights file is a 20 GB sparse file with a bogus header, or a header that
/// declares a tensor no LoRA has: refused by its header, in moments, without reading it.
#[test]
fn an_adapters_header_is_checked_before_its_data_is_read() {
    let (model, _) = crate::families::tiny("qwen3");
    let adapter = tempfile::tempdir().unwrap();
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny-qwen3-lora"));
    std::fs::copy(fixture.join("adapter_config.json"), adapter.path().join("adapter_config.json")).unwrap();
    let weights = adapter.path().join("adapter_model.safetensors");
    let merged = adapter.path().join("merged");
    let merge = || {
        let paths = [model.path(), adapter.path(), &merged].map(|p| p.to_str().unwrap().to_string());
        wirl(&["model", "merge", &paths[0], &paths[1], &paths[2]])
    };
    let sparse = std::fs::File::create(&weights).unwrap();
    sparse.set_len(20 << 30).unwrap();
    drop(sparse);
    let started = std::time::Instant::now();
    let out = merge();
    assert!(!out.status.success() && stderr(&out).contains("not valid safetensors"), "{}", stderr(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    // A valid header declaring one 3-D tensor of 16 GB: refused by its shape.
    let header = r#"{"base_model.model.x.lora_A.weight":{"dtype":"F32","shape":[1024,1024,4096],"data_offsets":[0,17179869184]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(&weights, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&weights).unwrap();
    file.set_len(bytes.len() as u64 + (16 << 30)).unwrap();
    drop(file);
    let out = merge();
    assert!(!out.status.success() && stderr(&out).contains("a LoRA matrix of rank"), "{}", stderr(&out));
    assert!(!merged.exists());
}

/// `wirl eval --samples` past any pass@k, or past what a usize product holds: refused by key,
/// not a panic (it was a multiply overflow) or 6 GB of memory.
#[test]
fn eval_samples_and_tasks_are_bounded_by_key() {
    for (flag, value, says) in [
        ("--samples", "18446744073709551615", "`eval.samples` = 18446744073709551615: at most 1024"),
        ("--samples", "100000000", "`eval.samples` = 100000000: at most 1024"),
        ("--tasks", "100000000", "`eval.tasks` = 100000000: at most 1048576"),
    ] {
        let out = wirl(&["eval", flag, value]);
        // Refused as a usage error (2), not a panic (101).
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{flag} {value}: {}", stderr(&out));
    }
}
