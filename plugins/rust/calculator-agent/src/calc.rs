//! The calculator: integer `+ - * /` with parentheses and the usual precedence. Overflow,
//! division by zero and malformed input are errors, never panics.

/// The value of `expression`.
pub fn evaluate(expression: &str) -> Result<i64, String> {
    let tokens = tokenize(expression)?;
    if tokens.len() > 256 {
        return Err("the expression is too long".into());
    }
    let mut parser = Parser { tokens, at: 0, depth: 0 };
    let value = parser.sum()?;
    if parser.at != parser.tokens.len() {
        return Err(format!("unexpected {:?}", parser.tokens[parser.at]));
    }
    Ok(value)
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(i64),
    Op(char),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_digit() {
            let mut value: i64 = 0;
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                value = value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(i64::from(d as u8 - b'0')))
                    .ok_or("number too large")?;
                chars.next();
            }
            tokens.push(Token::Number(value));
        } else if "+-*/()".contains(c) {
            tokens.push(Token::Op(c));
            chars.next();
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: u32,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn sum(&mut self) -> Result<i64, String> {
        let mut value = self.product()?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.at += 1;
            let right = self.product()?;
            value = if op == '+' { value.checked_add(right) } else { value.checked_sub(right) }.ok_or("overflow")?;
        }
        Ok(value)
    }

    fn product(&mut self) -> Result<i64, String> {
        let mut value = self.atom()?;
        while let Some(Token::Op(op @ ('*' | '/'))) = self.peek().cloned() {
            self.at += 1;
            let right = self.atom()?;
            value = if op == '*' {
                value.checked_mul(right).ok_or("overflow")?
            } else {
                value.checked_div(right).ok_or("division by zero")?
            };
        }
        Ok(value)
    }

    fn atom(&mut self) -> Result<i64, String> {
        match self.peek().cloned() {
            Some(Token::Number(n)) => {
                self.at += 1;
                Ok(n)
            }
            Some(Token::Op('-')) => {
                self.at += 1;
                self.atom()?.checked_neg().ok_or_else(|| "overflow".to_string())
            }
            Some(Token::Op('(')) => {
                self.depth += 1;
                if self.depth > 32 {
                    return Err("too deeply nested".into());
                }
                self.at += 1;
                let value = self.sum()?;
                if self.peek() != Some(&Token::Op(')')) {
                    return Err("missing )".into());
                }
                self.at += 1;
                self.depth -= 1;
                Ok(value)
            }
            Some(other) => Err(format!("unexpected {other:?}")),
            None => Err("the expression ends early".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::evaluate;

    #[test]
    fn arithmetic_with_precedence_and_errors() {
        assert_eq!(evaluate("12 + 3 * 4"), Ok(24));
        assert_eq!(evaluate("(12 + 3) * 4"), Ok(60));
        assert_eq!(evaluate("-5 - -5"), Ok(0));
        assert_eq!(evaluate("7 / 2"), Ok(3));
        assert!(evaluate("1 / 0").is_err());
        assert!(evaluate("9223372036854775807 + 1").is_err());
        assert!(evaluate("99999999999999999999").is_err());
        assert!(evaluate("2 +").is_err());
        assert!(evaluate("(((1)").is_err());
        assert!(evaluate("import os").is_err());
        assert!(evaluate(&"(".repeat(100)).is_err());
    }
}
