//! The expression tree answers are parsed into: numbers are exact where they can be, and
//! every collection (sets, tuples, intervals, matrices, relations) is its own variant so that
//! comparison can treat each as Math-Verify does.

use crate::number::Rational;

/// A relation between two neighbours of a chain (`a < b \le c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl RelOp {
    /// The same relation read right to left (`a < b` is `b > a`).
    pub fn flipped(self) -> RelOp {
        match self {
            RelOp::Lt => RelOp::Gt,
            RelOp::Le => RelOp::Ge,
            RelOp::Gt => RelOp::Lt,
            RelOp::Ge => RelOp::Le,
            other => other,
        }
    }

    pub fn is_order(self) -> bool {
        matches!(self, RelOp::Lt | RelOp::Le | RelOp::Gt | RelOp::Ge)
    }
}

/// A function applied to one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Cot,
    Sec,
    Csc,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Ln,
    Log10,
    Exp,
    Abs,
    Factorial,
    Floor,
    Ceil,
}

/// A constant with a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constant {
    Pi,
    E,
    Infinity,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number; `decimal` when it was written with a decimal point (Math-Verify
    /// compares those rounded, as floats).
    Num {
        value: Rational,
        decimal: bool,
    },
    /// A number literal too long for exact arithmetic, kept as a float.
    Float(f64),
    Sym(String),
    Const(Constant),
    Neg(Box<Expr>),
    Add(Vec<Expr>),
    Mul(Vec<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    /// `log_b(x)`: base, argument.
    Log(Box<Expr>, Box<Expr>),
    Apply(Func, Box<Expr>),
    Binom(Box<Expr>, Box<Expr>),
    /// `x\%`: x / 100, remembered as a percentage.
    Percent(Box<Expr>),
    /// `a \pm b`: both `a + b` and `a - b`.
    PlusMinus(Box<Expr>, Box<Expr>),
    Tuple(Vec<Expr>),
    Set(Vec<Expr>),
    /// `(a, b)` written with round brackets: a point or an open interval, told apart by what
    /// it is compared with.
    Pair(Box<Expr>, Box<Expr>),
    Interval {
        lo: Box<Expr>,
        hi: Box<Expr>,
        lo_open: bool,
        hi_open: bool,
    },
    Union(Vec<Expr>),
    Matrix(Vec<Vec<Expr>>),
    /// A chain `a op b op c`: operands, and the relations between neighbours.
    Rel(Vec<Expr>, Vec<RelOp>),
    /// `x \in S`.
    In(Box<Expr>, Box<Expr>),
    Text(String),
}

impl Expr {
    pub fn int(n: i128) -> Expr {
        Expr::Num { value: Rational::int(n), decimal: false }
    }

    pub fn is_relation(&self) -> bool {
        matches!(self, Expr::Rel(..))
    }

    /// An equation: a chain whose relations are all `=`.
    pub fn is_equation(&self) -> bool {
        matches!(self, Expr::Rel(_, ops) if ops.iter().all(|op| *op == RelOp::Eq))
    }

    /// `x = …`, `f(x) = …`, `(p, q) = …`, `|AB| = …`: an equation whose left side is made of
    /// names only (Math-Verify's `is_expr_of_only_symbols`).
    pub fn is_assignment(&self) -> bool {
        match self {
            Expr::Rel(items, ops) => ops.iter().all(|op| *op == RelOp::Eq) && items[0].is_names_only(),
            _ => false,
        }
    }

    /// Names and operations on them, no numbers.
    pub fn is_names_only(&self) -> bool {
        let mut numbers = false;
        self.visit(&mut |e| numbers |= matches!(e, Expr::Num { .. } | Expr::Float(_) | Expr::Const(_) | Expr::Text(_)));
        !numbers && self.has_symbols()
    }

    pub fn is_collection(&self) -> bool {
        matches!(
            self,
            Expr::Tuple(_) | Expr::Set(_) | Expr::Pair(..) | Expr::Interval { .. } | Expr::Union(_) | Expr::Matrix(_)
        )
    }

    /// Whether any name occurs in it.
    pub fn has_symbols(&self) -> bool {
        let mut found = false;
        self.visit(&mut |e| found |= matches!(e, Expr::Sym(_)));
        found
    }

    /// Every name in it, once each, in order of first appearance.
    pub fn symbols(&self, into: &mut Vec<String>) {
        self.visit(&mut |e| {
            if let Expr::Sym(name) = e
                && !into.contains(name)
            {
                into.push(name.clone());
            }
        });
    }

    /// Calls `f` on this node and every node below it.
    pub fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Num { .. } | Expr::Float(_) | Expr::Sym(_) | Expr::Const(_) | Expr::Text(_) => {}
            Expr::Neg(a) | Expr::Apply(_, a) | Expr::Percent(a) => a.visit(f),
            Expr::Div(a, b)
            | Expr::Pow(a, b)
            | Expr::Log(a, b)
            | Expr::Binom(a, b)
            | Expr::PlusMinus(a, b)
            | Expr::Pair(a, b)
            | Expr::In(a, b)
            | Expr::Interval { lo: a, hi: b, .. } => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Add(items) | Expr::Mul(items) | Expr::Tuple(items) | Expr::Set(items) | Expr::Union(items) => {
                items.iter().for_each(|i| i.visit(f))
            }
            Expr::Rel(items, _) => items.iter().for_each(|i| i.visit(f)),
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|i| i.visit(f)),
        }
    }
}
