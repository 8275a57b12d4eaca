//! Engine throughput on the default model, in the shapes the peer benchmarks measure
//! (../shared/peers/decode_llamacpp.py and decode_hf.py): batch-1 decode after a 64-token
//! prefill, quantized (Q4_1, `QMatMul`), f32, bf16 matrices with f32 arithmetic (`bf16w`) and
//! bf16 throughout; a group of 8 samples × 128 tokens from one prompt; prefill of 64 tokens.
//! For all but f32, the log-prob mismatch
//! against f32: f32's greedy continuation teacher-forced through each, the largest and the
//! mean |Δ log p| of its tokens. Prints one JSON object; `benches/engine.sh` runs it beside
//! the peers and prints ratios.
//!
//! `cargo bench -p wirl-engine --bench engine -- MODEL.gguf [REPS] [q4_1|f32|bf16w|bf16|group]`
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

/// Each token's log-probability (under the model, teacher-forced) of `continuation` after
/// `prompt`, in one forward pass.
fn token_logprobs(model: &wirl_engine::Model, prompt: &[u32], continuation: &[u32]) -> Vec<f32> {
    let ids: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
    let tokens = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
    let logits = model.forward(&tokens, &[0], &mut model.new_cache(), true).unwrap();
    let logits = logits.squeeze(0).unwrap().to_dtype(candle_core::DType::F32).unwrap();
    let logp = candle_nn::ops::log_softmax(&logits, 1).unwrap().to_vec2::<f32>().unwrap();
    continuation.iter().enumerate().map(|(t, &token)| logp[prompt.len() + t - 1][token as usize]).collect()
}

/// f32's greedy continuation of `prompt`: `NEW_TOKENS` ids.
fn greedy_ids(model: &wirl_engine::Model, prompt: &[u32]) -> Vec<u32> {
    let mut cache = model.new_cache();
    let tokens = Tensor::from_vec(prompt.to_vec(), (1, prompt.len()), &Device::Cpu).unwrap();
    let mut logits = model.forward(&tokens, &[0], &mut cache, false).unwrap();
    let mut ids = Vec::new();
    for _ in 0..NEW_TOKENS {
        let next = logits.argmax(1).unwrap().to_dtype(candle_core::DType::U32).unwrap();
        ids.push(next.to_vec1::<u32>().unwrap()[0]);
        logits = model.forward(&next.unsqueeze(1).unwrap(), &[0], &mut cache, false).unwrap();
    }
    ids
}

/// `model`'s log-probs of f32's greedy continuation against f32's own: the largest and the
/// mean |Δ log p|, into `result` and on stderr.
fn mismatch(
    label: &str,
    model: &wirl_engine::Model,
    (prompt, continuation, f32_logprobs): &(Vec<u32>, Vec<u32>, Vec<f32>),
    result: &mut serde_json::Map<String, serde_json::Value>,
) {
    let ours = token_logprobs(model, prompt, continuation);
    let deltas: Vec<f32> = ours.iter().zip(f32_logprobs).map(|(a, b)| (a - b).abs()).collect();
    let max = deltas.iter().copied().fold(0f32, f32::max);
    let mean = deltas.iter().sum::<f32>() / deltas.len() as f32;
    eprintln!("{label}: |Δ log p| against f32 over its greedy {NEW_TOKENS} tokens: max {max:.4}, mean {mean:.5}");
    result.insert(format!("{label}_logprob_delta_max"), f64::from(max).into());
    result.insert(format!("{label}_logprob_delta_mean"), f64::from(mean).into());
}

fn main() {
    wirl_engine::pin_thread_count();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let path = args.first().expect("usage: engine MODEL.gguf [REPS]");
    let reps: usize = args.get(1).map_or(5, |r| r.parse().expect("REPS is a number"));
    let mut result = serde_json::Map::new();

    let only = args.get(2).map(String::as_str);
    let group_only = only == Some("group");
    let wanted = |label: &str| only.is_none_or(|o| o == label || (o == "group" && label == "f32"));
    // Q4_1 is held to f32's greedy continuation once f32 has run (kept until then).
    let mut quantized_model: Option<wirl_engine::LoadedModel> = None;
    let mut reference: Option<(Vec<u32>, Vec<u32>, Vec<f32>)> = None;
    for label in ["q4_1", "f32", "bf16w", "bf16"] {
        // f32 runs also when only another is asked for: its continuation is the reference.
        let reference_only = !wanted(label) && label == "f32" && !group_only;
        if !wanted(label) && !reference_only {
            continue;
        }
        let quantized = label == "q4_1";
        let dtype = (label == "bf16").then_some(candle_core::DType::BF16);
        let matrix_dtype = (label == "bf16w").then_some(candle_core::DType::BF16);
        let started = Instant::now();
        let options = LoadOptions { quantized, dtype, matrix_dtype, ..Default::default() };
        let m = wirl_engine::load(std::path::Path::new(path), &options).unwrap();
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
        if label == "f32" {
            let continuation = greedy_ids(&m.model, &prompt);
            let logprobs = token_logprobs(&m.model, &prompt, &continuation);
            reference = Some((prompt.clone(), continuation, logprobs));
            if let Some(q) = quantized_model.take() {
                mismatch("q4_1", &q.model, reference.as_ref().unwrap(), &mut result);
            }
            if reference_only {
                continue;
            }
        } else if label.starts_with("bf16") {
            mismatch(label, &m.model, reference.as_ref().expect("f32 runs first"), &mut result);
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
        if quantized {
            quantized_model = Some(m);
        }
    }
    result.insert("reps".into(), reps.into());
    result.insert("threads".into(), candle_core::utils::get_num_threads().into());
    println!("{}", serde_json::Value::Object(result));
}
