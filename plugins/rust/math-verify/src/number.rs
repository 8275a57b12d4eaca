//! Exact rationals over `i128`, with every operation checked: a result that does not fit is
//! `None`, and the caller falls back to floating point (or says "too large") instead of
//! computing big numbers. This is what keeps comparison bounded by construction.

/// A reduced fraction `num / den`, `den > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    pub num: i128,
    pub den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rational {
    pub const ZERO: Rational = Rational { num: 0, den: 1 };
    pub const ONE: Rational = Rational { num: 1, den: 1 };

    pub fn int(n: i128) -> Rational {
        Rational { num: n, den: 1 }
    }

    /// `num / den` reduced; `None` when `den` is zero or a sign flip overflows.
    pub fn new(num: i128, den: i128) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (mut num, mut den) = (num / g, den / g);
        if den < 0 {
            num = num.checked_neg()?;
            den = den.checked_neg()?;
        }
        Some(Rational { num, den })
    }

    /// A decimal literal's digits (`"1234"`, `"5"` for 1234.5): `int_digits` and
    /// `frac_digits` are ASCII digits only. `None` when it does not fit.
    pub fn from_decimal(int_digits: &str, frac_digits: &str) -> Option<Rational> {
        let mut num: i128 = 0;
        for b in int_digits.bytes().chain(frac_digits.bytes()) {
            num = num.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        }
        let den = 10i128.checked_pow(u32::try_from(frac_digits.len()).ok()?)?;
        Rational::new(num, den)
    }

    pub fn is_zero(self) -> bool {
        self.num == 0
    }

    pub fn is_integer(self) -> bool {
        self.den == 1
    }

    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    pub fn checked_neg(self) -> Option<Rational> {
        Some(Rational { num: self.num.checked_neg()?, den: self.den })
    }

    pub fn checked_add(self, other: Rational) -> Option<Rational> {
        let g = gcd(self.den, other.den);
        let left = self.num.checked_mul(other.den / g)?;
        let right = other.num.checked_mul(self.den / g)?;
        Rational::new(left.checked_add(right)?, (self.den / g).checked_mul(other.den)?)
    }

    pub fn checked_mul(self, other: Rational) -> Option<Rational> {
        let g1 = gcd(self.num, other.den).max(1);
        let g2 = gcd(other.num, self.den).max(1);
        Rational::new((self.num / g1).checked_mul(other.num / g2)?, (self.den / g2).checked_mul(other.den / g1)?)
    }

    pub fn checked_div(self, other: Rational) -> Option<Rational> {
        if other.is_zero() {
            return None;
        }
        self.checked_mul(Rational::new(other.den, other.num)?)
    }

    /// `self ^ exp` for an integer exponent of at most 256 in size; `None` past that or on
    /// overflow (the caller never computes a tower of powers).
    pub fn checked_pow(self, exp: i128) -> Option<Rational> {
        if exp.unsigned_abs() > 256 {
            return None;
        }
        let mut base = if exp < 0 { Rational::ONE.checked_div(self)? } else { self };
        let mut e = exp.unsigned_abs();
        let mut acc = Rational::ONE;
        while e > 0 {
            if e & 1 == 1 {
                acc = acc.checked_mul(base)?;
            }
            e >>= 1;
            if e > 0 {
                base = base.checked_mul(base)?;
            }
        }
        Some(acc)
    }

    /// `self` rounded to `places` decimals, as a (numerator of tenths-power) integer, for
    /// Math-Verify's float comparison (`round(a, 6) == round(b, 6)`); `None` on overflow.
    pub fn rounded(self, places: u32) -> Option<i128> {
        let scaled = self.checked_mul(Rational::int(10i128.checked_pow(places)?))?;
        // Round half away from zero, as sympy's Float.round does for exact halves.
        let (n, d) = (scaled.num.unsigned_abs(), scaled.den.unsigned_abs());
        let magnitude = i128::try_from(n.checked_mul(2)?.checked_add(d)? / d.checked_mul(2)?).ok()?;
        Some(if scaled.num < 0 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_is_exact_and_reduced() {
        let half = Rational::new(1, 2).unwrap();
        let third = Rational::new(1, 3).unwrap();
        assert_eq!(half.checked_add(third), Rational::new(5, 6));
        assert_eq!(half.checked_mul(third), Rational::new(1, 6));
        assert_eq!(half.checked_div(third), Rational::new(3, 2));
        assert_eq!(Rational::new(4, -8), Rational::new(-1, 2));
        assert_eq!(Rational::from_decimal("1000", "99"), Rational::new(100099, 100));
        assert_eq!(Rational::int(2).checked_pow(-3), Rational::new(1, 8));
    }

    #[test]
    fn overflow_is_none_never_a_wrong_value() {
        assert_eq!(Rational::int(10).checked_pow(40), None);
        assert_eq!(Rational::int(9).checked_pow(1 << 20), None);
        assert_eq!(Rational::int(i128::MAX).checked_add(Rational::ONE), None);
        assert_eq!(Rational::from_decimal(&"9".repeat(60), ""), None);
        assert_eq!(Rational::ONE.checked_div(Rational::ZERO), None);
    }

    #[test]
    fn rounding_matches_decimal_places() {
        let third = Rational::new(1, 3).unwrap();
        assert_eq!(third.rounded(6), Some(333_333));
        assert_eq!(Rational::new(2, 3).unwrap().rounded(6), Some(666_667));
        assert_eq!(Rational::new(-2, 3).unwrap().rounded(6), Some(-666_667));
        assert_eq!(Rational::from_decimal("0", "333333").unwrap().rounded(6), Some(333_333));
    }
}
