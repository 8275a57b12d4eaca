//! The models 0.2.0 rewards judge with besides the policy (`judge_model` of a `[[rewards]]`
//! entry): the model the run started from, frozen (`"initial"`), or another model (a path),
//! each loaded once when a run or an evaluation starts, with an engine of its own so that a
//! judge's batches do not wait behind the policy's.

use crate::observer::{Event, Observer};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use wirl_engine::{Device, EngineHandle, EngineOptions, LoadOptions};
use wirl_rollout::{InferenceUsage, JudgeModel, LoadedTask, RewardEngine};

/// The engines of `tasks`' judge models other than the policy, by model. `initial` is
/// `start` (the config's model: with a resume or LoRA, still the weights the run began from).
pub fn load_judges(
    tasks: &[LoadedTask],
    start: &Path,
    device: &Device,
    engine_options: EngineOptions,
    seed: u64,
    usage: &Arc<InferenceUsage>,
    observer: &mut dyn Observer,
) -> crate::error::Result<BTreeMap<JudgeModel, RewardEngine>> {
    let wanted: BTreeSet<JudgeModel> = tasks.iter().flat_map(|task| task.scorers.judge_models()).collect();
    let mut judges = BTreeMap::new();
    for judge in wanted {
        let path = match &judge {
            JudgeModel::Policy => continue,
            JudgeModel::Initial => start.to_path_buf(),
            JudgeModel::Path(path) => path.clone(),
        };
        observer.event(Event::Loading { path: &path });
        let options = LoadOptions { device: device.clone(), ..LoadOptions::default() };
        let loaded = wirl_engine::load(&path, &options)
            .map_err(|e| crate::error::invalid!("judge_model = \"{judge}\": {}", wirl_engine::error_chain(&e)))?;
        let context = loaded.config.context();
        let tokenizer = Arc::new(loaded.tokenizer);
        // The thread ends when the last handle is dropped (with the run).
        let (handle, _thread) = EngineHandle::spawn_with(Arc::new(loaded.model), tokenizer.clone(), engine_options)?;
        judges.insert(judge, RewardEngine { handle, tokenizer, context, seed, usage: usage.clone() });
    }
    Ok(judges)
}
