//! The problem generator, free of WIT types so that it is unit-tested natively.

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    ChainSum,
    BasicArithmetic,
}

impl Kind {
    pub fn parse(name: &str) -> Result<Kind, String> {
        match name {
            "chain_sum" => Ok(Kind::ChainSum),
            "basic_arithmetic" => Ok(Kind::BasicArithmetic),
            other => {
                Err(format!("config key `kind`: unknown kind {other:?}; use \"chain_sum\" or \"basic_arithmetic\""))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::ChainSum => "chain_sum",
            Kind::BasicArithmetic => "basic_arithmetic",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub kind: Kind,
    pub min_terms: u32,
    pub max_terms: u32,
    pub min_digits: u32,
    pub max_digits: u32,
    pub allow_negative: bool,
}

#[derive(Debug, PartialEq)]
pub struct Problem {
    pub expression: String,
    pub answer: i64,
}

impl Settings {
    pub fn validate(&self) -> Result<(), String> {
        if self.min_terms < 2 || self.min_terms > self.max_terms || self.max_terms > 20 {
            return Err(format!(
                "config keys `min_terms`/`max_terms` = {}/{}: need 2 <= min_terms <= max_terms <= 20",
                self.min_terms, self.max_terms
            ));
        }
        if self.min_digits < 1 || self.min_digits > self.max_digits || self.max_digits > 9 {
            return Err(format!(
                "config keys `min_digits`/`max_digits` = {}/{}: need 1 <= min_digits <= max_digits <= 9",
                self.min_digits, self.max_digits
            ));
        }
        Ok(())
    }

    /// The problem at `(seed, index)`.
    pub fn problem(&self, seed: u64, index: u64) -> Problem {
        let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17));
        // Retry a bounded number of times for a non-negative chain sum, then accept.
        for _ in 0..64 {
            let problem = match self.kind {
                Kind::ChainSum => self.chain_sum(&mut rng),
                Kind::BasicArithmetic => self.basic_arithmetic(&mut rng),
            };
            if self.allow_negative || problem.answer >= 0 {
                return problem;
            }
        }
        self.chain_sum_all_plus(&mut rng)
    }

    fn terms(&self, rng: &mut SplitMix64) -> u32 {
        rng.range(self.min_terms as u64, self.max_terms as u64) as u32
    }

    fn number(&self, rng: &mut SplitMix64) -> i64 {
        let digits = rng.range(self.min_digits as u64, self.max_digits as u64) as u32;
        let low = if digits == 1 { 0 } else { 10u64.pow(digits - 1) };
        rng.range(low, 10u64.pow(digits) - 1) as i64
    }

    fn chain_sum(&self, rng: &mut SplitMix64) -> Problem {
        let mut answer = self.number(rng);
        let mut expression = answer.to_string();
        for _ in 1..self.terms(rng) {
            let value = self.number(rng);
            if rng.coin() {
                answer += value;
                expression.push_str(&format!(" + {value}"));
            } else {
                answer -= value;
                expression.push_str(&format!(" - {value}"));
            }
        }
        Problem { expression, answer }
    }

    fn chain_sum_all_plus(&self, rng: &mut SplitMix64) -> Problem {
        let values: Vec<i64> = (0..self.terms(rng)).map(|_| self.number(rng)).collect();
        let expression = values.iter().map(i64::to_string).collect::<Vec<_>>().join(" + ");
        Problem { expression, answer: values.iter().sum() }
    }

    /// A sum of products: `*` and `/` bind tighter than `+` and `-`, and a division's
    /// dividend is made a multiple of its divisor so that every answer is an integer.
    fn basic_arithmetic(&self, rng: &mut SplitMix64) -> Problem {
        let mut expression = String::new();
        let mut answer = 0i64;
        let mut remaining = self.terms(rng);
        let mut first = true;
        while remaining > 0 {
            let (text, value, used) = match (remaining >= 2, rng.next() % 3) {
                (true, 0) => {
                    let (a, b) = (self.number(rng), self.number(rng));
                    (format!("{a} * {b}"), a * b, 2)
                }
                (true, 1) => {
                    let divisor = self.number(rng).max(1);
                    let quotient = self.number(rng);
                    (format!("{} / {divisor}", quotient * divisor), quotient, 2)
                }
                _ => {
                    let a = self.number(rng);
                    (a.to_string(), a, 1)
                }
            };
            remaining -= used;
            if first {
                expression = text;
                answer = value;
                first = false;
            } else if rng.coin() {
                expression.push_str(&format!(" + {text}"));
                answer += value;
            } else {
                expression.push_str(&format!(" - {text}"));
                answer -= value;
            }
        }
        Problem { expression, answer }
    }
}

/// SplitMix64: tiny, fast, and the same on every platform, which is what reproducible task
/// sets need (a library RNG may change its stream between versions).
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A fair coin.
    fn coin(&mut self) -> bool {
        self.next() >> 63 == 0
    }

    /// Uniform in `low..=high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: Kind, terms: u32, digits: u32) -> Settings {
        Settings { kind, min_terms: terms, max_terms: terms, min_digits: 1, max_digits: digits, allow_negative: true }
    }

    /// Evaluate `a op b op c` with `*` `/` before `+` `-`, independently of the generator.
    fn evaluate(expression: &str) -> i64 {
        let tokens: Vec<&str> = expression.split(' ').collect();
        let mut sum = 0i64;
        let mut sign = 1i64;
        let mut product: i64 = tokens[0].parse().unwrap();
        let mut i = 1;
        while i < tokens.len() {
            let value: i64 = tokens[i + 1].parse().unwrap();
            match tokens[i] {
                "*" => product *= value,
                "/" => {
                    assert_eq!(product % value, 0, "inexact division in {expression}");
                    product /= value
                }
                op => {
                    sum += sign * product;
                    sign = if op == "+" { 1 } else { -1 };
                    product = value;
                }
            }
            i += 2;
        }
        sum + sign * product
    }

    #[test]
    fn answers_are_right_and_tasks_are_deterministic() {
        for kind in [Kind::ChainSum, Kind::BasicArithmetic] {
            let s = settings(kind, 4, 3);
            for index in 0..2000 {
                let p = s.problem(7, index);
                assert_eq!(evaluate(&p.expression), p.answer, "{p:?}");
                assert_eq!(s.problem(7, index), p);
            }
            assert_ne!(s.problem(7, 0), s.problem(8, 0));
        }
    }

    #[test]
    fn knobs_are_obeyed() {
        let s = settings(Kind::ChainSum, 3, 1);
        for index in 0..500 {
            let p = s.problem(1, index);
            assert_eq!(p.expression.split(' ').count(), 5, "{p:?}");
            assert!(p.expression.split(' ').step_by(2).all(|n| n.len() == 1));
        }
        let mut positive = settings(Kind::ChainSum, 5, 2);
        positive.allow_negative = false;
        assert!((0..500).all(|i| positive.problem(3, i).answer >= 0));
        assert!(Settings { min_terms: 1, ..settings(Kind::ChainSum, 2, 1) }.validate().is_err());
        assert!(Kind::parse("calculus").unwrap_err().contains("calculus"));
    }
}
