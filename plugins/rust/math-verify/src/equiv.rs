//! Whether two parsed answers are the same, in the order Math-Verify tries it: structure
//! first (relations, sets, tuples, intervals, matrices), then exact rational evaluation, then
//! floating point — rounded to `float_rounding` places when either side is a decimal — and
//! for expressions with names, evaluation of both at seeded random points (a polynomial
//! identity test). Nothing is ever expanded or computed at full size: exact arithmetic stops
//! at `i128`, powers past a small exponent are evaluated in floating point only, and a value
//! too large for a float is `TooLarge`.

use crate::expr::{Constant, Expr, Func, RelOp};
use crate::number::Rational;

/// How comparisons are made.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Decimal places floats are rounded to before comparing (Math-Verify's `float_rounding`).
    pub float_rounding: u32,
    /// Relative tolerance of floating-point comparisons of expressions without decimals.
    pub rel_tol: f64,
    /// Whether a gold set or interval accepts a relation describing it (`[1, \\infty)` and
    /// `x \\ge 1`); Math-Verify's `allow_set_relation_comp`, off by default there and here.
    /// The other way round (a gold relation, a predicted set) is always compared.
    pub set_relation: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { float_rounding: 6, rel_tol: 1e-9, set_relation: false }
    }
}

/// The comparison could not be made: a value is too large to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge(pub String);

/// Sets and lists larger than this are refused rather than matched (matching is quadratic).
pub const MAX_ELEMENTS: usize = 2_000;

pub type Outcome = Result<bool, TooLarge>;

/// Whether `pred` answers `gold`. Not symmetric, as Math-Verify's is not: an assignment
/// `x = 3` as gold accepts `3`, and a prediction written as an equation is judged by its
/// last right side when the gold is not one.
pub fn equal(gold: &Expr, pred: &Expr, opts: &Options) -> Outcome {
    // A chain of assignments is its first side and its last (`x = 5 + 5 + 1 = 11` is x = 11).
    let (gold_chain, pred_chain) = (first_and_last(gold), first_and_last(pred));
    let gold = gold_chain.as_ref().unwrap_or(gold);
    let pred = pred_chain.as_ref().unwrap_or(pred);
    let gold = assignment_value(gold, pred);
    let pred = match (gold.is_equation(), pred.is_equation()) {
        (false, true) => last_rhs(pred),
        _ => pred,
    };
    let gold = match gold {
        Expr::In(_, set) => set.as_ref(),
        other => other,
    };
    let pred = match pred {
        Expr::In(_, set) => set.as_ref(),
        other => other,
    };
    if gold == pred {
        return Ok(true);
    }
    // A relation against a set: the relation as the set it describes (`1 < x < 2` is (1, 2)).
    if gold.is_relation() && is_set_like(pred) {
        if let Some(set) = relation_as_set(gold) {
            return sets_equal(&set, pred, opts);
        }
        return Ok(false);
    }
    if pred.is_relation() && is_set_like(gold) {
        // Math-Verify allows set–relation comparison only when the prediction is the set,
        // unless told otherwise.
        if opts.set_relation
            && let Some(set) = relation_as_set(pred)
        {
            return sets_equal(gold, &set, opts);
        }
        return Ok(false);
    }
    if gold.is_relation() && pred.is_relation() {
        return relations_equal(gold, pred, opts);
    }
    if gold.is_relation() || pred.is_relation() {
        return Ok(false);
    }
    if gold.is_collection() || pred.is_collection() {
        return sets_equal(gold, pred, opts);
    }
    if let (Some(a), Some(b)) = (as_word(gold), as_word(pred))
        && (matches!(gold, Expr::Text(_)) || matches!(pred, Expr::Text(_)))
    {
        return Ok(a == b);
    }
    if matches!(gold, Expr::Text(_)) || matches!(pred, Expr::Text(_)) {
        return Ok(false);
    }
    // A percentage against a plain number: its value (50\% is 0.5) or, as Math-Verify also
    // accepts for a whole number of percent, its number (50\% is 50; 12.5\% is not 12.5).
    match (gold, pred) {
        (Expr::Percent(x), other) | (other, Expr::Percent(x)) if !matches!(other, Expr::Percent(_)) => {
            Ok(scalars_equal(gold, pred, opts)? || !is_atomic_decimal(x) && scalars_equal(x, other, opts)?)
        }
        _ => scalars_equal(gold, pred, opts),
    }
}

fn first_and_last(expr: &Expr) -> Option<Expr> {
    match expr {
        Expr::Rel(items, ops) if ops.len() > 1 && expr.is_assignment() => Some(Expr::Rel(
            vec![items[0].clone(), items.last().expect("operands").clone()],
            vec![crate::expr::RelOp::Eq],
        )),
        _ => None,
    }
}

/// A text answer as a word to compare: letters and digits, lower case (`\\text{(C)}` is `c`);
/// a product of one-letter names is the word they spell (`odd` written without `\\text`).
fn as_word(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Text(t) => Some(t.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()),
        Expr::Sym(name) if name.chars().all(char::is_alphabetic) => Some(name.to_lowercase()),
        Expr::Const(Constant::E) => Some("e".into()),
        Expr::Mul(items) => items.iter().map(as_word).collect::<Option<Vec<_>>>().map(|w| w.concat()),
        _ => None,
    }
}

/// `x = 3` as gold, when the prediction is not an equation, is `3`.
fn assignment_value<'a>(gold: &'a Expr, pred: &Expr) -> &'a Expr {
    if gold.is_assignment() && !pred.is_equation() { last_rhs(gold) } else { gold }
}

fn last_rhs(expr: &Expr) -> &Expr {
    match expr {
        Expr::Rel(items, _) => items.last().expect("a relation has operands"),
        other => other,
    }
}

fn is_set_like(expr: &Expr) -> bool {
    matches!(expr, Expr::Set(_) | Expr::Pair(..) | Expr::Interval { .. } | Expr::Union(_))
}

/// The interval a relation in one name describes: `a < x < b`, `x \ge a`, `a > x`.
fn relation_as_set(rel: &Expr) -> Option<Expr> {
    let Expr::Rel(items, ops) = rel else { return None };
    let is_name = |e: &Expr| e.is_names_only();
    let inf = || Expr::Const(Constant::Infinity);
    let neg_inf = || Expr::Neg(Box::new(Expr::Const(Constant::Infinity)));
    let interval = |lo: Expr, lo_open: bool, hi: Expr, hi_open: bool| Expr::Interval {
        lo: Box::new(lo),
        hi: Box::new(hi),
        lo_open,
        hi_open,
    };
    match (items.as_slice(), ops.as_slice()) {
        ([a, x, b], [op1, op2]) if is_name(x) => {
            let (lo_op, hi_op, lo, hi) = match (op1, op2) {
                (RelOp::Lt | RelOp::Le, RelOp::Lt | RelOp::Le) => (*op1, *op2, a, b),
                (RelOp::Gt | RelOp::Ge, RelOp::Gt | RelOp::Ge) => (*op2, *op1, b, a),
                _ => return None,
            };
            Some(interval(
                lo.clone(),
                lo_op == RelOp::Lt || lo_op == RelOp::Gt,
                hi.clone(),
                hi_op == RelOp::Lt || hi_op == RelOp::Gt,
            ))
        }
        ([x, a], [op]) if is_name(x) => match op {
            RelOp::Gt => Some(interval(a.clone(), true, inf(), true)),
            RelOp::Ge => Some(interval(a.clone(), false, inf(), true)),
            RelOp::Lt => Some(interval(neg_inf(), true, a.clone(), true)),
            RelOp::Le => Some(interval(neg_inf(), true, a.clone(), false)),
            _ => None,
        },
        ([a, x], [op]) if is_name(x) => relation_as_set(&Expr::Rel(vec![x.clone(), a.clone()], vec![op.flipped()])),
        _ => None,
    }
}

/// Relations: the same kind of relation between equal differences (`a = b` is `b = a` and
/// `a - b = 0`; `a < b` is `b > a`), operand by operand along a chain.
fn relations_equal(gold: &Expr, pred: &Expr, opts: &Options) -> Outcome {
    let (Expr::Rel(gi, go), Expr::Rel(pi, po)) = (gold, pred) else { return Ok(false) };
    if go.len() != po.len() {
        return Ok(false);
    }
    // As written.
    if go == po && pairwise(gi, pi, opts)? {
        return Ok(true);
    }
    // Read right to left.
    let flipped: Vec<RelOp> = po.iter().rev().map(|op| op.flipped()).collect();
    if *go == flipped {
        let reversed: Vec<Expr> = pi.iter().rev().cloned().collect();
        if pairwise(gi, &reversed, opts)? {
            return Ok(true);
        }
    }
    // One equation: the same up to a constant factor (`2x + 4y - 3 = 0` is
    // `y = -x/2 + 3/4`), as solving both would show.
    if go.len() == 1 && go[0] == RelOp::Eq && po[0] == RelOp::Eq {
        return proportional(&difference(&gi[0], &gi[1]), &difference(&pi[0], &pi[1]), opts);
    }
    // One relation: compare `lhs - rhs` (either sign for `=` and `≠`, flipped for orders).
    if go.len() == 1 {
        let g = difference(&gi[0], &gi[1]);
        let p = difference(&pi[0], &pi[1]);
        let (gop, pop) = (go[0], po[0]);
        if gop == pop && scalars_equal(&g, &p, opts)? {
            return Ok(true);
        }
        let negated = Expr::Neg(Box::new(p));
        if (gop == pop && !gop.is_order() || gop == pop.flipped() && gop.is_order())
            && scalars_equal(&g, &negated, opts)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `a = c·b` for one non-zero constant `c`, at seeded random points.
fn proportional(a: &Expr, b: &Expr, opts: &Options) -> Outcome {
    let mut names = Vec::new();
    a.symbols(&mut names);
    let mut other = Vec::new();
    b.symbols(&mut other);
    if names.len() != other.len() || other.iter().any(|n| !names.contains(n)) {
        return Ok(false);
    }
    let mut ratio: Option<f64> = None;
    let mut defined = 0;
    for values in random_points(&names, 8) {
        let (x, y) = (approx(a, &values)?, approx(b, &values)?);
        if !x.is_finite() || !y.is_finite() || y.abs() < 1e-12 {
            continue;
        }
        let r = x / y;
        match ratio {
            None if r.abs() > 1e-12 => ratio = Some(r),
            None => return Ok(false),
            Some(first) if !close(first, r, opts.rel_tol.max(1e-9)) => return Ok(false),
            Some(_) => {}
        }
        defined += 1;
    }
    Ok(defined >= 3)
}

fn difference(a: &Expr, b: &Expr) -> Expr {
    Expr::Add(vec![a.clone(), Expr::Neg(Box::new(b.clone()))])
}

fn pairwise(a: &[Expr], b: &[Expr], opts: &Options) -> Outcome {
    if a.len() != b.len() {
        return Ok(false);
    }
    for (x, y) in a.iter().zip(b) {
        if !equal(x, y, opts)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The elements of a `\pm` answer, or the value itself.
fn expand_plus_minus(expr: &Expr) -> Option<Expr> {
    match expr {
        Expr::PlusMinus(a, b) => Some(Expr::Set(vec![
            Expr::Add(vec![(**a).clone(), (**b).clone()]),
            Expr::Add(vec![(**a).clone(), Expr::Neg(b.clone())]),
        ])),
        _ => None,
    }
}

/// Collections: sets order-free, tuples and matrices in order, intervals by their ends.
fn sets_equal(gold: &Expr, pred: &Expr, opts: &Options) -> Outcome {
    if let Some(g) = expand_plus_minus(gold) {
        return sets_equal(&g, pred, opts);
    }
    if let Some(p) = expand_plus_minus(pred) {
        return sets_equal(gold, &p, opts);
    }
    match (gold, pred) {
        (Expr::Set(a), Expr::Set(b)) => unordered(&values_of(a), &values_of(b), opts),
        // A set of one is its element (`\{3\}` and `3`); Math-Verify unwraps one-element sets.
        (Expr::Set(a), other) | (other, Expr::Set(a)) if a.len() == 1 && !matches!(other, Expr::Set(_)) => {
            equal_either_way(gold, &a[0], other, opts)
        }
        (Expr::Tuple(a), Expr::Tuple(b)) => pairwise(a, b, opts),
        (Expr::Pair(a1, a2), Expr::Pair(b1, b2)) => Ok(equal(a1, b1, opts)? && equal(a2, b2, opts)?),
        (Expr::Pair(lo, hi), Expr::Interval { .. }) => {
            let open = Expr::Interval { lo: lo.clone(), hi: hi.clone(), lo_open: true, hi_open: true };
            sets_equal(&open, pred, opts)
        }
        (Expr::Interval { .. }, Expr::Pair(lo, hi)) => {
            let open = Expr::Interval { lo: lo.clone(), hi: hi.clone(), lo_open: true, hi_open: true };
            sets_equal(gold, &open, opts)
        }
        (
            Expr::Interval { lo: l1, hi: h1, lo_open: lo1, hi_open: ho1 },
            Expr::Interval { lo: l2, hi: h2, lo_open: lo2, hi_open: ho2 },
        ) => Ok(lo1 == lo2 && ho1 == ho2 && equal(l1, l2, opts)? && equal(h1, h2, opts)?),
        (Expr::Union(a), Expr::Union(b)) => unordered(a, b, opts),
        (Expr::Matrix(a), Expr::Matrix(b)) => {
            if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.len() != y.len()) {
                return Ok(false);
            }
            for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
                if !equal(x, y, opts)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        // A column or row vector and a tuple of the same entries.
        (Expr::Matrix(m), Expr::Tuple(t)) | (Expr::Tuple(t), Expr::Matrix(m))
            if m.len() == 1 || m.iter().all(|row| row.len() == 1) =>
        {
            let flat: Vec<Expr> = m.iter().flatten().cloned().collect();
            pairwise(&flat, t, opts)
        }
        (Expr::Matrix(m), Expr::Pair(a, b)) | (Expr::Pair(a, b), Expr::Matrix(m))
            if m.len() == 1 || m.iter().all(|row| row.len() == 1) =>
        {
            let flat: Vec<Expr> = m.iter().flatten().cloned().collect();
            pairwise(&flat, &[(**a).clone(), (**b).clone()], opts)
        }
        (Expr::Tuple(t), Expr::Pair(a, b)) | (Expr::Pair(a, b), Expr::Tuple(t)) => {
            pairwise(t, &[(**a).clone(), (**b).clone()], opts)
        }
        _ => Ok(false),
    }
}

/// The elements of a list of answers with assignments read as their values (`p = -1, p =
/// 15/8` is {-1, 15/8}; `k = 45, n = 2` is {45, 2}), as Math-Verify's unwrapping does.
fn values_of(items: &[Expr]) -> Vec<Expr> {
    items
        .iter()
        .map(|e| match e {
            Expr::Rel(parts, _) if e.is_assignment() => parts.last().expect("operands").clone(),
            other => other.clone(),
        })
        .collect()
}

/// Compares `a` with `b` the way round they came in (gold first).
fn equal_either_way(gold: &Expr, elem: &Expr, other: &Expr, opts: &Options) -> Outcome {
    if matches!(gold, Expr::Set(_)) { equal(elem, other, opts) } else { equal(other, elem, opts) }
}

/// Order-free, as sets are: every element of `a` is in `b` and every element of `b` in `a`
/// (a repeated element counts once, as in Math-Verify's sympy sets).
fn unordered(a: &[Expr], b: &[Expr], opts: &Options) -> Outcome {
    if a.len().max(b.len()) > MAX_ELEMENTS {
        return Err(TooLarge(format!("a set of {} elements (at most {MAX_ELEMENTS})", a.len().max(b.len()))));
    }
    let mut matched_b = vec![false; b.len()];
    for x in a {
        let mut found = false;
        for (j, y) in b.iter().enumerate() {
            if equal(x, y, opts)? {
                matched_b[j] = true;
                found = true;
            }
        }
        if !found {
            return Ok(false);
        }
    }
    Ok(matched_b.iter().all(|m| *m))
}

/// Whether the expression is a decimal number as written (or a percentage of one): those are
/// compared rounded, as Math-Verify compares floats.
fn is_atomic_decimal(expr: &Expr) -> bool {
    match expr {
        Expr::Num { decimal, .. } => *decimal,
        Expr::Float(_) => true,
        Expr::Neg(a) | Expr::Percent(a) => is_atomic_decimal(a),
        _ => false,
    }
}

fn scalars_equal(gold: &Expr, pred: &Expr, opts: &Options) -> Outcome {
    let rounded = is_atomic_decimal(gold) || is_atomic_decimal(pred);
    if !gold.has_symbols() && !pred.has_symbols() {
        if let (Some(a), Some(b)) = (exact(gold)?, exact(pred)?) {
            if a == b {
                return Ok(true);
            }
            if rounded {
                return Ok(match (a.rounded(opts.float_rounding), b.rounded(opts.float_rounding)) {
                    (Some(x), Some(y)) => x == y,
                    _ => close(a.to_f64(), b.to_f64(), opts.rel_tol),
                });
            }
            return Ok(false);
        }
        let (a, b) = (approx(gold, &[])?, approx(pred, &[])?);
        return Ok(floats_equal(a, b, rounded, opts));
    }
    random_points_equal(gold, pred, opts)
}

fn floats_equal(a: f64, b: f64, rounded: bool, opts: &Options) -> bool {
    if a.is_nan() || b.is_nan() {
        return false;
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    if rounded {
        let scale = 10f64.powi(opts.float_rounding as i32);
        return (a * scale).round() == (b * scale).round() || close(a, b, opts.rel_tol);
    }
    close(a, b, opts.rel_tol)
}

fn close(a: f64, b: f64, rel_tol: f64) -> bool {
    (a - b).abs() <= rel_tol * a.abs().max(b.abs()).max(1e-300) || (a - b).abs() < 1e-12
}

/// Both sides at a few seeded points for their names: equal at every point where both are
/// defined (and defined at enough of them). A polynomial identity test: two different
/// rational functions agree at random points with probability near zero.
fn random_points_equal(gold: &Expr, pred: &Expr, opts: &Options) -> Outcome {
    let mut names = Vec::new();
    gold.symbols(&mut names);
    let mut pred_names = Vec::new();
    pred.symbols(&mut pred_names);
    // Strict: different names are different answers (`x + 1` is not `y + 1`).
    if pred_names.iter().any(|n| !names.contains(n)) || names.iter().any(|n| !pred_names.contains(n)) {
        return Ok(false);
    }
    let mut defined = 0;
    for values in random_points(&names, 8) {
        let (a, b) = (approx(gold, &values)?, approx(pred, &values)?);
        if !a.is_finite() || !b.is_finite() {
            continue;
        }
        if !close(a, b, opts.rel_tol.max(1e-9)) {
            return Ok(false);
        }
        defined += 1;
    }
    Ok(defined >= 3)
}

/// `count` seeded assignments of values to `names`, each in [0.3, 2.3): away from 0 and 1,
/// where identities hide, and the same on every run.
fn random_points(names: &[String], count: usize) -> Vec<Vec<(String, f64)>> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..count)
        .map(|_| {
            names
                .iter()
                .map(|n| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (n.clone(), 0.3 + (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0)
                })
                .collect()
        })
        .collect()
}

/// The exact value of an expression without names, where rational arithmetic gives it:
/// `Ok(None)` when it is irrational or past `i128` (the caller evaluates in floating point).
pub fn exact(expr: &Expr) -> Result<Option<Rational>, TooLarge> {
    Ok(match expr {
        Expr::Num { value, .. } => Some(*value),
        Expr::Neg(a) => exact(a)?.and_then(Rational::checked_neg),
        Expr::Percent(a) => exact(a)?.and_then(|v| v.checked_div(Rational::int(100))),
        Expr::Add(items) => {
            let mut acc = Rational::ZERO;
            for item in items {
                match exact(item)?.and_then(|v| acc.checked_add(v)) {
                    Some(v) => acc = v,
                    None => return Ok(None),
                }
            }
            Some(acc)
        }
        Expr::Mul(items) => {
            let mut acc = Rational::ONE;
            for item in items {
                match exact(item)?.and_then(|v| acc.checked_mul(v)) {
                    Some(v) => acc = v,
                    None => return Ok(None),
                }
            }
            Some(acc)
        }
        Expr::Div(a, b) => match (exact(a)?, exact(b)?) {
            (Some(x), Some(y)) => x.checked_div(y),
            _ => None,
        },
        Expr::Pow(a, b) => match (exact(a)?, exact(b)?) {
            (Some(x), Some(y)) if y.is_integer() => x.checked_pow(y.num),
            _ => None,
        },
        Expr::Apply(Func::Factorial, a) => match exact(a)? {
            Some(n) if n.is_integer() && (0..=33).contains(&n.num) => {
                let mut acc = Rational::ONE;
                for k in 2..=n.num {
                    acc = acc.checked_mul(Rational::int(k)).expect("33! fits in i128");
                }
                Some(acc)
            }
            _ => None,
        },
        Expr::Apply(Func::Abs, a) => exact(a)?.map(|v| Rational { num: v.num.abs(), den: v.den }),
        Expr::Binom(n, k) => match (exact(n)?, exact(k)?) {
            (Some(n), Some(k)) if n.is_integer() && k.is_integer() && (0..=n.num).contains(&k.num) && n.num <= 120 => {
                let k = k.num.min(n.num - k.num);
                let mut acc = Rational::ONE;
                for i in 0..k {
                    acc = match acc
                        .checked_mul(Rational::int(n.num - i))
                        .and_then(|v| v.checked_div(Rational::int(i + 1)))
                    {
                        Some(v) => v,
                        None => return Ok(None),
                    };
                }
                Some(acc)
            }
            _ => None,
        },
        _ => None,
    })
}

/// The value of an expression in floating point, names bound by `values` (an unbound name
/// is NaN). Towers of powers are never expanded: a power whose float overflows is infinite,
/// and one whose exponent is itself huge is `TooLarge` before anything is computed.
pub fn approx(expr: &Expr, values: &[(String, f64)]) -> Result<f64, TooLarge> {
    Ok(match expr {
        Expr::Num { value, .. } => value.to_f64(),
        Expr::Float(v) => *v,
        Expr::Sym(name) => values.iter().find(|(n, _)| n == name).map_or(f64::NAN, |(_, v)| *v),
        Expr::Const(Constant::Pi) => std::f64::consts::PI,
        Expr::Const(Constant::E) => std::f64::consts::E,
        Expr::Const(Constant::Infinity) => f64::INFINITY,
        Expr::Neg(a) => -approx(a, values)?,
        Expr::Percent(a) => approx(a, values)? / 100.0,
        Expr::Add(items) => items.iter().map(|i| approx(i, values)).sum::<Result<f64, _>>()?,
        Expr::Mul(items) => items.iter().map(|i| approx(i, values)).product::<Result<f64, _>>()?,
        Expr::Div(a, b) => approx(a, values)? / approx(b, values)?,
        Expr::Pow(a, b) => {
            let (x, y) = (approx(a, values)?, approx(b, values)?);
            if y.is_infinite() && x.abs() > 1.0 {
                return Err(TooLarge("a power whose exponent is too large".into()));
            }
            x.powf(y)
        }
        Expr::Log(base, a) => approx(a, values)?.ln() / approx(base, values)?.ln(),
        Expr::Apply(f, a) => {
            let x = approx(a, values)?;
            match f {
                Func::Sin => x.sin(),
                Func::Cos => x.cos(),
                Func::Tan => x.tan(),
                Func::Cot => 1.0 / x.tan(),
                Func::Sec => 1.0 / x.cos(),
                Func::Csc => 1.0 / x.sin(),
                Func::Asin => x.asin(),
                Func::Acos => x.acos(),
                Func::Atan => x.atan(),
                Func::Sinh => x.sinh(),
                Func::Cosh => x.cosh(),
                Func::Tanh => x.tanh(),
                Func::Ln => x.ln(),
                Func::Log10 => x.log10(),
                Func::Exp => x.exp(),
                Func::Abs => x.abs(),
                Func::Floor => x.floor(),
                Func::Ceil => x.ceil(),
                Func::Factorial => {
                    if x > 170.0 {
                        return Err(TooLarge(format!("the factorial of {x}")));
                    }
                    if x < 0.0 || x.fract() != 0.0 { f64::NAN } else { (2..=x as u32).map(f64::from).product() }
                }
            }
        }
        Expr::Binom(n, k) => {
            let (n, k) = (approx(n, values)?, approx(k, values)?);
            if n > 1e6 {
                return Err(TooLarge(format!("a binomial of {n}")));
            }
            if k < 0.0 || k > n || k.fract() != 0.0 || n.fract() != 0.0 {
                f64::NAN
            } else {
                (0..k as u32).fold(1.0, |acc, i| acc * (n - f64::from(i)) / f64::from(i + 1))
            }
        }
        _ => f64::NAN,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse;

    fn same(gold: &str, pred: &str) -> bool {
        equal(&parse(gold).unwrap(), &parse(pred).unwrap(), &Options::default()).unwrap()
    }

    #[test]
    fn numbers() {
        assert!(same("\\frac{10}{9}", "10/9"));
        assert!(same("0.5", "\\frac12"));
        assert!(same("\\frac{1}{3}", "0.333333"));
        assert!(!same("\\frac{1}{3}", "0.333"));
        assert!(same("0.5", "50\\%"));
        assert!(same("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"));
        assert!(!same("2", "3"));
        assert!(same("1000", "1,000"));
    }

    #[test]
    fn expressions_by_identity() {
        assert!(same("(x+1)^2", "x^2 + 2x + 1"));
        assert!(!same("(x+1)^2", "x^2 + 1"));
        assert!(!same("x + 1", "y + 1"));
        assert!(same("\\frac{3\\pi}{4}", "0.75\\pi"));
    }

    #[test]
    fn collections() {
        assert!(same("\\{1, 2, 3\\}", "\\{3, 1, 2\\}"));
        assert!(same("(3, 37, 3, 13), (3, 17, 3, 7)", "(3, 17, 3, 7), (3, 37, 3, 13)"));
        assert!(!same("(1, 2, 3)", "(3, 2, 1)"));
        assert!(same("[1, \\infty)", "x \\in [1, \\infty)"));
        assert!(same("-793 < a < 10", "(-793, 10)"));
        assert!(same("x = 5", "5"));
        assert!(same("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1, 2)"));
        assert!(same("3 \\pm \\sqrt{2}", "3 + \\sqrt{2}, 3 - \\sqrt{2}"));
    }

    #[test]
    fn towers_are_refused_not_computed() {
        let gold = parse("9^{9^{9^{9}}}").unwrap();
        let pred = parse("9^{9^{9^{9}}} + 1").unwrap();
        assert!(equal(&gold, &gold, &Options::default()).unwrap());
        assert!(equal(&gold, &pred, &Options::default()).is_err());
    }
}
