//! Engine throughput on the default model, in the shapes the peer benchmarks measure
//! (../shared/peers/decode_llamacpp.py and decode_hf.py): batch-1 decode after a 64-token
//! prefill, quantized (Q4_1, `QMatMul`) and f32; a group of 8 samples × 128 tokens from one
//! prompt; prefill of 64 tokens. Prints one JSON object; `benches/engine.sh` runs it beside
//! the peers and prints ratios.
//!
//! `cargo bench -p wirl-engine --bench engine -- MODEL.gguf [REPS] [q4_1|f32|group]`
//! (`group`: only the f32 group of 8, for profiling the decoding matmul)

use candle_core::{Device, Tensor};
use std::time::Instant;
use wirl_engine::{GenerateRequest, LoadOptions, Sampling};

/// The peers' fixed English prompt (`_common.py`), cut to 64 tokens as they do.
const PROMPT_TEXT: &str = "The old lighthouse keeper climbed the spiral stairs every evening at dusk, \
counting each of the one hundred and twelve steps as his father had taught him. \
At the top he trimmed the wick, polished the great lens until it gleamed, and \
wrote the weather in a leather notebook. One stormy night in late November, \
while the wind screamed against the glass, he noticed a small boat drifting \
toward the rocks with no lights at all. He grabbed his lantern and";
const PROMPT_TOKENS: usize = 64;
const NEW_TOKENS: usize = 128;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// Peak resident memory of this process so far (VmHWM), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Prefill seconds and decode tokens/s of a greedy batch-1 loop (end-of-sequence ignored).
fn greedy_decode(model: &wirl_engine::Model, prompt: &[u32]) -> (f64, f64) {
    let mut cache = model.new_cache();
    let started = Instant::now();
    let tokens = Tensor::from_vec(prompt.to_vec(), (1, prompt.len()), &Device::Cpu).unwrap();
    let mut logits = model.forward(&tokens, &[0], &mut cache, false).unwrap();
    let prefill = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..NEW_TOKENS {
        let next = logits.argmax(1).unwrap().to_dtype(candle_core::DType::U32).unwrap();
        logits = model.forward(&next.unsqueeze(1).unwrap(), &[0], &mut cache, false).unwrap();
    }
    (prefill, NEW_TOKENS as f64 / started.elapsed().as_secs_f64())
}

/// Aggregate tokens/s of `generate` for `n` samples × 128 tokens at temperature 1, wall time
/// including the prefill (as transformers' `generate` is timed).
fn sample(m: &wirl_engine::LoadedModel, prompt: &[u32], n: usize, seed: u64) -> f64 {
    let sampling = Sampling { max_tokens: NEW_TOKENS, seed: Some(seed), ignore_eos: true, ..Default::default() };
    let request = GenerateRequest { prompt: prompt.to_vec(), n, sampling };
    let started = Instant::now();
    let out = wirl_engine::generate(&m.model, &m.tokenizer, &[request], |_, _, _| {}).unwrap();
    let tokens: usize = out[0].iter().map(|c| c.tokens.len()).sum();
    assert_eq!(tokens, n * NEW_TOKENS);
    tokens as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    wirl_engine::pin_thread_count();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let path = args.first().expect("usage: engine MODEL.gguf [REPS]");
    let reps: usize = args.get(1).map_or(5, |r| r.parse().expect("REPS is a number"));
    let mut result = serde_json::Map::new();

    let only = args.get(2).map(String::as_str);
    let group_only = only == Some("group");
    for quantized in [true, false] {
        let label = if quantized { "q4_1" } else { "f32" };
        if only.is_some_and(|o| o != label && !(group_only && label == "f32")) {
            continue;
        }
        let started = Instant::now();
        let m =
            wirl_engine::load(std::path::Path::new(path), &LoadOptions { quantized, ..Default::default() }).unwrap();
        let load_s = started.elapsed().as_secs_f64();
        let mut prompt = m.tokenizer.encode(PROMPT_TEXT).unwrap();
        assert!(prompt.len() >= PROMPT_TOKENS, "the prompt has {} tokens", prompt.len());
        prompt.truncate(PROMPT_TOKENS);
        if group_only {
            let runs: Vec<f64> = (0..reps).map(|r| sample(&m, &prompt, 8, r as u64)).collect();
            eprintln!("f32: group 8x128 {runs:.1?} tok/s aggregate");
            result.insert("f32_group8_tok_s".into(), median(runs).into());
            break;
        }
        greedy_decode(&m.model, &prompt[..8]); // warm-up
        let runs: Vec<(f64, f64)> = (0..reps).map(|_| greedy_decode(&m.model, &prompt)).collect();
        let prefill_ms = median(runs.iter().map(|r| r.0 * 1e3).collect());
        let decode = median(runs.iter().map(|r| r.1).collect());
        eprintln!("{label}: load {load_s:.2} s, prefill 64 {prefill_ms:.0} ms, bs1 greedy decode {decode:.1} tok/s");
        result.insert(format!("{label}_load_s"), load_s.into());
        result.insert(format!("{label}_prefill64_ms"), prefill_ms.into());
        result.insert(format!("{label}_bs1_decode_tok_s"), decode.into());
        if !quantized {
            let bs1 = median((0..reps).map(|r| sample(&m, &prompt, 1, r as u64)).collect());
            let group = median((0..reps.min(3)).map(|r| sample(&m, &prompt, 8, r as u64)).collect());
            eprintln!("{label}: bs1 sample {bs1:.1} tok/s (prefill included), group 8x128 {group:.1} tok/s aggregate");
            result.insert(format!("{label}_bs1_sample_tok_s"), bs1.into());
            result.insert(format!("{label}_group8_tok_s"), group.into());
        }
        result.insert(format!("peak_rss_after_{label}_mib"), peak_rss_mib().into());
    }
    result.insert("reps".into(), reps.into());
    result.insert("threads".into(), candle_core::utils::get_num_threads().into());
    println!("{}", serde_json::Value::Object(result));
}
