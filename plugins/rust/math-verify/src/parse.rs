//! LaTeX and plain expressions into [`Expr`]: a tokenizer and a recursive-descent parser,
//! each one pass over the input. Bounded by construction: the input's length, the nesting
//! depth and the number of nodes are capped, and a number literal too long for exact
//! arithmetic becomes a float (or `too_large` past a cap) — nothing here can take more than
//! time linear in the answer.

use crate::expr::{Constant, Expr, Func, RelOp};
use crate::number::Rational;

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not an expression this parser reads (the message says where).
    Unparsed(String),
    /// Past a cap: length, nesting depth, node count or a number's digits.
    TooLarge(String),
}

/// Caps that keep parsing bounded.
pub const MAX_INPUT_BYTES: usize = 20_000;
/// Nesting levels (brackets, groups, fractions, powers): each is a few stack frames, and
/// the component's stack is 1 MiB (build.rs).
pub const MAX_DEPTH: usize = 100;
pub const MAX_NODES: usize = 20_000;
pub const MAX_DIGITS: usize = 400;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num {
        int: String,
        frac: String,
        decimal: bool,
    },
    /// A letter (one name: `x`), or a subscripted name once read (`a_3`).
    Letter(char),
    /// `\name`.
    Cmd(String),
    /// `\text{…}` and friends: their words.
    Text(String),
    Punct(char),
    /// `\{` and `\}`: a set's braces (plain braces only group).
    SetOpen,
    SetClose,
    /// `\\` inside a matrix.
    RowSep,
}

fn tokenize(input: &str) -> Result<Vec<Tok>, ParseError> {
    let chars: Vec<char> = input.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() || c == '~' {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            let mut int = String::new();
            while i < chars.len() && chars[i].is_ascii_digit() {
                int.push(chars[i]);
                i += 1;
            }
            // Thousands separators: `1,000,000`, `1{,}000`, `1\,000`, `1 000`, when the first
            // group has at most three digits and every later group exactly three.
            if (1..=3).contains(&int.len()) {
                while let Some(gap) = thousands_gap(&chars, i)
                    && grouped_tail(&chars, i + gap)
                {
                    int.extend(&chars[i + gap..i + gap + 3]);
                    i += gap + 3;
                }
            }
            let mut frac = String::new();
            let mut decimal = false;
            if i < chars.len() && chars[i] == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
                decimal = true;
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    frac.push(chars[i]);
                    i += 1;
                }
            }
            if int.len() + frac.len() > MAX_DIGITS {
                return Err(ParseError::TooLarge(format!("a number of {} digits", int.len() + frac.len())));
            }
            toks.push(Tok::Num { int, frac, decimal });
        } else if c.is_alphabetic() {
            toks.push(Tok::Letter(c));
            i += 1;
        } else if c == '\\' {
            i += 1;
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                // A control symbol: `\{`, `\}`, `\%`, `\,`, `\\`, `\$`.
                let Some(&sym) = chars.get(i) else { break };
                i += 1;
                match sym {
                    '{' => toks.push(Tok::SetOpen),
                    '}' => toks.push(Tok::SetClose),
                    '%' => toks.push(Tok::Punct('%')),
                    '\\' => toks.push(Tok::RowSep),
                    '|' => toks.push(Tok::Punct('|')),
                    _ => {} // spacing (`\,` `\;` `\!` `\ `) and `\$`
                }
                continue;
            }
            let name: String = chars[start..i].iter().collect();
            match name.as_str() {
                "text" | "textbf" | "textit" | "mbox" | "mathrm" | "mathbf" | "mathit" | "operatorname" | "textrm"
                | "mathnormal" | "textnormal" => {
                    let (content, next) = braced_raw(&chars, i);
                    i = next;
                    toks.push(Tok::Text(content));
                }
                "left" | "right" | "big" | "Big" | "bigg" | "Bigg" | "bigl" | "bigr" | "Bigl" | "Bigr" | "biggl"
                | "biggr" | "displaystyle" | "textstyle" | "quad" | "qquad" | "limits" | "nolimits" => {
                    // `\left.` is an invisible delimiter.
                    if (name == "left" || name == "right") && chars.get(i) == Some(&'.') {
                        i += 1;
                    }
                }
                "circ" | "degree" | "dots" | "ldots" | "cdots" | "hfill" | "boxed" | "fbox" | "dfrac" | "tfrac" => {
                    match name.as_str() {
                        "dfrac" | "tfrac" => toks.push(Tok::Cmd("frac".into())),
                        "circ" | "degree" => {
                            // `30^\circ`: a degree sign is dropped with its `^`.
                            if matches!(toks.last(), Some(Tok::Punct('^'))) {
                                toks.pop();
                            }
                        }
                        "boxed" | "fbox" => toks.push(Tok::Cmd("boxed".into())),
                        _ => toks.push(Tok::Cmd("dots".into())),
                    }
                }
                _ => toks.push(Tok::Cmd(name)),
            }
        } else {
            if c == '!' && chars.get(i + 1) == Some(&'=') {
                toks.push(Tok::Cmd("ne".into()));
                i += 2;
                continue;
            }
            match c {
                '−' | '–' => toks.push(Tok::Punct('-')),
                '×' | '·' => toks.push(Tok::Cmd("times".into())),
                '÷' => toks.push(Tok::Punct('/')),
                '≤' => toks.push(Tok::Cmd("le".into())),
                '≥' => toks.push(Tok::Cmd("ge".into())),
                '≠' => toks.push(Tok::Cmd("ne".into())),
                'π' => toks.push(Tok::Cmd("pi".into())),
                '∞' => toks.push(Tok::Cmd("infty".into())),
                '°' => {}
                '$' => return Err(ParseError::Unparsed("a `$` inside an answer".into())),
                '{' | '}' | '(' | ')' | '[' | ']' | '|' | ',' | ';' | '+' | '-' | '*' | '/' | '^' | '_' | '!' | '='
                | '<' | '>' | '&' | '%' | '\'' | ':' => toks.push(Tok::Punct(c)),
                _ => return Err(ParseError::Unparsed(format!("unexpected character {c:?}"))),
            }
            i += 1;
        }
    }
    Ok(toks)
}

/// The width of a thousands separator at `i` (`{,}`, `,\!`, `\,`, `\!`, a space), if one is
/// followed by three digits. A bare comma is not one here: inside brackets and sets it
/// separates values (`(12,102)` is a pair, as Math-Verify reads it); a whole answer that is
/// one comma-grouped number (`7,425,000`) is read as one before tokenizing.
fn thousands_gap(chars: &[char], i: usize) -> Option<usize> {
    let gap = match chars.get(i..) {
        Some([',', '\\', '!' | ' ' | ',', ' ', ..]) => 4,
        Some([',', '\\', '!' | ' ' | ',', ..]) => 3,
        Some(['{', ',', '}', ..]) => 3,
        Some(['\\', ',' | '!' | ' ', ..]) => 2,
        Some([' ', ..]) => 1,
        _ => return None,
    };
    let digits = chars.get(i + gap..i + gap + 3)?;
    digits.iter().all(char::is_ascii_digit).then_some(gap)
}

/// `7,425,000` or `-1,000.5` as a whole answer, without its commas.
fn comma_grouped_number(s: &str) -> Option<String> {
    let unsigned = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let groups: Vec<&str> = int.split(',').collect();
    let grouped = groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups[1..].iter().all(|g| g.len() == 3)
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
        && frac.bytes().all(|b| b.is_ascii_digit());
    grouped.then(|| s.replace(',', ""))
}

/// Whether three digits at `i` end a group: no fourth digit follows.
fn grouped_tail(chars: &[char], i: usize) -> bool {
    !chars.get(i + 3).is_some_and(char::is_ascii_digit)
}

/// The raw text of a `{…}` group at `i` (or of one character), and the index after it.
fn braced_raw(chars: &[char], mut i: usize) -> (String, usize) {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if chars.get(i) != Some(&'{') {
        return match chars.get(i) {
            Some(c) => (c.to_string(), i + 1),
            None => (String::new(), i),
        };
    }
    let mut depth = 0usize;
    let start = i + 1;
    while i < chars.len() {
        match chars[i] {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return (chars[start..i].iter().collect(), i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    (chars[start..].iter().collect(), chars.len())
}

/// Words dropped after a number: units and currencies (`5 \text{cm}`, `12 dollars`).
fn is_unit_word(word: &str) -> bool {
    const UNITS: &[&str] = &[
        "cm",
        "m",
        "km",
        "mm",
        "kg",
        "g",
        "mg",
        "l",
        "ml",
        "s",
        "sec",
        "second",
        "seconds",
        "min",
        "minute",
        "minutes",
        "h",
        "hr",
        "hour",
        "hours",
        "day",
        "days",
        "week",
        "weeks",
        "year",
        "years",
        "month",
        "months",
        "degree",
        "degrees",
        "unit",
        "units",
        "dollar",
        "dollars",
        "cent",
        "cents",
        "meter",
        "meters",
        "metre",
        "metres",
        "inch",
        "inches",
        "foot",
        "feet",
        "ft",
        "mile",
        "miles",
        "mph",
        "yard",
        "yards",
        "sq",
        "square",
        "cubic",
        "liter",
        "liters",
        "gallon",
        "gallons",
        "pound",
        "pounds",
        "lb",
        "lbs",
        "ounce",
        "ounces",
        "oz",
        "people",
        "students",
        "apples",
        "times",
        "ways",
        "euros",
        "euro",
        "rs",
        "rupees",
        "yuan",
        "percent",
        "centimeters",
        "kilometers",
        "millimeters",
        "grams",
        "kilograms",
        "square units",
        "sq units",
    ];
    let w = word.trim().trim_end_matches('.').to_ascii_lowercase();
    let w = w.trim_start_matches('\\').trim();
    w.is_empty()
        || UNITS.contains(&w)
        || w.split_whitespace()
            .all(|part| UNITS.contains(&part) || part.chars().all(|c| c == '^' || c.is_ascii_digit()))
}

/// Parses a LaTeX or plain answer into an expression.
pub fn parse(input: &str) -> Result<Expr, ParseError> {
    if input.len() > MAX_INPUT_BYTES {
        return Err(ParseError::TooLarge(format!("an answer of {} bytes (at most {MAX_INPUT_BYTES})", input.len())));
    }
    // A degree sign goes with its `^` (`30^{\circ}` is 30, as Math-Verify reads it).
    let mut input = input.replace("^{\\circ}", "").replace("^\\circ", "");
    // Percent written out (`28 percent`, `28 pct`) is a percent sign.
    for word in ["percentage", "percent", "pct"] {
        if input.contains(word) {
            input = input.replace(word, "\\%");
        }
    }
    if let Some(number) = comma_grouped_number(input.trim()) {
        input = number;
    }
    let toks = tokenize(&input)?;
    if toks.len() > MAX_NODES {
        return Err(ParseError::TooLarge(format!("{} tokens (at most {MAX_NODES})", toks.len())));
    }
    let mut parser = Parser { toks, pos: 0, depth: 0, nodes: 0 };
    let expr = parser.top()?;
    if parser.pos < parser.toks.len() {
        return Err(ParseError::Unparsed(format!("unexpected {:?}", parser.toks[parser.pos])));
    }
    Ok(expr)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    nodes: usize,
}

type Parsed = Result<Expr, ParseError>;

fn unparsed<T>(what: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError::Unparsed(what.into()))
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_punct(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Punct(c))
    }

    fn peek_cmd(&self, name: &str) -> bool {
        matches!(self.peek(), Some(Tok::Cmd(n)) if n == name)
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek() == Some(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn eat_punct(&mut self, c: char) -> bool {
        if self.peek_punct(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// `\\text{and}`, `\\text{ or }` between answers: a separator, as a comma.
    fn peek_separator_word(&self) -> bool {
        matches!(self.peek(), Some(Tok::Text(w)) if matches!(w.trim(), "and" | "or" | ","))
    }

    fn eat_separator_word(&mut self) -> bool {
        let yes = self.peek_separator_word();
        if yes {
            self.pos += 1;
        }
        yes
    }

    fn expect_punct(&mut self, c: char) -> Result<(), ParseError> {
        if self.eat_punct(c) { Ok(()) } else { unparsed(format!("expected {c:?} at token {}", self.pos)) }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        self.nodes += 1;
        if self.depth > MAX_DEPTH {
            return Err(ParseError::TooLarge(format!("nesting deeper than {MAX_DEPTH}")));
        }
        if self.nodes > MAX_NODES {
            return Err(ParseError::TooLarge(format!("more than {MAX_NODES} nodes")));
        }
        Ok(())
    }

    fn leave<T>(&mut self, result: T) -> T {
        self.depth -= 1;
        result
    }

    /// A whole answer: one relation, or several separated by commas or semicolons (a set,
    /// as Math-Verify reads `1, 2` and `(1,2), (3,4)`).
    fn top(&mut self) -> Parsed {
        if self.peek().is_none() {
            return unparsed("an empty answer");
        }
        let first = self.relation()?;
        if !(self.peek_punct(',') || self.peek_punct(';') || self.peek_separator_word()) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat_punct(',') || self.eat_punct(';') || self.eat_separator_word() {
            if self.peek().is_none() {
                break;
            }
            items.push(self.relation()?);
        }
        Ok(Expr::Set(items))
    }

    /// `a`, `a = b`, `a < b \le c`, `x \in S`.
    fn relation(&mut self) -> Parsed {
        let first = self.union()?;
        if self.peek_cmd("in") {
            self.pos += 1;
            let set = self.union()?;
            return Ok(Expr::In(Box::new(first), Box::new(set)));
        }
        let mut items = vec![first];
        let mut ops = Vec::new();
        while let Some(op) = self.rel_op() {
            ops.push(op);
            items.push(self.union()?);
        }
        if ops.is_empty() { Ok(items.pop().expect("one item")) } else { Ok(Expr::Rel(items, ops)) }
    }

    fn rel_op(&mut self) -> Option<RelOp> {
        let op = match self.peek()? {
            Tok::Punct('=') => RelOp::Eq,
            Tok::Punct('<') => {
                if self.toks.get(self.pos + 1) == Some(&Tok::Punct('=')) {
                    self.pos += 1;
                    RelOp::Le
                } else {
                    RelOp::Lt
                }
            }
            Tok::Punct('>') => {
                if self.toks.get(self.pos + 1) == Some(&Tok::Punct('=')) {
                    self.pos += 1;
                    RelOp::Ge
                } else {
                    RelOp::Gt
                }
            }
            Tok::Cmd(name) => match name.as_str() {
                "le" | "leq" | "leqslant" | "leqq" => RelOp::Le,
                "ge" | "geq" | "geqslant" | "geqq" => RelOp::Ge,
                "lt" => RelOp::Lt,
                "gt" => RelOp::Gt,
                "ne" | "neq" => RelOp::Ne,
                "approx" | "equiv" | "eq" => RelOp::Eq,
                _ => return None,
            },
            _ => return None,
        };
        self.pos += 1;
        Some(op)
    }

    /// `A \cup B`.
    fn union(&mut self) -> Parsed {
        let first = self.additive()?;
        if !self.peek_cmd("cup") {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.peek_cmd("cup") {
            self.pos += 1;
            parts.push(self.additive()?);
        }
        Ok(Expr::Union(parts))
    }

    fn additive(&mut self) -> Parsed {
        let mut terms = Vec::new();
        let mut first = true;
        loop {
            let negative = if self.eat_punct('-') {
                true
            } else if self.eat_punct('+') {
                false
            } else if self.peek_cmd("pm") && !first {
                self.pos += 1;
                let rest = self.multiplicative()?;
                let base = sum(std::mem::take(&mut terms));
                terms.push(Expr::PlusMinus(Box::new(base), Box::new(rest)));
                continue;
            } else if self.peek_cmd("mp") && !first {
                self.pos += 1;
                let rest = self.multiplicative()?;
                let base = sum(std::mem::take(&mut terms));
                terms.push(Expr::PlusMinus(Box::new(base), Box::new(Expr::Neg(Box::new(rest)))));
                continue;
            } else if first {
                if self.peek_cmd("pm") {
                    // `\pm 3`: both signs of one value.
                    self.pos += 1;
                    let value = self.multiplicative()?;
                    terms.push(Expr::PlusMinus(Box::new(Expr::int(0)), Box::new(value)));
                    first = false;
                    continue;
                }
                false
            } else {
                break;
            };
            if !first && !negative && terms.is_empty() {
                break;
            }
            let term = self.multiplicative()?;
            terms.push(if negative { Expr::Neg(Box::new(term)) } else { term });
            first = false;
        }
        if terms.is_empty() {
            return unparsed(format!("expected a value at token {}", self.pos));
        }
        Ok(sum(terms))
    }

    fn multiplicative(&mut self) -> Parsed {
        let mut acc = self.power()?;
        loop {
            if self.eat_punct('*') || self.peek_cmd("cdot") || self.peek_cmd("times") || self.peek_cmd("ast") {
                if matches!(self.peek(), Some(Tok::Cmd(_))) {
                    self.pos += 1;
                }
                let rhs = self.power()?;
                acc = product(acc, rhs);
            } else if self.eat_punct('/') || self.eat_punct(':') || self.peek_cmd("div") {
                if self.peek_cmd("div") {
                    self.pos += 1;
                }
                let rhs = self.power()?;
                acc = Expr::Div(Box::new(acc), Box::new(rhs));
            } else if self.starts_factor() {
                // Juxtaposition: `2x`, `2\pi`, `x(y+1)`, `\sqrt{2}\sqrt{3}`.
                let rhs = self.power()?;
                acc = product(acc, rhs);
            } else {
                return Ok(acc);
            }
        }
    }

    /// Whether the next token can begin a factor of an implicit product.
    fn starts_factor(&self) -> bool {
        match self.peek() {
            Some(Tok::Num { .. } | Tok::Letter(_)) => true,
            Some(Tok::Punct('(' | '{')) => true,
            Some(Tok::Punct('[')) => false,
            Some(Tok::Cmd(name)) => !matches!(
                name.as_str(),
                "le" | "leq"
                    | "leqslant"
                    | "leqq"
                    | "ge"
                    | "geq"
                    | "geqslant"
                    | "geqq"
                    | "lt"
                    | "gt"
                    | "ne"
                    | "neq"
                    | "approx"
                    | "equiv"
                    | "eq"
                    | "in"
                    | "cup"
                    | "pm"
                    | "mp"
                    | "cdot"
                    | "times"
                    | "div"
                    | "ast"
                    | "end"
                    | "dots"
                    | "to"
                    | "rightarrow"
                    | "implies"
                    | "quad"
            ),
            _ => false,
        }
    }

    /// A factor with its postfixes: `x^2`, `n!`, `50\%`.
    fn power(&mut self) -> Parsed {
        let mut base = self.primary()?;
        loop {
            if self.eat_punct('^') {
                let exponent = self.group_or_atom()?;
                base = Expr::Pow(Box::new(base), Box::new(exponent));
            } else if self.eat_punct('!') {
                base = Expr::Apply(Func::Factorial, Box::new(base));
            } else if self.eat_punct('%') {
                base = Expr::Percent(Box::new(base));
            } else if self.peek_punct('\'') {
                // A prime is part of a name (`f'`); kept as a distinct symbol.
                self.pos += 1;
                base = match base {
                    Expr::Sym(name) => Expr::Sym(format!("{name}'")),
                    other => return unparsed(format!("a prime after {other:?}")),
                };
            } else if let Some(Tok::Text(word)) = self.peek()
                && is_unit_word(word)
            {
                self.pos += 1;
            } else {
                return Ok(base);
            }
        }
    }

    /// The argument of `^`, `_`, `\frac`, `\sqrt`: a `{…}` group, or a single token (one
    /// digit of a number: `\frac12`, `x^23` is `x^2 · 3` in LaTeX).
    fn group_or_atom(&mut self) -> Parsed {
        if self.eat_punct('{') {
            let inner = self.top()?;
            self.expect_punct('}')?;
            return Ok(inner);
        }
        match self.peek().cloned() {
            Some(Tok::Num { int, frac, decimal }) if !decimal && int.len() > 1 => {
                // One digit binds; the rest stays for what follows.
                let (first, rest) = int.split_at(1);
                self.toks[self.pos] = Tok::Num { int: rest.to_string(), frac, decimal };
                Ok(Expr::int(i128::from(first.as_bytes()[0] - b'0')))
            }
            Some(Tok::Punct('-')) => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.group_or_atom()?)))
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Parsed {
        self.enter()?;
        let result = self.primary_inner();
        self.leave(result)
    }

    fn primary_inner(&mut self) -> Parsed {
        let Some(tok) = self.peek().cloned() else { return unparsed("the answer ends early") };
        self.pos += 1;
        match tok {
            Tok::Num { int, frac, decimal } => Ok(number(&int, &frac, decimal)),
            Tok::Letter(c) => {
                let name = self.word_from(c);
                self.subscripted(name)
            }
            Tok::Text(words) => self.text(words),
            Tok::Punct('(') => self.bracketed('(', ')'),
            Tok::Punct('[') => self.bracketed('[', ']'),
            Tok::Punct('{') => {
                let inner = if self.peek_punct('}') { Expr::Set(Vec::new()) } else { self.top()? };
                self.expect_punct('}')?;
                Ok(inner)
            }
            Tok::SetOpen => {
                let mut items = Vec::new();
                if !self.eat(&Tok::SetClose) {
                    loop {
                        items.push(self.relation()?);
                        if self.eat(&Tok::SetClose) {
                            break;
                        }
                        if !(self.eat_punct(',') || self.eat_punct(';')) {
                            return unparsed("expected ',' or '\\}' in a set");
                        }
                    }
                }
                Ok(Expr::Set(items))
            }
            Tok::Punct('|') => {
                let inner = self.additive()?;
                self.expect_punct('|')?;
                Ok(Expr::Apply(Func::Abs, Box::new(inner)))
            }
            Tok::Punct('-') => Ok(Expr::Neg(Box::new(self.power()?))),
            Tok::Cmd(name) => self.command(&name),
            other => unparsed(format!("unexpected {other:?}")),
        }
    }

    /// A plain-text function name spelled out (`sin x`, `log(2)`, `sqrt(2)`), else one letter.
    fn word_from(&mut self, first: char) -> String {
        const WORDS: &[&str] = &["sqrt", "sin", "cos", "tan", "log", "ln", "exp", "pi", "infty", "inf", "oo"];
        let mut word = first.to_string();
        let mut end = self.pos;
        while let Some(Tok::Letter(c)) = self.toks.get(end) {
            word.push(*c);
            end += 1;
            if word.len() > 6 {
                break;
            }
        }
        for known in WORDS {
            if word.starts_with(known) {
                self.pos += known.len() - 1;
                return format!("\\{known}");
            }
        }
        first.to_string()
    }

    fn subscripted(&mut self, name: String) -> Parsed {
        if let Some(cmd) = name.strip_prefix('\\') {
            return self.command(cmd);
        }
        if self.eat_punct('_') {
            let sub = self.subscript_text()?;
            return Ok(Expr::Sym(format!("{name}_{sub}")));
        }
        Ok(match name.as_str() {
            "e" => Expr::Const(Constant::E),
            _ => Expr::Sym(name),
        })
    }

    /// A subscript as text (`3`, `37`, `n+1`, `\max`) — names only, never evaluated.
    fn subscript_text(&mut self) -> Result<String, ParseError> {
        let mut text = String::new();
        let grouped = self.eat_punct('{');
        let mut depth = 0usize;
        while let Some(tok) = self.peek().cloned() {
            if grouped && depth == 0 && tok == Tok::Punct('}') {
                self.pos += 1;
                break;
            }
            self.pos += 1;
            match tok {
                Tok::Num { int, frac, decimal } => {
                    if !grouped {
                        // `a_37` in LaTeX is `a_3 · 7`; keep it as written, the common intent.
                        text.push_str(&int);
                        if decimal {
                            text.push('.');
                            text.push_str(&frac);
                        }
                        break;
                    }
                    text.push_str(&int);
                }
                Tok::Letter(c) => text.push(c),
                Tok::Cmd(n) => text.push_str(&n),
                Tok::Punct(c) => {
                    match c {
                        '{' => depth += 1,
                        '}' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    text.push(c);
                }
                Tok::Text(t) => text.push_str(&t),
                Tok::SetOpen => text.push('{'),
                Tok::SetClose => text.push('}'),
                Tok::RowSep => return unparsed("a row break in a subscript"),
            }
            if !grouped {
                break;
            }
        }
        Ok(text)
    }

    fn text(&mut self, words: String) -> Parsed {
        let trimmed = words.trim();
        // `\text{or}`/`\text{and}` between answers is a separator, as a comma.
        if trimmed.is_empty() || is_unit_word(trimmed) {
            return if self.peek().is_some() { self.primary() } else { Ok(Expr::Text(String::new())) };
        }
        // `\mathrm{cm}` style names and `\operatorname{lcm}` become symbols when one word.
        if trimmed.chars().all(|c| c.is_ascii_alphabetic()) && trimmed.len() == 1 {
            return self.subscripted(trimmed.to_string());
        }
        Ok(Expr::Text(trimmed.to_lowercase()))
    }

    /// After an opening bracket: a parenthesised value, a tuple, a pair or an interval.
    fn bracketed(&mut self, open: char, close: char) -> Parsed {
        if self.eat_punct(close) {
            return Ok(Expr::Tuple(Vec::new()));
        }
        let mut items = vec![self.relation()?];
        // `(0;0;0)` is a triple as `(0,0,0)` is.
        while self.eat_punct(',') || self.eat_punct(';') {
            items.push(self.relation()?);
        }
        let closer = match self.peek() {
            Some(Tok::Punct(c @ (')' | ']'))) => *c,
            _ => return unparsed(format!("an unclosed {open:?}")),
        };
        self.pos += 1;
        if items.len() == 1 {
            if open == '(' && closer == ')' || open == '[' && closer == ']' {
                return Ok(items.pop().expect("one item"));
            }
            return unparsed("a bracket closed by another");
        }
        if items.len() == 2 {
            let hi = items.pop().expect("two");
            let lo = items.pop().expect("two");
            if open == '(' && closer == ')' {
                return Ok(Expr::Pair(Box::new(lo), Box::new(hi)));
            }
            return Ok(Expr::Interval {
                lo: Box::new(lo),
                hi: Box::new(hi),
                lo_open: open == '(',
                hi_open: closer == ')',
            });
        }
        if open == '(' && closer == ')' || open == '[' && closer == ']' {
            Ok(Expr::Tuple(items))
        } else {
            unparsed("a bracket closed by another")
        }
    }

    fn command(&mut self, name: &str) -> Parsed {
        let applied = match name {
            "sin" => Some(Func::Sin),
            "cos" => Some(Func::Cos),
            "tan" => Some(Func::Tan),
            "cot" => Some(Func::Cot),
            "sec" => Some(Func::Sec),
            "csc" => Some(Func::Csc),
            "arcsin" => Some(Func::Asin),
            "arccos" => Some(Func::Acos),
            "arctan" => Some(Func::Atan),
            "sinh" => Some(Func::Sinh),
            "cosh" => Some(Func::Cosh),
            "tanh" => Some(Func::Tanh),
            "ln" => Some(Func::Ln),
            "exp" => Some(Func::Exp),
            "lfloor" => return self.delimited("rfloor", Func::Floor),
            "lceil" => return self.delimited("rceil", Func::Ceil),
            _ => None,
        };
        if let Some(f) = applied {
            // `\sin^2 x` is `(\sin x)^2`.
            let power = if self.eat_punct('^') { Some(self.group_or_atom()?) } else { None };
            let arg = self.function_argument()?;
            let applied = Expr::Apply(f, Box::new(arg));
            return Ok(match power {
                Some(p) => Expr::Pow(Box::new(applied), Box::new(p)),
                None => applied,
            });
        }
        match name {
            "frac" | "cfrac" => {
                let num = self.group_or_atom()?;
                let den = self.group_or_atom()?;
                Ok(Expr::Div(Box::new(num), Box::new(den)))
            }
            "binom" | "dbinom" | "tbinom" | "choose" => {
                let n = self.group_or_atom()?;
                let k = self.group_or_atom()?;
                Ok(Expr::Binom(Box::new(n), Box::new(k)))
            }
            "sqrt" => {
                let index = if self.eat_punct('[') {
                    let index = self.additive()?;
                    self.expect_punct(']')?;
                    Some(index)
                } else {
                    None
                };
                let radicand = if self.peek_punct('(') { self.primary()? } else { self.group_or_atom()? };
                let exponent = match index {
                    Some(n) => Expr::Div(Box::new(Expr::int(1)), Box::new(n)),
                    None => Expr::Num { value: Rational::new(1, 2).expect("1/2"), decimal: false },
                };
                Ok(Expr::Pow(Box::new(radicand), Box::new(exponent)))
            }
            "log" | "lg" => {
                let base = if self.eat_punct('_') { Some(self.group_or_atom()?) } else { None };
                let arg = self.function_argument()?;
                Ok(match base {
                    Some(b) => Expr::Log(Box::new(b), Box::new(arg)),
                    // Math-Verify (sympy) reads a bare `\log` as the natural logarithm.
                    None => Expr::Apply(Func::Ln, Box::new(arg)),
                })
            }
            "pi" => Ok(Expr::Const(Constant::Pi)),
            "infty" | "inf" | "oo" | "infinity" => Ok(Expr::Const(Constant::Infinity)),
            "emptyset" | "varnothing" => Ok(Expr::Set(Vec::new())),
            "boxed" => {
                let inner = self.group_or_atom()?;
                Ok(inner)
            }
            "begin" => self.environment(),
            // `\mathbb{R}`: a named set, compared by its name.
            "mathbb" => Ok(Expr::Text(format!("mathbb {}", self.word_group()?.to_lowercase()))),
            "alpha" | "beta" | "gamma" | "delta" | "epsilon" | "varepsilon" | "zeta" | "eta" | "theta" | "vartheta"
            | "iota" | "kappa" | "lambda" | "mu" | "nu" | "xi" | "rho" | "sigma" | "tau" | "upsilon" | "phi"
            | "varphi" | "chi" | "psi" | "omega" | "Gamma" | "Delta" | "Theta" | "Lambda" | "Xi" | "Pi" | "Sigma"
            | "Phi" | "Psi" | "Omega" => self.subscripted(name.to_string()),
            "dots" => unparsed("an ellipsis"),
            other => unparsed(format!("the command \\{other}")),
        }
    }

    /// `\lfloor x \rfloor`.
    fn delimited(&mut self, close: &str, func: Func) -> Parsed {
        let inner = self.additive()?;
        if !self.peek_cmd(close) {
            return unparsed(format!("expected \\{close}"));
        }
        self.pos += 1;
        Ok(Expr::Apply(func, Box::new(inner)))
    }

    /// What a function applies to: `(x)`, `{x}`, or the next factor (`\sin x`, `\ln 2`).
    fn function_argument(&mut self) -> Parsed {
        if self.peek_punct('(') || self.peek_punct('{') {
            return self.primary();
        }
        self.power()
    }

    /// `\begin{pmatrix} … \end{pmatrix}` (and bmatrix, matrix, array, cases as rows).
    fn environment(&mut self) -> Parsed {
        let kind = self.word_group()?;
        if kind == "array" && self.peek_punct('{') {
            self.word_group()?; // the column spec
        }
        let mut rows: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            if self.peek_cmd("end") {
                self.pos += 1;
                let end = self.word_group()?;
                if end != kind {
                    return unparsed(format!("\\begin{{{kind}}} closed by \\end{{{end}}}"));
                }
                break;
            }
            if self.peek().is_none() {
                return unparsed(format!("\\begin{{{kind}}} never ends"));
            }
            if matches!(self.peek(), Some(Tok::RowSep)) {
                self.pos += 1;
                rows.push(Vec::new());
                continue;
            }
            if self.eat_punct('&') {
                continue;
            }
            let cell = self.relation()?;
            rows.last_mut().expect("a row").push(cell);
        }
        if rows.last().is_some_and(Vec::is_empty) {
            rows.pop();
        }
        if !kind.ends_with("matrix") && kind != "array" {
            return unparsed(format!("the environment {kind}"));
        }
        let width = rows.first().map_or(0, Vec::len);
        if width == 0 || rows.iter().any(|r| r.len() != width) {
            return unparsed("a matrix with rows of different lengths");
        }
        Ok(Expr::Matrix(rows))
    }

    /// `{name}` as plain letters.
    fn word_group(&mut self) -> Result<String, ParseError> {
        self.expect_punct('{')?;
        let mut word = String::new();
        while let Some(tok) = self.peek().cloned() {
            self.pos += 1;
            match tok {
                Tok::Punct('}') => return Ok(word),
                Tok::Letter(c) | Tok::Punct(c) => word.push(c),
                Tok::Num { int, .. } => word.push_str(&int),
                _ => {}
            }
        }
        unparsed("an unclosed group")
    }
}

fn number(int: &str, frac: &str, decimal: bool) -> Expr {
    let int = if int.is_empty() { "0" } else { int };
    match Rational::from_decimal(int, frac) {
        Some(value) => Expr::Num { value, decimal },
        None => {
            Expr::Float(format!("{int}.{}", if frac.is_empty() { "0" } else { frac }).parse().unwrap_or(f64::INFINITY))
        }
    }
}

fn sum(mut terms: Vec<Expr>) -> Expr {
    if terms.len() == 1 { terms.pop().expect("one") } else { Expr::Add(terms) }
}

fn product(acc: Expr, rhs: Expr) -> Expr {
    match acc {
        Expr::Mul(mut items) => {
            items.push(rhs);
            Expr::Mul(items)
        }
        other => Expr::Mul(vec![other, rhs]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Expr {
        parse(s).unwrap_or_else(|e| panic!("{s}: {e:?}"))
    }

    #[test]
    fn numbers_with_separators_and_decimals() {
        assert_eq!(ok("7,425,000"), Expr::int(7_425_000));
        assert!(matches!(ok("(12,102)"), Expr::Pair(..)));
        assert_eq!(ok("1{,}000"), Expr::int(1000));
        assert_eq!(ok("1\\,000"), Expr::int(1000));
        assert_eq!(ok(".4"), Expr::Num { value: Rational::new(2, 5).unwrap(), decimal: true });
        assert!(matches!(ok("1,2"), Expr::Set(items) if items.len() == 2));
        assert!(matches!(ok("(3, 17, 3, 7)"), Expr::Tuple(items) if items.len() == 4));
    }

    #[test]
    fn structures() {
        assert!(matches!(ok("\\frac{10}{9}"), Expr::Div(..)));
        assert!(matches!(ok("\\frac12"), Expr::Div(..)));
        assert!(matches!(ok("[1, \\infty)"), Expr::Interval { lo_open: false, hi_open: true, .. }));
        assert!(matches!(ok("(1,2)"), Expr::Pair(..)));
        assert!(matches!(ok("\\{1,2\\}"), Expr::Set(items) if items.len() == 2));
        assert!(
            matches!(ok("1 \\leq |z| \\leq \\frac{3}{2}"), Expr::Rel(items, ops) if items.len() == 3 && ops == vec![RelOp::Le, RelOp::Le])
        );
        assert!(matches!(ok("x \\in [1, 2)"), Expr::In(..)));
        assert!(
            matches!(ok("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"), Expr::Matrix(rows) if rows.len() == 2)
        );
        assert!(matches!(ok("a_{37} = 19"), Expr::Rel(..)));
        assert!(matches!(ok("3 \\pm \\sqrt{2}"), Expr::PlusMinus(..)));
        assert!(matches!(ok("50\\%"), Expr::Percent(..)));
        assert_eq!(ok("30^\\circ"), Expr::int(30));
        assert_eq!(ok("5 \\text{ cm}"), Expr::int(5));
    }

    #[test]
    fn caps_refuse_instead_of_working() {
        let deep = "\\frac{".repeat(10_000) + "1" + &"}{2}".repeat(10_000);
        assert!(matches!(parse(&deep), Err(ParseError::TooLarge(_))));
        assert!(matches!(parse(&"9".repeat(1_000_000)), Err(ParseError::TooLarge(_))));
        assert!(matches!(parse(&"(".repeat(5000)), Err(ParseError::TooLarge(_))));
        assert!(matches!(parse("\\frac{1}{"), Err(ParseError::Unparsed(_))));
    }
}
