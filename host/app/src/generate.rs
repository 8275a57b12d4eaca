//! `wirl generate`: a model (or its tensor-parallel shards) loaded and sampled from once;
//! the text streamed to the caller as it is decoded, the completions returned.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use wirl_engine::{ChatMessage, Completion, GenerateRequest, LoadOptions, Sampling};

/// What is generated from.
pub enum Prompt {
    /// Text tokenized as is.
    Raw(String),
    /// A user message (and a system message) rendered with the model's chat template, with
    /// the template's variables.
    Chat { system: Option<String>, user: String, vars: wirl_engine::TemplateVars },
}

/// One generation.
pub struct GenerateLaunch {
    /// A GGUF file, an HF model directory or the default model's name (None: the default).
    pub model: Option<String>,
    /// A LoRA adapter merged into the weights as they load.
    pub adapter: Option<PathBuf>,
    pub prompt: Prompt,
    /// Samples of the prompt (they share one prefill).
    pub samples: usize,
    pub sampling: Sampling,
    /// Run a GGUF model's quantized weights.
    pub quantized: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    pub dtype: Option<crate::models::WeightsDtype>,
    /// Tensor-parallel ranks (threads of this process).
    pub tp: usize,
    /// Draw each step's tokens where the logits are.
    pub device_sampling: bool,
}

/// What came of it.
pub struct Generated {
    pub prompt_tokens: usize,
    pub completions: Vec<Completion>,
    /// The generation's time (the load's not included).
    pub elapsed: Duration,
}

/// Load and generate; `on_text` gets each piece of text as it is decoded (rank 0's).
pub fn generate(mut launch: GenerateLaunch, on_text: &(dyn Fn(&str) + Sync)) -> anyhow::Result<Generated> {
    let path = crate::models::resolve(launch.model.as_deref())?;
    let started = Instant::now();
    let options = LoadOptions {
        quantized: launch.quantized,
        device: crate::device::parse_device(&launch.device)?,
        adapter: launch.adapter.clone(),
        ..Default::default()
    };
    let options = crate::models::WeightsDtype::apply(launch.dtype, options);
    let tp = launch.tp;
    if tp == 1 {
        let loaded = wirl_engine::load(&path, &options)?;
        crate::notices::notice(&format!("loaded {} in {:.2?}", path.display(), started.elapsed()));
        return generate_on(&launch, &loaded, on_text);
    }
    // Every rank samples the same tokens from the same (gathered) logits only with one seed.
    launch.sampling.seed = Some(launch.sampling.seed.unwrap_or_else(rand::random));
    let device = wirl_trainer::config::DeviceSpec::parse(&launch.device).unwrap_or_default();
    crate::ranks::check_split(&path, tp, "--tp")?;
    let comms = crate::ranks::threads(tp, device)?;
    let launch = &launch;
    std::thread::scope(|scope| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                // CUDA ranks load on their own GPUs.
                let device = comm.device().unwrap_or_else(|| options.device.clone());
                let options = LoadOptions { comm, device, ..options.clone() };
                let path = &path;
                scope.spawn(move || -> anyhow::Result<Generated> {
                    let rank0 = options.comm.rank() == 0;
                    let loaded = wirl_engine::load(path, &options)?;
                    if rank0 {
                        let took = started.elapsed();
                        crate::notices::notice(&format!(
                            "loaded {} on {tp} tensor-parallel ranks in {took:.2?}",
                            path.display()
                        ));
                    }
                    generate_on(launch, &loaded, if rank0 { on_text } else { &|_| {} })
                })
            })
            .collect();
        let mut results: Vec<anyhow::Result<Generated>> = ranks
            .into_iter()
            .map(|rank| rank.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect();
        // A rank's own error says more than the others' "rank k left the group".
        let first_error =
            results.iter().position(|r| r.as_ref().is_err_and(|e| !format!("{e:#}").contains("left the group")));
        results.swap_remove(first_error.unwrap_or(0))
    })
}

/// Generate from `loaded` as `launch` says.
fn generate_on(
    launch: &GenerateLaunch,
    loaded: &wirl_engine::LoadedModel,
    on_text: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<Generated> {
    let text = match &launch.prompt {
        Prompt::Raw(prompt) => prompt.clone(),
        Prompt::Chat { system, user, vars } => {
            let mut messages = Vec::new();
            if let Some(system) = system {
                messages.push(ChatMessage { role: "system".into(), content: system.clone() });
            }
            messages.push(ChatMessage { role: "user".into(), content: user.clone() });
            loaded.tokenizer.render_chat_with(&messages, true, vars)?
        }
    };
    let prompt = loaded.tokenizer.encode(&text)?;
    let request = GenerateRequest { prompt: prompt.clone(), n: launch.samples, sampling: launch.sampling.clone() };
    let started = Instant::now();
    let mut results = wirl_engine::generate_with(
        &loaded.model,
        &loaded.tokenizer,
        &[request],
        launch.device_sampling,
        |_, _, piece| on_text(piece),
    )?;
    let completions = results.swap_remove(0);
    Ok(Generated { prompt_tokens: prompt.len(), completions, elapsed: started.elapsed() })
}
