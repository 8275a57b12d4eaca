//! Choosing the next token from logits.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Per-request sampling settings (mirrors `wirl:rl/types.sampling`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    /// 0 keeps all tokens.
    pub top_k: usize,
    /// 1 keeps all tokens.
    pub top_p: f32,
    /// 0 keeps all tokens.
    pub min_p: f32,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    /// Keep going past the model's end-of-sequence tokens (benchmarks: a fixed length).
    pub ignore_eos: bool,
    /// Also give, for each generated position, this many most likely tokens with their
    /// log-probabilities (temperature 1, like the sampled token's); 0: none.
    pub top_logprobs: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            max_tokens: 128,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            stop: Vec::new(),
            seed: None,
            ignore_eos: false,
            top_logprobs: 0,
        }
    }
}

impl Sampling {
    pub fn greedy(max_tokens: usize) -> Self {
        Sampling { max_tokens, temperature: 0.0, ..Default::default() }
    }

    /// Neither top-k, top-p nor min-p cuts the distribution.
    pub fn unfiltered(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && self.min_p <= 0.0
    }

    /// Every field within [`rules`]; the message names the field and its range.
    pub fn validate(&self) -> Result<(), crate::Refused> {
        let named = |field: &str, value: f32, rule: Result<f32, &str>| {
            rule.map(drop).map_err(|range| format!("{field} {range}, got {value}"))
        };
        named("temperature", self.temperature, rules::temperature(self.temperature.into()))?;
        named("top_p", self.top_p, rules::top_p(self.top_p.into()))?;
        named("min_p", self.min_p, rules::min_p(self.min_p.into()))?;
        if self.max_tokens == 0 {
            return Err("max_tokens must be at least 1, got 0".into());
        }
        if self.stop.iter().any(String::is_empty) {
            return Err("stop holds an empty string, which would stop before any text".into());
        }
        Ok(())
    }
}

/// The one rule set for sampling settings. The engine checks every request by it
/// ([`Sampling::validate`]); a training config's `[sampling]`, the HTTP API's fields and a
/// served task's `generation_args` read their values through it, so that a value is
/// accepted or refused alike everywhere, with the same words. `Err` is the allowed range.
pub mod rules {
    /// OpenAI's bound: past it sampling is close to uniform over the vocabulary.
    pub const MAX_TEMPERATURE: f64 = 2.0;

    pub fn temperature(t: f64) -> Result<f32, &'static str> {
        if (0.0..=MAX_TEMPERATURE).contains(&t) { Ok(t as f32) } else { Err("must be from 0 to 2") }
    }

    pub fn top_p(p: f64) -> Result<f32, &'static str> {
        if p > 0.0 && p <= 1.0 { Ok(p as f32) } else { Err("must be in (0, 1]") }
    }

    /// vLLM's -1 (and 0) keep every token.
    pub fn top_k(k: i64) -> Result<usize, &'static str> {
        if k >= -1 { Ok(k.max(0) as usize) } else { Err("must be -1, 0 (all tokens) or a positive count") }
    }

    /// 1 would keep no token but the likeliest only when it has all the mass: refused.
    pub fn min_p(p: f64) -> Result<f32, &'static str> {
        if (0.0..1.0).contains(&p) { Ok(p as f32) } else { Err("must be from 0 up to (not including) 1") }
    }

    /// At least one token, at most `limit`.
    pub fn max_tokens(m: i64, limit: usize) -> Result<usize, crate::Refused> {
        if m >= 1 && m as u64 <= limit as u64 {
            Ok(m as usize)
        } else {
            Err(crate::refused!("must be from 1 to {limit}"))
        }
    }
}

/// Samples tokens for one row.
pub struct Sampler {
    settings: Sampling,
    rng: StdRng,
}

impl Sampler {
    /// `stream` distinguishes the samples of one request: sample `j` of a request seeded `s`
    /// draws from its own generator, the same whether it runs alone or in a batch.
    pub fn new(settings: &Sampling, stream: u64) -> Self {
        let seed = settings.seed.unwrap_or_else(rand::random);
        let rng = StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Sampler { settings: settings.clone(), rng }
    }

    /// The next token, and its log-probability under the unmodified (temperature 1)
    /// distribution, which is what the trainer's importance ratios need.
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        let uniform = self.next_uniform();
        sample_with(&self.settings, logits, uniform)
    }

    /// The uniform draw of this row's next token (none for greedy rows: their stream does
    /// not advance), from the row's own seeded stream: what a device sampler is given, so
    /// that it draws what [`Sampler::sample`] would have.
    pub fn next_uniform(&mut self) -> f32 {
        if self.settings.temperature == 0.0 { 0.0 } else { self.rng.random::<f32>() }
    }

    pub fn settings(&self) -> &Sampling {
        &self.settings
    }
}

/// The token that `settings` draws from `logits` with the uniform draw `uniform` (in
/// [0, 1); unused when greedy), and its temperature-1 log-probability: the inverse of the
/// cumulative weights, walked in vocabulary order (the most likely first once filtered).
pub fn sample_with(settings: &Sampling, logits: &[f32], uniform: f32) -> (u32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if settings.temperature == 1.0 && settings.unfiltered() {
        // At temperature 1 the draw's weights are the log-prob's terms: one pass of
        // `exp` over the vocabulary instead of two (the same numbers either way).
        let weights: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let total: f32 = weights.iter().sum();
        let token = draw_weighted(&weights, total, uniform).unwrap_or_else(|| argmax(logits));
        // The log-prob as the learner computes it (`invariant.rs`: the sum in f64).
        return (token, logits[token as usize] - crate::invariant::log_norm_from(max, weights.iter().copied()));
    }
    let log_norm = crate::invariant::log_norm(logits);
    let token = if settings.temperature == 0.0 { argmax(logits) } else { draw(settings, logits, max, uniform) };
    (token, logits[token as usize] - log_norm)
}

fn draw(s: &Sampling, logits: &[f32], max: f32, uniform: f32) -> u32 {
    let inv_t = 1.0 / s.temperature;
    if s.unfiltered() {
        // One pass over the whole vocabulary, no sorting.
        let weights: Vec<f32> = logits.iter().map(|&l| ((l - max) * inv_t).exp()).collect();
        let total: f32 = weights.iter().sum();
        return draw_weighted(&weights, total, uniform).unwrap_or_else(|| argmax(logits));
    }
    // Candidates by probability, most likely first.
    let mut candidates: Vec<(u32, f32)> =
        logits.iter().enumerate().map(|(i, &l)| (i as u32, ((l - max) * inv_t).exp())).collect();
    let by_weight = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
    if s.top_k > 0 && s.top_k < candidates.len() {
        candidates.select_nth_unstable_by(s.top_k - 1, by_weight);
        candidates.truncate(s.top_k);
    } else {
        // Tokens below 1e-9 of the most likely one can never fall inside a top-p or
        // min-p cut of practical size; dropping them first keeps the sort short.
        candidates.retain(|&(_, w)| w > 1e-9);
    }
    candidates.sort_unstable_by(by_weight);
    if s.min_p > 0.0 {
        let floor = candidates[0].1 * s.min_p;
        candidates.retain(|&(_, w)| w >= floor);
    }
    let total: f32 = candidates.iter().map(|c| c.1).sum();
    if s.top_p < 1.0 {
        let mut kept = 0.0;
        let mut cut = candidates.len();
        for (i, c) in candidates.iter().enumerate() {
            kept += c.1 / total;
            if kept >= s.top_p {
                cut = i + 1;
                break;
            }
        }
        candidates.truncate(cut);
    }
    let total: f32 = candidates.iter().map(|c| c.1).sum();
    let mut target = uniform * total;
    for &(token, w) in &candidates {
        target -= w;
        if target <= 0.0 {
            return token;
        }
    }
    candidates[0].0
}

/// Token `i` with probability `weights[i] / total` for a uniform draw; None if rounding
/// left the draw past the end.
fn draw_weighted(weights: &[f32], total: f32, uniform: f32) -> Option<u32> {
    let mut target = uniform * total;
    for (i, w) in weights.iter().enumerate() {
        target -= w;
        if target <= 0.0 {
            return Some(i as u32);
        }
    }
    None
}

/// The `k` most likely tokens under the unmodified (temperature 1) distribution, most likely
/// first, with their log-probabilities: what an API's `top_logprobs` reports.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let log_norm = crate::invariant::log_norm(logits);
    let mut candidates: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k < candidates.len() {
        candidates.select_nth_unstable_by(k - 1, by_logit);
        candidates.truncate(k);
    }
    candidates.sort_unstable_by(by_logit);
    candidates.into_iter().map(|(token, l)| (token, l - log_norm)).collect()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn top_logprobs_are_the_most_likely_tokens_with_their_log_probabilities() {
        let logits = [0.5, 3.0, -1.0, 2.0, 3.0];
        let top = super::top_logprobs(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4, 3], "ties by id");
        let norm: f32 = logits.iter().map(|l| l.exp()).sum::<f32>().ln();
        for (token, logprob) in &top {
            assert!((logprob - (logits[*token as usize] - norm)).abs() < 1e-6);
        }
        assert_eq!(super::top_logprobs(&logits, 9).len(), 5);
        assert!(super::top_logprobs(&logits, 0).is_empty());
    }

    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_reports_its_log_prob() {
        let mut sampler = Sampler::new(&Sampling::greedy(1), 0);
        let (token, logprob) = sampler.sample(&[0.0, 2.0, 1.0]);
        assert_eq!(token, 1);
        let expected = 2.0 - (1f32 + 2f32.exp() + 1f32.exp()).ln();
        assert!((logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn filters_restrict_the_candidates() {
        let logits = [5.0, 4.9, 0.0, -1.0, -2.0];
        for settings in [
            Sampling { top_k: 2, ..Default::default() },
            Sampling { top_p: 0.9, ..Default::default() },
            Sampling { min_p: 0.5, ..Default::default() },
        ] {
            let mut sampler = Sampler::new(&Sampling { seed: Some(1), ..settings.clone() }, 0);
            for _ in 0..500 {
                let (token, _) = sampler.sample(&logits);
                assert!(token < 2, "{settings:?} drew {token}");
            }
        }
    }

    #[test]
    fn seeded_streams_repeat_and_differ_by_stream() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |stream| {
            let mut s = Sampler::new(&Sampling { seed: Some(42), ..Default::default() }, stream);
            (0..20).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(0), draw(0));
        assert_ne!(draw(0), draw(1));
    }

    #[test]
    fn one_rule_set_names_each_field_and_its_range() {
        use super::{Sampling, rules};
        assert_eq!(rules::temperature(2.0), Ok(2.0));
        for t in [2.01, -0.1, f64::NAN, f64::INFINITY] {
            assert_eq!(rules::temperature(t), Err("must be from 0 to 2"), "{t}");
        }
        assert_eq!(
            (rules::top_p(1.0), rules::top_p(0.0).is_err(), rules::top_p(f64::NAN).is_err()),
            (Ok(1.0), true, true)
        );
        assert_eq!((rules::top_k(-1), rules::top_k(7), rules::top_k(-2).is_err()), (Ok(0), Ok(7), true));
        assert_eq!((rules::min_p(0.0), rules::min_p(1.0).is_err()), (Ok(0.0), true));
        assert_eq!(rules::max_tokens(8, 8), Ok(8));
        assert_eq!(rules::max_tokens(0, 8), Err(crate::Refused("must be from 1 to 8".into())));
        assert_eq!(rules::max_tokens(9, 8), Err(crate::Refused("must be from 1 to 8".into())));
        let error = Sampling { temperature: 3.0, ..Default::default() }.validate().unwrap_err().0;
        assert_eq!(error, "temperature must be from 0 to 2, got 3");
    }
}
