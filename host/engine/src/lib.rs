//! wirl's inference engine: Llama-style decoders (Llama, Mistral, Qwen2/3, Gemma 3) on
//! candle, loaded from HF directories or GGUF files, LoRA adapters applied beside them, with
//! batched sampling that returns per-token log-probs.

pub mod actor;
pub mod block_matmul;
#[cfg(feature = "mpi")]
pub mod comm_mpi;
#[cfg(feature = "cuda")]
pub mod comm_nccl;
mod decode_attention;
pub mod device_sampling;
mod error;
mod executor;
pub mod export;
pub mod generate;
pub mod gguf_check;
pub mod llama;
pub mod load;
pub mod memory_budget;
mod output;
pub mod prefix_cache;
pub mod request;
pub mod reward_model;
pub mod sampling;
mod scheduler;
pub mod text_logprobs;
pub mod tokenizer;

// The decoder written once (`wirl-model`), under the paths the engine's callers have used.
use wirl_model::decode_matmul;
pub(crate) use wirl_model::files;
#[cfg(test)]
pub(crate) use wirl_model::test_values;
pub use wirl_model::{comm, config, decoder, family, finite, invariant, invariant_check, layer, lora, refused};

pub use actor::{EngineHandle, EngineOptions, Finished, InFlight, Streaming};
pub use candle_core::{DType, Device};
pub use comm::{Comm, Solo, ThreadComm, all_gather_bytes};
#[cfg(feature = "mpi")]
pub use comm_mpi::MpiComm;
#[cfg(feature = "cuda")]
pub use comm_nccl::NcclComm;
pub use config::Config;
pub use error::{Error, Refused, Result, error_chain, without_backtrace};
pub use generate::{Batch, generate, generate_with};
pub use llama::{KvCache, Model};
pub use load::{LoadOptions, LoadedModel, load};
pub use output::TextPiece;
pub use request::{Completion, FinishReason, GenerateRequest, RequestId};
pub use reward_model::RewardModel;
pub use sampling::Sampling;
pub use text_logprobs::TextToScore;
pub use tokenizer::{ChatMessage, TemplateVars, TextStream, Tokenizer, check_template_vars};
pub use wirl_model::weights::{WeightMirror, WeightsBarrier, WeightsHold};

/// Pin candle's thread count for the life of the process (unset, candle works it out again on
/// every matmul by reading `/proc/cpuinfo`: measured ~8% of a decode step on 2 cores), and
/// park candle's idle pool threads at once instead of spinning.
/// Call once at the start of `main`, before any other thread exists.
pub fn pin_thread_count() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // The cores this process may run on (`mpirun --bind-to core`, `taskset`, cgroups), not
        // the machine's: two ranks bound to a core each ran two threads each on it, and
        // trained 1.5-2.8x slower than with one (docs/BENCHMARKS.md).
        let allowed = std::thread::available_parallelism().map_or(usize::MAX, std::num::NonZero::get);
        let threads = candle_core::utils::get_num_threads().min(allowed).max(1);
        // SAFETY: documented to be called first in `main`, while the process has one thread,
        // so nothing reads the environment concurrently.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    }
    // candle's elementwise pool (`candle-bp-*`) and rayon's pool (the products) are both as
    // wide as the cores, and take turns: a pool's idle threads that spin (candle's 25,000
    // rounds before parking) take the cores the other pool's work needs. Parked at once,
    // the default job's train phase took ~8 % less (2 cores, same binary, same run:
    // docs/BENCHMARKS.md). `CANDLE_BARRIER_POOL_SPIN_LIMIT` set by the user is kept.
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        // SAFETY: as above, before any other thread exists.
        unsafe { std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0") };
    }
}

thread_local! {
    /// Set while [`contained`] runs third-party code whose panics it turns into errors.
    static CONTAINING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` (third-party code fed input from someone else: a tokenizer's regular expressions,
/// which panic when a pattern backtracks past the regex engine's retry limit), turning a
/// panic into an error that says `what` failed, without the panic's message on stderr (the
/// process's panic hook is kept for every other panic).
pub(crate) fn contained<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = CONTAINING.with(|c| c.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(was));
    outcome.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(Error::Tokenizer(format!("{what} failed: {message}")))
    })
}
