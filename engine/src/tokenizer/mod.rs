//! CLIP byte-level BPE tokenizer: a port of OpenAI CLIP's `simple_tokenizer.py`, the one
//! open_clip ships and Stable Diffusion 1.x/2.x text encoders were trained with.
//!
//! Pipeline (as in CLIP's `encode`):
//! 1. `basic_clean`: `ftfy.fix_text` (only partly reproduced, see below), then
//!    `html.unescape` twice, then strip.
//! 2. `whitespace_clean`: runs of Unicode whitespace become one space; strip.
//! 3. Lowercase (full Unicode mapping, final sigma included, like Python's `str.lower`).
//! 4. Split with CLIP's pattern (case-insensitive, as CLIP compiles it):
//!    `<|startoftext|>`, `<|endoftext|>`, contractions, letter runs, single digits, and
//!    runs of anything else that is not whitespace.
//! 5. Map each piece's UTF-8 bytes to CLIP's printable stand-in chars and apply BPE with
//!    the first 48,894 merges of `bpe_simple_vocab_16e6.txt.gz`, marking the word end
//!    with `</w>`. Literal `<|startoftext|>`/`<|endoftext|>` become [`BOS`]/[`EOS`].
//!
//! # ftfy
//! `ftfy.fix_text` is not reproduced in full. Done here, because prompts contain them:
//! HTML entities ending in `;` decoded until nothing changes (ftfy skips this from the
//! first line containing `<` on), C1 controls read as Windows-1252, fullwidth ASCII
//! (`（`, `，`) and U+3000 made ASCII, curly quotes straightened, and the control
//! characters ftfy strips removed. Not done, so such prompts tokenize as CLIP would
//! without ftfy (the fixture marks them `expect: open_clip_no_ftfy`): NFC normalization
//! (decomposed accents stay decomposed), Latin ligatures (`ﬁ`, `Ǳ`), mojibake repair
//! (`cafÃ©`), halfwidth katakana/hangul and the other width forms past U+FF5E, ANSI
//! terminal escapes, all-caps entity names (`&EACUTE;`), and named entities missing from
//! `named_entity`'s table (`html.unescape` knows 2,231 names; we know the Latin-1 set,
//! which is every name allowed without `;`, plus common typographic ones).
//!
//! # Unicode tables
//! Letter/number/whitespace classes and lowercasing come from the `regex` crate and std.
//! For every code point assigned in Unicode 14 (Python 3.11) they agree with Python's
//! `regex` module and `str.lower`; code points assigned later may split differently
//! depending on either side's Unicode version.
//!
//! # Other references
//! * open_clip >= 2 spells its special tokens `<start_of_text>`/`<end_of_text>`, so it
//!   splits a literal `<|endoftext|>` in a prompt into pieces; CLIP and transformers turn
//!   it into [`EOS`]. We follow CLIP (fixture: `expect: transformers`).
//! * transformers 5's `CLIPTokenizer` (the `tokenizers` pipeline: NFC, `\s+` -> space,
//!   lowercase, case-sensitive split) has no ftfy and no `html.unescape`. Against CLIP it
//!   differs on HTML entities, curly quotes, fullwidth forms, control and C1 characters,
//!   ligatures, mojibake, Greek final sigma (it lowercases every `Σ` to `σ`), `'ſ`
//!   (CLIP's `'s` matches it), and U+0345 (it keeps it); it agrees where ftfy only
//!   NFC-normalizes. The fixture records its ids for reference only.
//!
//! `tests/fixtures/make_tokenizer_fixtures.py` regenerates the reference ids.

use std::collections::HashMap;
use std::io::Read;

use flate2::read::GzDecoder;
use regex::{Captures, Regex};

/// `<|startoftext|>`
pub const BOS: u32 = 49406;
/// `<|endoftext|>`; SD 1.x also pads with it.
pub const EOS: u32 = 49407;
/// Positions the CLIP text encoder sees.
pub const CONTEXT_LEN: usize = 77;
/// Prompt tokens that fit between [`BOS`] and [`EOS`].
pub const MAX_PROMPT_TOKENS: usize = CONTEXT_LEN - 2;

const VOCAB_GZ: &[u8] = include_bytes!("../../../assets/bpe_simple_vocab_16e6.txt.gz");
/// CLIP keeps this many merges so that the vocabulary is exactly 49,408 ids.
const NUM_MERGES: usize = 49152 - 256 - 2;
const SOT: &str = "<|startoftext|>";
const EOT: &str = "<|endoftext|>";

/// CLIP's split pattern. CLIP compiles it case-insensitively. With Python's `regex` that
/// lets `'ſ` match `'s`, leaves `\p{L}`/`\p{N}` alone, and takes U+0345 (which folds to
/// `ι`) out of the negated class, so CLIP silently drops U+0345. Rust's `(?i)` would fold
/// `\p{L}` too, so the flag is scoped to the literals and U+0345 excluded by hand.
const SPLIT_PATTERN: &str = r"(?i:<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N}|[^\s\p{L}\p{N}\x{345}]+";
/// Python's `html.unescape` pattern: numeric refs and names may omit the `;`.
const CHARREF_PATTERN: &str = r"&(?:#([0-9]+);?|#[xX]([0-9a-fA-F]+);?|([^\t\n\x0C <&#;]{1,32};?))";
/// ftfy only decodes entities that end in `;`.
const FTFY_ENTITY_PATTERN: &str = r"&#?[0-9A-Za-z]{1,24};";

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot decompress the BPE vocabulary: {0}")]
    Decompress(#[from] std::io::Error),
    #[error("BPE vocabulary has {found} merges, CLIP needs {NUM_MERGES}")]
    TooFewMerges { found: usize },
    #[error("BPE vocabulary line {line} is not a pair of symbols")]
    BadMerge { line: usize },
    #[error("BPE vocabulary has an unexpected layout: {0}")]
    Layout(String),
    #[error(transparent)]
    Regex(#[from] regex::Error),
}

/// A prompt ready for the text encoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// [`BOS`], at most [`MAX_PROMPT_TOKENS`] prompt ids, [`EOS`], then [`EOS`] padding.
    pub ids: [u32; CONTEXT_LEN],
    /// The prompt had more than [`MAX_PROMPT_TOKENS`] tokens; the rest was dropped.
    pub truncated: bool,
    /// Prompt tokens before truncation, without [`BOS`]/[`EOS`].
    pub token_count: usize,
}

/// CLIP's tokenizer. Immutable after construction, so it can be shared across threads.
pub struct ClipTokenizer {
    /// Vocabulary id of each byte's stand-in char, inside a word and at its end (`</w>`).
    byte_ids: [u32; 256],
    byte_end_ids: [u32; 256],
    /// (left id, right id) -> (merge rank, merged id). Word symbols are always vocabulary
    /// entries, so BPE can run on ids instead of strings.
    merges: HashMap<(u32, u32), (u32, u32)>,
    split: Regex,
    charref: Regex,
    ftfy_entity: Regex,
}

impl std::fmt::Debug for ClipTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipTokenizer")
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

impl ClipTokenizer {
    /// Vocabulary embedded with `include_bytes!("../../../assets/bpe_simple_vocab_16e6.txt.gz")`.
    /// Takes ~0.1 s in release (decompress and index 49k merges): build it once and share it.
    ///
    /// # Errors
    /// Only if the embedded vocabulary is corrupt, which the tests rule out.
    pub fn new() -> Result<Self, TokenizerError> {
        Self::from_gzip(VOCAB_GZ)
    }

    /// Builds the tokenizer from a gzipped CLIP merges file.
    ///
    /// # Errors
    /// If the data does not decompress to UTF-8 text with at least 48,894 merge lines.
    pub fn from_gzip(gz: &[u8]) -> Result<Self, TokenizerError> {
        let mut text = String::new();
        GzDecoder::new(gz).read_to_string(&mut text)?;
        Self::from_merges_text(&text)
    }

    fn from_merges_text(text: &str) -> Result<Self, TokenizerError> {
        // The first line is a version header.
        let merges = text
            .split('\n')
            .skip(1)
            .take(NUM_MERGES)
            .enumerate()
            .map(|(i, line)| {
                let mut parts = line.split_whitespace();
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => Ok((a, b)),
                    _ => Err(TokenizerError::BadMerge { line: i + 2 }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if merges.len() != NUM_MERGES {
            return Err(TokenizerError::TooFewMerges {
                found: merges.len(),
            });
        }

        // Vocabulary order as in CLIP: byte chars, byte chars + `</w>`, merges, specials.
        let byte_chars = bytes_to_unicode();
        let mut vocab: Vec<String> = byte_chars.iter().map(|(_, c)| c.to_string()).collect();
        vocab.extend(byte_chars.iter().map(|(_, c)| format!("{c}</w>")));
        vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        vocab.extend([SOT.to_owned(), EOT.to_owned()]);
        // Later duplicates win, like Python's `dict(zip(vocab, range(len(vocab))))`.
        let encoder: HashMap<&str, u32> = vocab.iter().map(String::as_str).zip(0..).collect();
        let id = |token: &str| {
            encoder
                .get(token)
                .copied()
                .ok_or_else(|| TokenizerError::Layout(format!("no id for {token:?}")))
        };
        if id(SOT)? != BOS || id(EOT)? != EOS {
            return Err(TokenizerError::Layout(format!(
                "{SOT}/{EOT} are not {BOS}/{EOS}"
            )));
        }

        let mut byte_ids = [0; 256];
        let mut byte_end_ids = [0; 256];
        for &(byte, c) in &byte_chars {
            byte_ids[usize::from(byte)] = id(&c.to_string())?;
            byte_end_ids[usize::from(byte)] = id(&format!("{c}</w>"))?;
        }

        let mut merge_ids = HashMap::with_capacity(merges.len());
        for ((a, b), rank) in merges.iter().zip(0..) {
            // A merge of a non-vocabulary symbol can never apply.
            if let (Ok(left), Ok(right)) = (id(a), id(b)) {
                merge_ids.insert((left, right), (rank, id(&format!("{a}{b}"))?));
            }
        }

        Ok(Self {
            byte_ids,
            byte_end_ids,
            merges: merge_ids,
            split: Regex::new(SPLIT_PATTERN)?,
            charref: Regex::new(CHARREF_PATTERN)?,
            ftfy_entity: Regex::new(FTFY_ENTITY_PATTERN)?,
        })
    }

    /// BPE ids of the text, no BOS/EOS, no truncation.
    #[must_use]
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let text = self.clean(text);
        let mut ids = Vec::new();
        for piece in self.split.find_iter(&text) {
            match piece.as_str() {
                SOT => ids.push(BOS),
                EOT => ids.push(EOS),
                word => self.bpe(word.as_bytes(), &mut ids),
            }
        }
        ids
    }

    /// `[BOS] + first 75 ids + [EOS]`, padded to 77 with [`EOS`] as SD 1.x does. This is
    /// also what open_clip's truncation yields (it overwrites the 77th id with EOS).
    /// OpenCLIP-based encoders (SD 2.x, SDXL's second one) were run with open_clip's
    /// padding, id 0 (`!`), and their hidden states at padding positions feed
    /// cross-attention: for those, overwrite `ids[token_count.min(75) + 2..]` with 0.
    #[must_use]
    pub fn encode_padded(&self, text: &str) -> Encoded {
        let tokens = self.encode(text);
        let kept = tokens.len().min(MAX_PROMPT_TOKENS);
        let mut ids = [EOS; CONTEXT_LEN];
        ids[0] = BOS;
        ids[1..=kept].copy_from_slice(&tokens[..kept]);
        Encoded {
            ids,
            truncated: tokens.len() > kept,
            token_count: tokens.len(),
        }
    }

    /// `whitespace_clean(basic_clean(text)).lower()`.
    fn clean(&self, text: &str) -> String {
        let fixed = self.fix_text(text);
        let unescaped = html_unescape(&self.charref, &html_unescape(&self.charref, &fixed));
        // `split_whitespace` uses Unicode White_Space, the same set as `\s` in CLIP's regex.
        unescaped
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    }

    /// The subset of `ftfy.fix_text` described in the module docs.
    fn fix_text(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut unescape = true;
        // ftfy works line by line and stops unescaping for good at the first line with `<`.
        for line in text.split_inclusive('\n') {
            unescape &= !line.contains('<');
            // The character fixes are idempotent; with unescaping, ftfy repeats both until
            // the text stops changing (so `&amp;amp;amp;` fully decodes).
            let mut line = fix_chars(line);
            if unescape {
                loop {
                    let next = fix_chars(&self.ftfy_unescape(&line));
                    if next == line {
                        break;
                    }
                    line = next;
                }
            }
            out.push_str(&line);
        }
        out
    }

    /// ftfy's `unescape_html`: only `;`-terminated entities, numeric ones only when
    /// Python's `html.unescape` consumes them whole.
    fn ftfy_unescape(&self, text: &str) -> String {
        self.ftfy_entity
            .replace_all(text, |caps: &Captures| {
                let entity = &caps[0];
                let body = &entity[1..entity.len() - 1];
                let decoded = match body.strip_prefix('#') {
                    Some(num) => match num.strip_prefix(['x', 'X']) {
                        Some(hex) => numeric_charref(hex, 16),
                        None => numeric_charref(num, 10),
                    }
                    .filter(|s| !s.contains(';')),
                    None => named_entity(body, true).map(String::from),
                };
                decoded.unwrap_or_else(|| entity.to_owned())
            })
            .into_owned()
    }

    /// Appends the BPE ids of one pre-tokenized piece.
    fn bpe(&self, piece: &[u8], out: &mut Vec<u32>) {
        let Some((&last, init)) = piece.split_last() else {
            return;
        };
        let mut word: Vec<u32> = init
            .iter()
            .map(|&b| self.byte_ids[usize::from(b)])
            .chain([self.byte_end_ids[usize::from(last)]])
            .collect();
        while word.len() > 1 {
            let best = word
                .windows(2)
                .filter_map(|w| {
                    let (rank, merged) = *self.merges.get(&(w[0], w[1]))?;
                    Some((rank, (w[0], w[1]), merged))
                })
                .min_by_key(|&(rank, ..)| rank);
            let Some((_, pair, merged)) = best else {
                break;
            };
            // Merge every occurrence, left to right, without overlaps (as CLIP does).
            let mut next = Vec::with_capacity(word.len());
            let mut i = 0;
            while i < word.len() {
                if i + 1 < word.len() && (word[i], word[i + 1]) == pair {
                    next.push(merged);
                    i += 2;
                } else {
                    next.push(word[i]);
                    i += 1;
                }
            }
            word = next;
        }
        out.extend(word);
    }
}

/// CLIP's `bytes_to_unicode`: printable Latin-1 bytes stand for themselves, the others get
/// U+0100.. in byte order, so every byte has a visible, non-whitespace char. The order is
/// the vocabulary order of the first 256 ids.
fn bytes_to_unicode() -> Vec<(u8, char)> {
    let printable = |b: &u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table: Vec<(u8, char)> = (0..=255u8)
        .filter(printable)
        .map(|b| (b, char::from(b)))
        .collect();
    table.extend((0..=255u8).filter(|b| !printable(b)).zip('\u{100}'..));
    table
}

/// ftfy's per-character fixes, in its order: C1 controls as Windows-1252, fullwidth ASCII
/// and ideographic space, straight quotes, and removal of stray control characters.
fn fix_chars(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            let c = match u32::from(c) {
                0x80..=0x9F => windows_1252(u32::from(c)),
                0xFF01..=0xFF5E => char::from_u32(u32::from(c) - 0xFEE0).unwrap_or(c),
                0x3000 => ' ',
                _ => c,
            };
            match c {
                '\u{2BC}' | '\u{2018}'..='\u{201B}' => Some('\''),
                '\u{201C}'..='\u{201F}' => Some('"'),
                '\0'..='\u{8}'
                | '\u{B}'
                | '\u{E}'..='\u{1F}'
                | '\u{7F}'
                | '\u{206A}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFC}' => None,
                c => Some(c),
            }
        })
        .collect()
}

/// Windows-1252 reading of a C1 code point (0x80..=0x9F); its five holes stay as they are.
/// Both ftfy and `html.unescape` (for `&#128;`..`&#159;`) use this table.
fn windows_1252(code: u32) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8D}', 'Ž',
        '\u{8F}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9D}',
        'ž', 'Ÿ',
    ];
    code.checked_sub(0x80)
        .and_then(|i| HIGH.get(i as usize))
        .copied()
        .unwrap_or('\u{FFFD}')
}

/// Python's `html.unescape`.
fn html_unescape(charref: &Regex, text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    charref
        .replace_all(text, |caps: &Captures| {
            if let Some(dec) = caps.get(1) {
                numeric_charref(dec.as_str(), 10).unwrap_or_default()
            } else if let Some(hex) = caps.get(2) {
                numeric_charref(hex.as_str(), 16).unwrap_or_default()
            } else {
                named_charref(&caps[3])
            }
        })
        .into_owned()
}

/// `html.unescape` of `&#<digits>`: invalid references become U+FFFD or nothing, as in
/// the HTML5 spec. `None` only if `digits` is not a number in `radix`.
fn numeric_charref(digits: &str, radix: u32) -> Option<String> {
    if digits.is_empty() {
        return None;
    }
    // Saturate: anything past U+10FFFF is replaced alike.
    let num = digits.chars().try_fold(0u32, |n, d| {
        Some(n.saturating_mul(radix).saturating_add(d.to_digit(radix)?))
    })?;
    let decoded = match num {
        0 | 0xD800..=0xDFFF | 0x11_0000.. => Some('\u{FFFD}'),
        0x0D => Some('\r'),
        0x80..=0x9F => Some(windows_1252(num)),
        0x01..=0x08 | 0x0B | 0x0E..=0x1F | 0x7F | 0xFDD0..=0xFDEF => None,
        n if n & 0xFFFE == 0xFFFE => None,
        n => char::from_u32(n),
    };
    Some(decoded.map(String::from).unwrap_or_default())
}

/// `html.unescape` of `&name` / `&name;`: names valid without `;` may also prefix
/// trailing text (`&copy2024` -> `©2024`).
fn named_charref(name: &str) -> String {
    let (bare, semicolon) = match name.strip_suffix(';') {
        Some(bare) => (bare, true),
        None => (name, false),
    };
    if let Some(c) = named_entity(bare, semicolon) {
        return c.to_string();
    }
    // Longest proper prefix of at least two chars that is a legacy (`;`-less) name. Those
    // are ASCII, so byte offsets work as char counts.
    let cut = (2..name.len())
        .rev()
        .filter(|&i| name.is_char_boundary(i))
        .find_map(|i| Some((named_entity(&name[..i], false)?, &name[i..])));
    match cut {
        Some((c, rest)) => format!("{c}{rest}"),
        None => format!("&{name}"),
    }
}

/// The entity table; `semicolon` says whether the name was terminated by `;`.
fn named_entity(name: &str, semicolon: bool) -> Option<char> {
    // HTML 4's Latin-1 names for U+00A0..=U+00FF; HTML5 also accepts them without `;`.
    const LATIN1: [&str; 96] = [
        "nbsp", "iexcl", "cent", "pound", "curren", "yen", "brvbar", "sect", "uml", "copy", "ordf",
        "laquo", "not", "shy", "reg", "macr", "deg", "plusmn", "sup2", "sup3", "acute", "micro",
        "para", "middot", "cedil", "sup1", "ordm", "raquo", "frac14", "frac12", "frac34", "iquest",
        "Agrave", "Aacute", "Acirc", "Atilde", "Auml", "Aring", "AElig", "Ccedil", "Egrave",
        "Eacute", "Ecirc", "Euml", "Igrave", "Iacute", "Icirc", "Iuml", "ETH", "Ntilde", "Ograve",
        "Oacute", "Ocirc", "Otilde", "Ouml", "times", "Oslash", "Ugrave", "Uacute", "Ucirc",
        "Uuml", "Yacute", "THORN", "szlig", "agrave", "aacute", "acirc", "atilde", "auml", "aring",
        "aelig", "ccedil", "egrave", "eacute", "ecirc", "euml", "igrave", "iacute", "icirc",
        "iuml", "eth", "ntilde", "ograve", "oacute", "ocirc", "otilde", "ouml", "divide", "oslash",
        "ugrave", "uacute", "ucirc", "uuml", "yacute", "thorn", "yuml",
    ];
    // The other names HTML5 accepts without `;`.
    const LEGACY: [(&str, char); 10] = [
        ("amp", '&'),
        ("AMP", '&'),
        ("lt", '<'),
        ("LT", '<'),
        ("gt", '>'),
        ("GT", '>'),
        ("quot", '"'),
        ("QUOT", '"'),
        ("COPY", '©'),
        ("REG", '®'),
    ];
    // Common names that need the `;`.
    const TERMINATED: [(&str, char); 52] = [
        ("apos", '\''),
        ("hellip", '…'),
        ("mdash", '—'),
        ("ndash", '–'),
        ("lsquo", '‘'),
        ("rsquo", '’'),
        ("sbquo", '‚'),
        ("ldquo", '“'),
        ("rdquo", '”'),
        ("bdquo", '„'),
        ("lsaquo", '‹'),
        ("rsaquo", '›'),
        ("bull", '•'),
        ("trade", '™'),
        ("euro", '€'),
        ("dagger", '†'),
        ("Dagger", '‡'),
        ("permil", '‰'),
        ("prime", '′'),
        ("Prime", '″'),
        ("larr", '←'),
        ("rarr", '→'),
        ("uarr", '↑'),
        ("darr", '↓'),
        ("harr", '↔'),
        ("hearts", '♥'),
        ("spades", '♠'),
        ("clubs", '♣'),
        ("diams", '♦'),
        ("star", '☆'),
        ("starf", '★'),
        ("check", '✓'),
        ("cross", '✗'),
        ("minus", '−'),
        ("infin", '∞'),
        ("ne", '≠'),
        ("le", '≤'),
        ("ge", '≥'),
        ("asymp", '≈'),
        ("ensp", '\u{2002}'),
        ("emsp", '\u{2003}'),
        ("thinsp", '\u{2009}'),
        ("zwnj", '\u{200C}'),
        ("zwj", '\u{200D}'),
        ("OElig", 'Œ'),
        ("oelig", 'œ'),
        ("Scaron", 'Š'),
        ("scaron", 'š'),
        ("Yuml", 'Ÿ'),
        ("fnof", 'ƒ'),
        ("circ", 'ˆ'),
        ("tilde", '˜'),
    ];
    let lookup = |table: &[(&str, char)]| table.iter().find(|(n, _)| *n == name).map(|e| e.1);
    LATIN1
        .iter()
        .zip('\u{A0}'..)
        .find(|(n, _)| **n == name)
        .map(|(_, c)| c)
        .or_else(|| lookup(&LEGACY))
        .or_else(|| if semicolon { lookup(&TERMINATED) } else { None })
}

#[cfg(test)]
mod tests;
