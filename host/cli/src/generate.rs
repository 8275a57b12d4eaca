//! `wirl generate`: sample from a model, streaming the text, and report tokens/s.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;
use wirl_engine::{ChatMessage, GenerateRequest, LoadOptions, Sampling};

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, an HF model directory, or the default model's name (the default).
    #[arg(long)]
    model: Option<String>,
    /// A LoRA adapter directory (PEFT's format; a LoRA run's `checkpoints/step-N/adapter`)
    /// merged into the model's weights as they load.
    #[arg(long, value_name = "DIR")]
    adapter: Option<std::path::PathBuf>,
    /// Raw prompt text, tokenized as is.
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// A variable for the chat template, NAME=VALUE (VALUE as JSON, else a string; repeatable):
    /// `--template-var enable_thinking=false` turns Qwen3's reasoning off.
    #[arg(long, requires = "chat", value_name = "NAME=VALUE", value_parser = template_var)]
    template_var: Vec<(String, serde_json::Value)>,
    /// Number of samples of the prompt (they share one prefill).
    #[arg(short = 'n', default_value_t = 1)]
    samples: usize,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 for greedy.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Keep generating past end-of-sequence tokens (up to --max-tokens).
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when the text contains this (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Run a GGUF model's quantized weights instead of dequantizing them to f32 (faster; on
    /// the CPU, Q4_1 is computed as llama.cpp computes it, 8-bit activations included, so
    /// answers follow llama.cpp's rather than the f32 path's).
    #[arg(long)]
    quantized: bool,
    /// `cpu`, or `cuda` / `cuda:N` (a build made by scripts/build-cuda).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The weights' dtype [default: f32 on the CPU, bf16 on CUDA]. bf16 on the CPU keeps the
    /// linear layers' matrices in half the bytes and computes in f32 (decoding is faster:
    /// it streams the weights); on CUDA it runs bf16 throughout.
    #[arg(long, value_enum)]
    dtype: Option<WeightsDtype>,
    /// Tensor-parallel ranks (threads of this process): each holds 1/N of every layer's heads
    /// and MLP and of the vocabulary, and they sum their partial products (1: one model).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    tp: u16,
    /// Draw each step's tokens where the logits are (on a GPU: only a token and a log-prob
    /// per row come back to the host); without top-k, top-p or min-p cuts. Being measured
    /// (issue 45): off by default.
    #[arg(long)]
    device_sampling: bool,
}

/// `--template-var NAME=VALUE`: VALUE read as JSON (`false`, `3`, `["a"]`), else as a string.
fn template_var(text: &str) -> Result<(String, serde_json::Value), String> {
    let (name, value) = text.split_once('=').ok_or("expected NAME=VALUE, for example enable_thinking=false")?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_string()));
    let vars = wirl_engine::TemplateVars::from([(name.to_string(), value.clone())]);
    wirl_engine::check_template_vars(&vars)?;
    Ok((name.to_string(), value))
}

/// `--dtype` of the commands that load a model for inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsDtype {
    F32,
    Bf16,
}

impl WeightsDtype {
    /// `options` with their weights in this dtype (`LoadOptions::weights_in`).
    pub fn apply(dtype: Option<WeightsDtype>, options: LoadOptions) -> LoadOptions {
        match dtype {
            None => options,
            Some(WeightsDtype::F32) => options.weights_in(wirl_engine::DType::F32),
            Some(WeightsDtype::Bf16) => options.weights_in(wirl_engine::DType::BF16),
        }
    }
}

pub fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    let path = crate::model::resolve(args.model.as_deref())?;
    let started = Instant::now();
    let options = LoadOptions {
        quantized: args.quantized,
        device: crate::device::parse_device(&args.device)?,
        adapter: args.adapter.clone(),
        ..Default::default()
    };
    let options = WeightsDtype::apply(args.dtype, options);
    let tp = usize::from(args.tp);
    if tp == 1 {
        let loaded = wirl_engine::load(&path, &options)?;
        eprintln!("loaded {} in {:.2?}", path.display(), started.elapsed());
        return generate(&args, &loaded, true);
    }
    // Every rank samples the same tokens from the same (gathered) logits only with one seed.
    args.seed = Some(args.seed.unwrap_or_else(rand::random));
    let device = wirl_trainer::config::DeviceSpec::parse(&args.device).unwrap_or_default();
    crate::ranks::check_split(&path, tp, "--tp")?;
    let comms = crate::ranks::threads(tp, device)?;
    std::thread::scope(|scope| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                // CUDA ranks load on their own GPUs.
                let device = comm.device().unwrap_or_else(|| options.device.clone());
                let options = LoadOptions { comm, device, ..options.clone() };
                let (path, args) = (&path, &args);
                scope.spawn(move || -> anyhow::Result<ExitCode> {
                    let rank0 = options.comm.rank() == 0;
                    let loaded = wirl_engine::load(path, &options)?;
                    if rank0 {
                        eprintln!(
                            "loaded {} on {tp} tensor-parallel ranks in {:.2?}",
                            path.display(),
                            started.elapsed()
                        );
                    }
                    generate(args, &loaded, rank0)
                })
            })
            .collect();
        let mut results: Vec<anyhow::Result<ExitCode>> = ranks
            .into_iter()
            .map(|rank| rank.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect();
        // A rank's own error says more than the others' "rank k left the group".
        let first_error =
            results.iter().position(|r| r.as_ref().is_err_and(|e| !format!("{e:#}").contains("left the group")));
        results.swap_remove(first_error.unwrap_or(0))
    })
}

/// Generate from `loaded` as `args` say; `speaks`: this rank prints (rank 0, or alone).
fn generate(args: &Args, loaded: &wirl_engine::LoadedModel, speaks: bool) -> anyhow::Result<ExitCode> {
    let text = match (&args.prompt, &args.chat) {
        (Some(prompt), _) => prompt.clone(),
        (None, Some(chat)) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.system {
                messages.push(ChatMessage { role: "system".into(), content: system.clone() });
            }
            messages.push(ChatMessage { role: "user".into(), content: chat.clone() });
            let vars: wirl_engine::TemplateVars = args.template_var.iter().cloned().collect();
            loaded.tokenizer.render_chat_with(&messages, true, &vars)?
        }
        (None, None) => unreachable!("clap requires --prompt or --chat"),
    };
    let prompt = loaded.tokenizer.encode(&text)?;
    let sampling = Sampling {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        stop: args.stop.clone(),
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        top_logprobs: 0,
    };
    let request = GenerateRequest { prompt: prompt.clone(), n: args.samples, sampling };
    let started = Instant::now();
    let stream = args.samples == 1;
    let results = wirl_engine::generate_with(
        &loaded.model,
        &loaded.tokenizer,
        &[request],
        args.device_sampling,
        |_, _, piece| {
            if stream && speaks {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
        },
    )?;
    let elapsed = started.elapsed();
    if !speaks {
        return Ok(ExitCode::SUCCESS);
    }
    let completions = &results[0];
    if stream {
        println!();
    } else {
        for (i, completion) in completions.iter().enumerate() {
            println!(
                "--- sample {i} ({:?}, {} tokens)\n{}",
                completion.finish,
                completion.tokens.len(),
                completion.text
            );
        }
    }
    let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
    eprintln!(
        "{} prompt tokens, {generated} generated in {elapsed:.2?}: {:.1} tokens/s",
        prompt.len(),
        generated as f64 / elapsed.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
