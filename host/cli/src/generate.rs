//! `wirl generate`: sample from a model (`wirl_app::generate`), streaming the text, and
//! report tokens/s.

use std::io::Write;
use std::process::ExitCode;
use wirl_app::generate::{GenerateLaunch, Prompt};
use wirl_app::models::WeightsDtype;
use wirl_engine::Sampling;

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

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let prompt = match (args.prompt, args.chat) {
        (Some(prompt), _) => Prompt::Raw(prompt),
        (None, Some(user)) => Prompt::Chat { system: args.system, user, vars: args.template_var.into_iter().collect() },
        (None, None) => unreachable!("clap requires --prompt or --chat"),
    };
    let sampling = Sampling {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        stop: args.stop,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        top_logprobs: 0,
    };
    // One sample is streamed as it is decoded; several are printed whole.
    let stream = args.samples == 1;
    let launch = GenerateLaunch {
        model: args.model,
        adapter: args.adapter,
        prompt,
        samples: args.samples,
        sampling,
        quantized: args.quantized,
        device: args.device,
        dtype: args.dtype,
        tp: usize::from(args.tp),
        device_sampling: args.device_sampling,
    };
    let generated = wirl_app::generate::generate(launch, &|piece| {
        if stream {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        }
    })?;
    if stream {
        println!();
    } else {
        for (i, completion) in generated.completions.iter().enumerate() {
            println!(
                "--- sample {i} ({:?}, {} tokens)\n{}",
                completion.finish,
                completion.tokens.len(),
                completion.text
            );
        }
    }
    let tokens: usize = generated.completions.iter().map(|c| c.tokens.len()).sum();
    say!(
        "{} prompt tokens, {tokens} generated in {:.2?}: {:.1} tokens/s",
        generated.prompt_tokens,
        generated.elapsed,
        tokens as f64 / generated.elapsed.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
