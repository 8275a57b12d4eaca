//! Seeds derived from a run's seed: every sampled or shuffled thing is a function of (seed,
//! index), so runs and resumes repeat.

/// A seed for the `index`-th request of a run seeded `seed` (SplitMix64 finaliser).
pub fn seed_for(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
