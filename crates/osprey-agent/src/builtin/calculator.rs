//! `calculator`: arithmetic done exactly, not by the model. Numbers are arbitrary-precision
//! fractions, so `0.1 + 0.2` is `0.3` and `1/3 * 3` is `1`; `+ - * / % ^`, parentheses and
//! unary minus, with `^` taking whole exponents. A result that is not a whole or finite
//! decimal is also given as a fraction (`1/3 ≈ 0.333333333333`).

use futures_util::future::BoxFuture;
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};
use serde_json::{Value, json};

use crate::tool::{Tool, ToolError, ToolSpec};

/// Longest expression accepted, in bytes.
const MAX_LEN: usize = 1_000;
/// Largest exponent, so that a result stays a size a person can read.
const MAX_EXPONENT: u32 = 4_096;

/// The calculator tool.
pub struct Calculator {
    spec: ToolSpec,
}

impl Default for Calculator {
    fn default() -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": MAX_LEN,
                "description": "Arithmetic such as (2 + 3) * 4.5 / 7 or 2^64 - 1"}},
            "required": ["expression"],
            "additionalProperties": false
        });
        Self {
            spec: ToolSpec::new(
                "calculator",
                "Evaluates an arithmetic expression exactly: + - * / % ^ and parentheses.",
                parameters,
            ),
        }
    }
}

impl Tool for Calculator {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn call(&self, arguments: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        let expression = arguments["expression"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Box::pin(async move {
            evaluate(&expression)
                .map(|v| show(&v))
                .map_err(ToolError::fatal)
        })
    }
}

/// The exact value of `expression`.
pub fn evaluate(expression: &str) -> Result<BigRational, String> {
    if expression.len() > MAX_LEN {
        return Err(format!("the expression is longer than {MAX_LEN} bytes"));
    }
    let tokens = lex(expression)?;
    let mut parser = Parser { tokens, at: 0 };
    let value = parser.expr(0)?;
    match parser.tokens.get(parser.at) {
        None => Ok(value),
        Some(t) => Err(format!("unexpected `{}`", t.text())),
    }
}

/// A value as text: an integer, a finite decimal, or a fraction with its approximation.
pub fn show(v: &BigRational) -> String {
    if v.is_integer() {
        return v.to_integer().to_string();
    }
    // A finite decimal when the denominator has no prime factors but 2 and 5.
    let mut d = v.denom().clone();
    let (two, five) = (BigInt::from(2), BigInt::from(5));
    let mut places = 0usize;
    let (mut twos, mut fives) = (0usize, 0usize);
    while (&d % &two).is_zero() {
        d /= &two;
        twos += 1;
    }
    while (&d % &five).is_zero() {
        d /= &five;
        fives += 1;
    }
    if d.is_one() {
        places = twos.max(fives);
    }
    if places > 0 && places <= 60 {
        return decimal(v, places);
    }
    format!("{}/{} ≈ {}", v.numer(), v.denom(), decimal(v, 12))
}

fn decimal(v: &BigRational, places: usize) -> String {
    let scale = BigInt::from(10).pow(places as u32);
    let scaled = (v * BigRational::from_integer(scale.clone()))
        .round()
        .to_integer();
    let negative = scaled.is_negative();
    let digits = scaled.abs().to_string();
    let digits = format!("{digits:0>width$}", width = places + 1);
    let (int, frac) = digits.split_at(digits.len() - places);
    let frac = frac.trim_end_matches('0');
    let sign = if negative { "-" } else { "" };
    match frac.is_empty() {
        true => format!("{sign}{int}"),
        false => format!("{sign}{int}.{frac}"),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Num(BigRational),
    Op(char),
    Open,
    Close,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Num(n) => show(n),
            Token::Op(c) => c.to_string(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
        }
    }
}

fn lex(s: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() || c == '_' => i += 1,
            '0'..='9' | '.' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_digit() || chars[i] == '.' || chars[i] == '_')
                {
                    i += 1;
                }
                let text: String = chars[start..i].iter().filter(|c| **c != '_').collect();
                out.push(Token::Num(number(&text)?));
            }
            '+' | '-' | '*' | '/' | '%' | '^' => {
                out.push(Token::Op(c));
                i += 1;
            }
            '×' => {
                out.push(Token::Op('*'));
                i += 1;
            }
            '÷' => {
                out.push(Token::Op('/'));
                i += 1;
            }
            '(' => {
                out.push(Token::Open);
                i += 1;
            }
            ')' => {
                out.push(Token::Close);
                i += 1;
            }
            other => return Err(format!("unexpected character `{other}`")),
        }
    }
    Ok(out)
}

fn number(text: &str) -> Result<BigRational, String> {
    let bad = || format!("`{text}` is not a number");
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) if !f.contains('.') => (i, f),
        Some(_) => return Err(bad()),
        None => (text, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let n: BigInt = digits.parse().map_err(|_| bad())?;
    let d = BigInt::from(10).pow(frac.len() as u32);
    Ok(BigRational::new(n, d))
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    /// An expression whose operators bind at least as tightly as `min` (precedence climbing).
    fn expr(&mut self, min: u8) -> Result<BigRational, String> {
        let mut left = self.unary()?;
        while let Some(Token::Op(op)) = self.tokens.get(self.at).cloned() {
            let (prec, right_assoc) = match op {
                '+' | '-' => (1, false),
                '*' | '/' | '%' => (2, false),
                _ => (4, true),
            };
            if prec < min {
                break;
            }
            self.at += 1;
            let right = self.expr(if right_assoc { prec } else { prec + 1 })?;
            left = apply(op, left, right)?;
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<BigRational, String> {
        match self.next() {
            Some(Token::Op('-')) => Ok(-self.expr(3)?),
            Some(Token::Op('+')) => self.expr(3),
            Some(Token::Num(n)) => Ok(n),
            Some(Token::Open) => {
                let v = self.expr(0)?;
                match self.next() {
                    Some(Token::Close) => Ok(v),
                    _ => Err("a `(` is not closed".into()),
                }
            }
            Some(t) => Err(format!("unexpected `{}`", t.text())),
            None => Err("the expression ends too soon".into()),
        }
    }
}

fn apply(op: char, a: BigRational, b: BigRational) -> Result<BigRational, String> {
    Ok(match op {
        '+' => a + b,
        '-' => a - b,
        '*' => a * b,
        '/' | '%' if b.is_zero() => return Err("division by zero".into()),
        '/' => a / b,
        '%' => {
            let q = (&a / &b).floor();
            a - b * q
        }
        _ => {
            if !b.is_integer() {
                return Err("`^` takes a whole exponent".into());
            }
            let e = b.to_integer();
            let n = e
                .abs()
                .to_u32()
                .filter(|n| *n <= MAX_EXPONENT)
                .ok_or_else(|| format!("exponents are limited to ±{MAX_EXPONENT}"))?;
            if a.is_zero() && e.is_negative() {
                return Err("division by zero".into());
            }
            let p = num_traits::pow(a, n as usize);
            if e.is_negative() { p.recip() } else { p }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc(s: &str) -> String {
        evaluate(s)
            .map(|v| show(&v))
            .unwrap_or_else(|e| format!("error: {e}"))
    }

    #[test]
    fn arithmetic_is_exact() {
        assert_eq!(calc("0.1 + 0.2"), "0.3");
        assert_eq!(calc("1/3 * 3"), "1");
        assert_eq!(calc("2^64 - 1"), "18446744073709551615");
        assert_eq!(calc("-2^2"), "-4");
        assert_eq!(calc("2^3^2"), "512");
        assert_eq!(calc("(2 + 3) * 4.5 / 7"), "45/14 ≈ 3.214285714286");
        assert_eq!(calc("7 % 3 + 10 % -4"), "-1");
        assert_eq!(calc("2^-2"), "0.25");
        assert_eq!(calc("123456789 × 987654321"), "121932631112635269");
        assert_eq!(calc("1_000 ÷ 8"), "125");
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        assert_eq!(calc("1/0"), "error: division by zero");
        assert_eq!(calc("(1 + 2"), "error: a `(` is not closed");
        assert_eq!(calc("2 +"), "error: the expression ends too soon");
        assert_eq!(calc("2 ^ 0.5"), "error: `^` takes a whole exponent");
        assert_eq!(calc("2 ^ 100000"), "error: exponents are limited to ±4096");
        assert_eq!(calc("sqrt(2)"), "error: unexpected character `s`");
        assert_eq!(calc("1.2.3"), "error: `1.2.3` is not a number");
        assert_eq!(calc("1 2"), "error: unexpected `2`");
    }
}
