//! On-policy distillation (`[distill]`): the student samples, a teacher reads each sampled
//! completion, and each token's advantage gains `weight × (log π_teacher − log π_student)` of
//! that token — the negative of the per-token reverse KL estimate that TRL's GKD trainer,
//! verl's and Thinking Machines' on-policy distillation use as the token's reward. Alone
//! (`rewards = false`: the rewards' advantages are 0 and every group trains) or beside the
//! rewards'. The student's log-prob is the sampler's (temperature 1), the weights that
//! sampled the token; the teacher's a forward of the teacher over the group (prompt once).

use crate::config::DistillSection;
use crate::observer::{Event, Observer};
use candle_core::{DType, Device};
use wirl_engine::{LoadOptions, Tokenizer};
use wirl_grpo::{GroupBatch, Net};

/// The teacher's head is computed this many bytes of logits at a time.
const HEAD_CHUNK_BYTES: u64 = 256 << 20;

pub struct Teacher {
    net: Net,
    weight: f32,
    rewards: bool,
}

/// What a step's credit read: the reverse KL (student over teacher) summed over the trained
/// tokens whose sampler log-prob is known, and how many there were.
#[derive(Clone, Copy, Debug, Default)]
pub struct DistillFigures {
    pub kl_sum: f64,
    pub tokens: usize,
    /// Seconds of the teacher's forward.
    pub seconds: f64,
}

impl Teacher {
    /// The teacher of `section` on `device`, in f32. Refused when its tokenizer reads ids
    /// otherwise than the student's (`student`): the two models' log-probs of the same ids
    /// would be of different text.
    pub fn load(
        section: &DistillSection,
        student: &Tokenizer,
        device: &Device,
        observer: &mut dyn Observer,
    ) -> crate::error::Result<Teacher> {
        observer.event(Event::Loading { path: &section.teacher });
        let options = LoadOptions { dtype: Some(DType::F32), device: device.clone(), ..LoadOptions::default() };
        let (config, tokenizer, tensors) = wirl_engine::load::load_tensors(&section.teacher, &options)?;
        if let Some(difference) = student.differs_from(&tokenizer) {
            crate::error::bail!(
                "distill.teacher {}: its tokenizer is not the student's ({difference}); the teacher scores the \
                 student's token ids, so it must read them as the student does: a teacher of the same tokenizer \
                 (a larger model of the same family, or a fine-tuned copy)",
                section.teacher.display()
            );
        }
        let net = Net::new(&config, tensors, device)?;
        Ok(Teacher { net, weight: section.weight as f32, rewards: section.rewards })
    }

    /// Whether the rewards' advantages are kept (else only the KL term trains).
    pub fn keeps_rewards(&self) -> bool {
        self.rewards
    }

    /// Add the KL term to each trained token's advantage of `batch` (to its per-token
    /// advantages, made where there were none), the rewards' zeroed when they are not kept.
    pub fn credit(&self, batch: &mut GroupBatch) -> crate::error::Result<DistillFigures> {
        let stats = self.net.completion_stats_chunked(&batch.prompt, &batch.completions, HEAD_CHUNK_BYTES)?;
        let teacher: Vec<Vec<f32>> = stats.logp.to_vec2()?;
        if !self.rewards {
            batch.advantages.iter_mut().for_each(|a| *a = 0.0);
        }
        if batch.token_advantages.is_empty() {
            batch.token_advantages = batch.completions.iter().map(|c| vec![0.0; c.len()]).collect();
        }
        let mut figures = DistillFigures::default();
        for (row, completion) in batch.completions.iter().enumerate() {
            let Some(student) = batch.sampler_logprobs.get(row).filter(|l| l.len() == completion.len()) else {
                continue;
            };
            let trained = batch.trainable.get(row);
            let terms = &mut batch.token_advantages[row];
            terms.resize(completion.len(), 0.0);
            for i in 0..completion.len() {
                if trained.is_some_and(|mask| !mask.get(i).copied().unwrap_or(false)) {
                    continue;
                }
                let gap = teacher[row][i] - student[i];
                terms[i] += self.weight * gap;
                figures.kl_sum -= f64::from(gap);
                figures.tokens += 1;
            }
        }
        Ok(figures)
    }
}
