//! AUTOMATIC1111 prompt emphasis syntax: `(word)`, `[word]`, `(word:1.3)`, escapes and `BREAK`.
//!
//! Mirrors `parse_prompt_attention` in A1111's `modules/prompt_parser.py` so that prompts written
//! for A1111 get the same per-chunk weights here. A hand-written scanner replaces A1111's two
//! regexes (`re_attention`, `re_break`) because `re_break` needs `\b`-style context checks and the
//! scanner keeps this file dependency-free.
//!
//! Known, deliberate deviations (A1111 would raise or depends on Python's Unicode tables):
//! - `(a:1.2.3)` / `(a:.)`: the number matches A1111's regex but Python's `float()` raises. Here
//!   the token is kept as plain text, exactly as A1111 treats a weight token with no open `(`.
//! - `\b` around `BREAK` uses Rust's `char::is_alphanumeric` (plus `_`) as the word class; Python's
//!   `\w` excludes a few combining marks / circled letters, so only such a character glued to
//!   `BREAK` can split differently.

/// Multiplier of `( )`; A1111's `round_bracket_multiplier`.
const ROUND_MUL: f64 = 1.1;
/// Multiplier of `[ ]`: A1111 multiplies by `1 / 1.1` (not divides by 1.1; rounding differs).
const SQUARE_MUL: f64 = 1.0 / 1.1;
/// Weight A1111 gives to the `BREAK` marker chunk (before any enclosing bracket multiplies it).
const BREAK_WEIGHT: f64 = -1.0;

/// Splits `text` into `(chunk, weight)` pairs exactly like A1111's `parse_prompt_attention`.
///
/// A standalone `BREAK` yields `("BREAK", -1.0)`; like A1111, a `BREAK` inside brackets is
/// multiplied too (e.g. `-1.1`), so callers should treat only weight `-1.0` as a chunk break.
/// Weights are computed in `f64` in A1111's operation order, runs are merged by comparing those
/// `f64` values, and only then is each weight rounded to the nearest `f32` (`as f32`; values
/// beyond `f32::MAX` become infinite). Never fails: every input produces some output.
#[must_use]
pub fn parse_prompt_attention(text: &str) -> Vec<(String, f32)> {
    let mut res: Vec<(String, f64)> = Vec::new();
    let mut round: Vec<usize> = Vec::new();
    let mut square: Vec<usize> = Vec::new();

    let mut rest = text;
    while !rest.is_empty() {
        let (token, len) = next_token(rest);
        rest = rest.get(len..).unwrap_or("");
        match token {
            Token::Literal(s) => res.push((s.to_string(), 1.0)),
            Token::OpenRound => round.push(res.len()),
            Token::OpenSquare => square.push(res.len()),
            Token::Weight(whole, number) => match (round.last(), parse_number(number)) {
                (Some(_), Some(w)) => {
                    let start = round.pop().unwrap_or(0);
                    multiply_range(&mut res, start, w);
                }
                // No open `(`: A1111 falls through to plain text. Unparsable number: see module docs.
                _ => push_text(&mut res, whole),
            },
            Token::CloseRound => match round.pop() {
                Some(start) => multiply_range(&mut res, start, ROUND_MUL),
                None => push_text(&mut res, ")"),
            },
            Token::CloseSquare => match square.pop() {
                Some(start) => multiply_range(&mut res, start, SQUARE_MUL),
                None => push_text(&mut res, "]"),
            },
            Token::Text(s) => push_text(&mut res, s),
        }
    }

    // Unclosed brackets apply to everything after them: all `(` first, then all `[`.
    for &start in &round {
        multiply_range(&mut res, start, ROUND_MUL);
    }
    for &start in &square {
        multiply_range(&mut res, start, SQUARE_MUL);
    }

    if res.is_empty() {
        return vec![(String::new(), 1.0)];
    }

    // Merge neighbours with identical f64 weights (note: 0.0 == -0.0, NaN never merges).
    let mut merged: Vec<(String, f64)> = Vec::with_capacity(res.len());
    for (chunk, weight) in res {
        match merged.last_mut() {
            #[allow(clippy::float_cmp)] // exact, as A1111's `==`
            Some(last) if last.1 == weight => last.0.push_str(&chunk),
            _ => merged.push((chunk, weight)),
        }
    }
    #[allow(clippy::cast_possible_truncation)] // intended: round to nearest f32
    merged
        .into_iter()
        .map(|(chunk, w)| (chunk, w as f32))
        .collect()
}

/// One match of A1111's `re_attention`, in the order its alternatives are tried.
enum Token<'a> {
    /// `\(`, `\)`, `\[`, `\]`, `\\` give the escaped char; a lone `\` gives "" (A1111 drops it).
    Literal(&'a str),
    OpenRound,
    OpenSquare,
    /// `:\s*([+-]?[.\d]+)\s*\)`: whole match and the number group.
    Weight(&'a str, &'a str),
    CloseRound,
    CloseSquare,
    /// A run of chars other than `\()[]:`, or a lone `:`.
    Text(&'a str),
}

/// Matches one token at the start of non-empty `s`; returns it and its byte length (>= 1).
fn next_token(s: &str) -> (Token<'_>, usize) {
    let bytes = s.as_bytes();
    match bytes.first() {
        Some(b'\\') => match bytes.get(1) {
            Some(b'(' | b')' | b'[' | b']' | b'\\') => {
                (Token::Literal(s.get(1..2).unwrap_or("")), 2)
            }
            _ => (Token::Literal(""), 1),
        },
        Some(b'(') => (Token::OpenRound, 1),
        Some(b'[') => (Token::OpenSquare, 1),
        Some(b')') => (Token::CloseRound, 1),
        Some(b']') => (Token::CloseSquare, 1),
        Some(b':') => match match_weight(s) {
            Some((len, number)) => (Token::Weight(s.get(..len).unwrap_or(s), number), len),
            None => (Token::Text(":"), 1),
        },
        _ => {
            // All delimiters are ASCII, so a byte scan always stops on a char boundary.
            let len = bytes
                .iter()
                .position(|b| matches!(b, b'\\' | b'(' | b')' | b'[' | b']' | b':'))
                .unwrap_or(s.len());
            (Token::Text(s.get(..len).unwrap_or(s)), len)
        }
    }
}

/// Tries `:\s*([+-]?[.\d]+)\s*\)` at the start of `s` (which begins with `:`).
/// None of the pieces can backtrack into each other, so a greedy scan equals the regex.
fn match_weight(s: &str) -> Option<(usize, &str)> {
    let mut i = 1;
    i += prefix_len(&s[i..], is_py_space);
    let num_start = i;
    if matches!(s.as_bytes().get(i), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = prefix_len(&s[i..], |c| c == '.' || decimal_value(c).is_some());
    if digits == 0 {
        return None;
    }
    i += digits;
    let number = &s[num_start..i];
    i += prefix_len(&s[i..], is_py_space);
    (s.as_bytes().get(i) == Some(&b')')).then_some((i + 1, number))
}

/// Byte length of the longest prefix of `s` whose chars all satisfy `pred`.
fn prefix_len(s: &str, pred: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .find(|&(_, c)| !pred(c))
        .map_or(s.len(), |(i, _)| i)
}

/// Python's `float()` on the captured group: Unicode digits count, `1.`, `.5`, `+1` are valid,
/// `.` or `1.2.3` are not (Python raises; we return `None`). Both round correctly.
fn parse_number(number: &str) -> Option<f64> {
    let ascii: String = number
        .chars()
        .map(|c| {
            decimal_value(c)
                .and_then(|d| char::from_digit(d, 10))
                .unwrap_or(c)
        })
        .collect();
    ascii.parse::<f64>().ok()
}

/// First code points of Python 3.11's (Unicode 14) runs of ten `\d` (category Nd) digits.
const DIGIT_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6f0, 0x7c0, 0x966, 0x9e6, 0xa66, 0xae6, 0xb66, 0xbe6, 0xc66, 0xce6, 0xd66,
    0xde6, 0xe50, 0xed0, 0xf20, 0x1040, 0x1090, 0x17e0, 0x1810, 0x1946, 0x19d0, 0x1a80, 0x1a90,
    0x1b50, 0x1bb0, 0x1c40, 0x1c50, 0xa620, 0xa8d0, 0xa900, 0xa9d0, 0xa9f0, 0xaa50, 0xabf0, 0xff10,
    0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450, 0x114d0, 0x11650,
    0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60, 0x16ac0, 0x16b50,
    0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
];

/// Value of a Python `\d` digit (e.g. `١` or `１`), which A1111's weight regex accepts.
fn decimal_value(c: char) -> Option<u32> {
    let cp = c as u32;
    DIGIT_ZEROS
        .iter()
        .find(|&&z| (z..z + 10).contains(&cp))
        .map(|&z| cp - z)
}

/// Python's `\s` (str): Rust's `White_Space` plus the separators U+001C..U+001F.
fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Approximates Python's `\w` for `\b` checks (see module docs).
fn is_word(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Appends plain text split like `re.split(r"\s*\bBREAK\b\s*", text)`, with a `BREAK` marker
/// between parts. Parts may be empty, as in A1111 (`"BREAK"` -> `"", BREAK, ""`).
fn push_text(res: &mut Vec<(String, f64)>, text: &str) {
    let mut part_start = 0; // end of the previous separator match
    let mut search = 0;
    while let Some(offset) = text.get(search..).and_then(|t| t.find("BREAK")) {
        let at = search + offset;
        let after = at + "BREAK".len();
        let boundary_before = text[..at].chars().next_back().is_none_or(|c| !is_word(c));
        let boundary_after = text[after..].chars().next().is_none_or(|c| !is_word(c));
        if !(boundary_before && boundary_after) {
            search = at + 1; // 'B' is one byte
            continue;
        }
        // Leftmost match: it starts at the whitespace run before BREAK, never before `part_start`.
        let start = part_start + text[part_start..at].trim_end_matches(is_py_space).len();
        let end = text.len() - text[after..].trim_start_matches(is_py_space).len();
        res.push((text[part_start..start].to_string(), 1.0));
        res.push(("BREAK".to_string(), BREAK_WEIGHT));
        part_start = end;
        search = end;
    }
    res.push((text.get(part_start..).unwrap_or("").to_string(), 1.0));
}

/// Multiplies every chunk from `start` on, like A1111's `multiply_range`.
fn multiply_range(res: &mut [(String, f64)], start: usize, multiplier: f64) {
    for entry in res.iter_mut().skip(start) {
        entry.1 *= multiplier;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_prompt_attention;

    /// Expected values are A1111's own float64 results (see `parse_prompt_attention` docstring).
    #[rustfmt::skip]
    const CASES: &[(&str, &[(&str, f64)])] = &[
        // A1111 docstring examples.
        ("normal text", &[("normal text", 1.0)]),
        ("an (important) word", &[("an ", 1.0), ("important", 1.1), (" word", 1.0)]),
        ("(unbalanced", &[("unbalanced", 1.1)]),
        ("\\(literal\\]", &[("(literal]", 1.0)]),
        ("(unnecessary)(parens)", &[("unnecessaryparens", 1.1)]),
        ("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).", &[("a ", 1.0),
            ("house", 1.5730000000000004), (" ", 1.1), ("on", 1.0), (" a ", 1.1), ("hill", 0.55),
            (", sun, ", 1.1), ("sky", 1.4641000000000006), (".", 1.1)]),
        // Empty and bracket-only prompts.
        ("", &[("", 1.0)]),
        ("()", &[("", 1.0)]),
        ("(:1.5)", &[("", 1.0)]),
        // Unbalanced brackets: stray closers are text, open ones apply to the rest.
        ("a) b", &[("a) b", 1.0)]),
        ("a] b", &[("a] b", 1.0)]),
        ("a [b", &[("a ", 1.0), ("b", 0.9090909090909091)]),
        ("((a)", &[("a", 1.2100000000000002)]),
        ("(a [b", &[("a ", 1.1), ("b", 1.0)]),
        ("([a)]", &[("a", 1.0)]),
        ("[a:1.5)", &[("a:1.5)", 0.9090909090909091)]),
        ("a:1.5) b", &[("a:1.5) b", 1.0)]),
        // Nesting and weights.
        ("((word))", &[("word", 1.2100000000000002)]),
        ("[[word]]", &[("word", 0.8264462809917354)]),
        ("((a:1.5) b)", &[("a", 1.6500000000000001), (" b", 1.1)]),
        ("(a:1.1)(b)", &[("ab", 1.1)]),
        ("(a:.5)", &[("a", 0.5)]),
        ("(a:1.)", &[("a", 1.0)]),
        ("(a:+.5) (b:-1)", &[("a", 0.5), (" ", 1.0), ("b", -1.0)]),
        ("(a: 1.5 )", &[("a", 1.5)]),
        ("(a :1.5)", &[("a ", 1.5)]),
        ("(a:1e2)", &[("a:1e2", 1.1)]),
        ("(a:1.5 b)", &[("a:1.5 b", 1.1)]),
        ("(a:0)", &[("a", 0.0)]),
        ("(a:\u{661}.\u{665})", &[("a", 1.5)]),
        ("(a:\u{1c}2)", &[("a", 2.0)]),
        // Escapes; a lone backslash is dropped.
        ("\\\\", &[("\\", 1.0)]),
        ("a\\b", &[("ab", 1.0)]),
        ("(a)\\", &[("a", 1.1), ("", 1.0)]),
        ("(a\\)", &[("a)", 1.1)]),
        ("\\((a)\\)", &[("(", 1.0), ("a", 1.1), (")", 1.0)]),
        ("\\[a\\] [\\[b\\]]", &[("[a] ", 1.0), ("[b]", 0.9090909090909091)]),
        // BREAK: needs word boundaries; swallows surrounding whitespace.
        ("BREAK", &[("", 1.0), ("BREAK", -1.0), ("", 1.0)]),
        ("BREAK a", &[("", 1.0), ("BREAK", -1.0), ("a", 1.0)]),
        ("a BREAK b", &[("a", 1.0), ("BREAK", -1.0), ("b", 1.0)]),
        ("a \n BREAK\t b", &[("a", 1.0), ("BREAK", -1.0), ("b", 1.0)]),
        ("a BREAK", &[("a", 1.0), ("BREAK", -1.0), ("", 1.0)]),
        ("a BREAK BREAK b", &[("a", 1.0), ("BREAK", -1.0), ("", 1.0), ("BREAK", -1.0), ("b", 1.0)]),
        ("a,BREAK,b", &[("a,", 1.0), ("BREAK", -1.0), (",b", 1.0)]),
        ("aBREAK BREAKING _BREAK BREAK2", &[("aBREAK BREAKING _BREAK BREAK2", 1.0)]),
        ("a:BREAK", &[("a:", 1.0), ("BREAK", -1.0), ("", 1.0)]),
        ("\\\\BREAK", &[("\\", 1.0), ("BREAK", -1.0), ("", 1.0)]),
        ("\\BREAK", &[("", 1.0), ("BREAK", -1.0), ("", 1.0)]),
        ("(a BREAK b)", &[("a", 1.1), ("BREAK", -1.1), ("b", 1.1)]),
        ("(BREAK:0)", &[("BREAK", 0.0)]),
        ("(a) BREAK [b]", &[("a", 1.1), ("", 1.0), ("BREAK", -1.0), ("", 1.0), ("b", 0.9090909090909091)]),
        // Whitespace is kept verbatim; non-ASCII text passes through.
        ("  a  ", &[("  a  ", 1.0)]),
        ("( a )", &[(" a ", 1.1)]),
        ("café (naïve:1.2) 🎨", &[("café ", 1.0), ("naïve", 1.2), (" 🎨", 1.0)]),
    ];

    fn check(input: &str, expected: &[(&str, f64)]) {
        let got = parse_prompt_attention(input);
        let ok = got.len() == expected.len()
            && got.iter().zip(expected).all(|((gt, gw), (et, ew))| {
                gt == et && (*gw as f64 - ew).abs() <= 1e-6 * ew.abs().max(1.0)
            });
        assert!(ok, "input {input:?}: got {got:?}, expected {expected:?}");
    }

    #[test]
    fn matches_a1111() {
        for (input, expected) in CASES {
            check(input, expected);
        }
    }

    #[test]
    fn unparsable_weight_is_text() {
        // A1111 raises ValueError here; we keep the token as text (bracket stays open).
        check("(a:1.2.3)", &[("a:1.2.3)", 1.1)]);
        check("(a:.)", &[("a:.)", 1.1)]);
    }

    #[test]
    fn nasty_inputs_do_not_panic() {
        let huge = format!("((a:0):{})", "9".repeat(400));
        let deep = format!("{}x{}", "(".repeat(2000), "]".repeat(2000));
        let nasty = [
            "\\",
            "((((",
            "))))",
            "[[[[",
            "]]]]",
            ":::",
            "(:)",
            "(:1",
            "(a:",
            "\\é",
            "é\\",
            "(🎨:1.2",
            ":\u{665}",
            "\u{0}",
            "BREAKBREAK",
            "BREAK\u{345}",
            "(a:-)",
            "(a:+)",
            "(a:\u{ff11}\u{ff10})",
            huge.as_str(),
            deep.as_str(),
        ];
        for input in nasty {
            let out = parse_prompt_attention(input);
            assert!(!out.is_empty(), "{input:?}");
        }
        let out = parse_prompt_attention(&huge);
        assert!(out[0].1.is_nan());
    }
}
