//! Generation parameters in A1111's "PNG info" text format, so an image opens with its settings in
//! A1111, SD.Next, CivitAI and our own studio:
//!
//! ```text
//! a castle on a hill
//! Negative prompt: blurry
//! Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 42, Size: 512x768, Model hash: 6ce0161689, Model: v1-5-pruned-emaonly
//! ```

use std::fmt::Write as _;

/// What produced an image.
#[derive(Debug, Clone, PartialEq)]
pub struct Parameters {
    pub prompt: String,
    pub negative_prompt: String,
    pub steps: usize,
    /// A1111's sampler name ("Euler", "Euler a", "DPM++ 2M", "DDIM").
    pub sampler: String,
    /// A1111's schedule type ("Normal", "Karras").
    pub schedule: String,
    pub cfg_scale: f32,
    pub seed: u64,
    pub width: usize,
    pub height: usize,
    pub model_hash: Option<String>,
    pub model: Option<String>,
    /// Further `key: value` pairs, in order, kept so a round trip loses nothing.
    pub extra: Vec<(String, String)>,
}

/// A1111 prints `7` for 7.0 and `7.5` for 7.5.
pub(crate) fn fmt_number(v: f32) -> String {
    if v.fract() == 0.0 && v.abs() < 1e7 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Quotes a value that would break the comma-separated line, as A1111 does (JSON string).
/// Values with leading or trailing whitespace are quoted too: unquoted values are trimmed when
/// read back.
fn quote(v: &str) -> String {
    if v.contains([',', ':', '\n', '"']) || v.trim() != v {
        serde_json::to_string(v).unwrap_or_else(|_| v.replace(',', " "))
    } else {
        v.to_string()
    }
}

impl Parameters {
    /// The denoising strength of an img2img image (A1111 writes it for img2img and hires fix).
    /// The value of an extra key (`Hires upscale: 2` → `2`), trimmed; `None` where absent.
    pub fn extra_value(&self, key: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim())
    }

    pub fn denoising_strength(&self) -> Option<f64> {
        self.extra
            .iter()
            .find(|(k, _)| k == "Denoising strength")
            .and_then(|(_, v)| v.trim().parse().ok())
            .filter(|s: &f64| *s > 0.0 && *s <= 1.0)
    }

    /// The clip skip a parameters text names (1 when absent, as A1111 writes it only past 1).
    pub fn clip_skip(&self) -> Option<usize> {
        match self.extra.iter().find(|(k, _)| k == "Clip skip") {
            Some((_, v)) => v.trim().parse().ok().filter(|&n| n >= 1),
            None => Some(1),
        }
    }

    pub fn to_a1111(&self) -> String {
        let mut out = self.prompt.clone();
        if !self.negative_prompt.is_empty() {
            let _ = write!(out, "\nNegative prompt: {}", self.negative_prompt);
        }
        let mut fields = vec![
            ("Steps".to_string(), self.steps.to_string()),
            ("Sampler".to_string(), quote(&self.sampler)),
            ("Schedule type".to_string(), quote(&self.schedule)),
            ("CFG scale".to_string(), fmt_number(self.cfg_scale)),
            ("Seed".to_string(), self.seed.to_string()),
            (
                "Size".to_string(),
                format!("{}x{}", self.width, self.height),
            ),
        ];
        if let Some(h) = &self.model_hash {
            fields.push(("Model hash".into(), quote(h)));
        }
        if let Some(m) = &self.model {
            fields.push(("Model".into(), quote(m)));
        }
        fields.extend(self.extra.iter().map(|(k, v)| (k.clone(), quote(v))));
        let line: Vec<String> = fields
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let _ = write!(out, "\n{}", line.join(", "));
        out
    }

    /// Parses A1111's format (also what ComfyUI-A1111 exporters and SD.Next write).
    pub fn parse_a1111(text: &str) -> crate::error::Result<Self> {
        Self::parse(text).map_err(crate::error::Error::InvalidParameters)
    }

    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim_end();
        let (body, settings) = match text.rfind('\n') {
            Some(i) if text[i + 1..].trim_start().starts_with("Steps:") => {
                (&text[..i], &text[i + 1..])
            }
            None if text.starts_with("Steps:") => ("", text),
            _ => return Err("no `Steps:` line: not A1111-style parameters".into()),
        };
        // `to_a1111` writes exactly one space after the label; taking only that one keeps a
        // negative prompt that starts with whitespace intact.
        let after_label = |neg: &'_ str| neg.strip_prefix(' ').unwrap_or(neg).to_string();
        let (prompt, negative) = match body.find("\nNegative prompt:") {
            Some(i) => (
                &body[..i],
                after_label(&body[i + "\nNegative prompt:".len()..]),
            ),
            None => match body.strip_prefix("Negative prompt:") {
                Some(neg) => ("", after_label(neg)),
                None => (body, String::new()),
            },
        };
        let mut p = Parameters {
            prompt: prompt.to_string(),
            negative_prompt: negative,
            steps: 0,
            sampler: String::new(),
            schedule: "Normal".into(),
            cfg_scale: 7.0,
            seed: 0,
            width: 0,
            height: 0,
            model_hash: None,
            model: None,
            extra: Vec::new(),
        };
        let mut seen_steps = false;
        for (key, value) in split_fields(settings.trim())? {
            let bad = |what: &str| format!("`{key}: {value}` is not a valid {what}");
            match key.as_str() {
                "Steps" => {
                    p.steps = value.parse().map_err(|_| bad("step count"))?;
                    seen_steps = true;
                }
                "Sampler" => p.sampler = value,
                "Schedule type" => p.schedule = value,
                "CFG scale" => p.cfg_scale = value.parse().map_err(|_| bad("number"))?,
                "Seed" => p.seed = value.parse().map_err(|_| bad("seed"))?,
                "Size" => {
                    let (w, h) = value.split_once('x').ok_or_else(|| bad("size"))?;
                    p.width = w.trim().parse().map_err(|_| bad("size"))?;
                    p.height = h.trim().parse().map_err(|_| bad("size"))?;
                }
                "Model hash" => p.model_hash = Some(value),
                "Model" => p.model = Some(value),
                _ => p.extra.push((key, value)),
            }
        }
        if !seen_steps {
            return Err("parameters have no step count".into());
        }
        Ok(p)
    }
}

/// Splits `k: v, k: "quoted, v", …`.
fn split_fields(line: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        let colon = rest
            .find(':')
            .ok_or_else(|| format!("expected `key: value` in `{rest}`"))?;
        // Stray commas around a key are separators, not part of it (`a: 1, , b: 2`); keeping
        // them would make the key print differently than it was read.
        let key = rest[..colon]
            .trim_matches(|c: char| c == ',' || c.is_whitespace())
            .to_string();
        let after = rest[colon + 1..].trim_start();
        let (value, remaining) = if after.starts_with('"') {
            // A JSON string: find its end by letting serde read exactly one value.
            let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
            let v = de
                .next()
                .ok_or("unterminated quoted value")?
                .map_err(|e| format!("bad quoted value: {e}"))?;
            // Quoted values are kept exactly as written, spaces included.
            (v, &after[de.byte_offset()..])
        } else {
            let end = after.find(", ").unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.push((key, value));
        rest = remaining.trim_start_matches([',', ' ']);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Parameters {
        Parameters {
            prompt: "a castle on a hill, (masterpiece:1.2)".into(),
            negative_prompt: "blurry".into(),
            steps: 20,
            sampler: "Euler a".into(),
            schedule: "Karras".into(),
            cfg_scale: 7.0,
            seed: 42,
            width: 512,
            height: 768,
            model_hash: Some("6ce0161689".into()),
            model: Some("v1-5-pruned-emaonly".into()),
            extra: Vec::new(),
        }
    }

    #[test]
    fn matches_a1111_text_exactly() {
        assert_eq!(
            example().to_a1111(),
            "a castle on a hill, (masterpiece:1.2)\nNegative prompt: blurry\n\
             Steps: 20, Sampler: Euler a, Schedule type: Karras, CFG scale: 7, Seed: 42, Size: 512x768, \
             Model hash: 6ce0161689, Model: v1-5-pruned-emaonly"
        );
    }

    #[test]
    fn round_trips() {
        let mut p = example();
        p.cfg_scale = 7.5;
        p.prompt = "line one\nline two: with colon, and comma".into();
        p.model = Some("my, odd: model".into());
        p.extra.push(("Clip skip".into(), "2".into()));
        assert_eq!(Parameters::parse_a1111(&p.to_a1111()).unwrap(), p);
        p.negative_prompt.clear();
        assert!(!p.to_a1111().contains("Negative prompt"));
        assert_eq!(Parameters::parse_a1111(&p.to_a1111()).unwrap(), p);
    }

    /// Found by tests/fuzz.rs: whitespace at either end of a value or a negative prompt was
    /// trimmed away on reading, so restoring an image's parameters changed them.
    #[test]
    fn round_trips_surrounding_whitespace() {
        let mut p = example();
        p.negative_prompt = "  two leading spaces".into();
        p.sampler = "Euler a ".into();
        p.model = Some("\n".into());
        p.extra.push(("Note".into(), " ".into()));
        assert_eq!(Parameters::parse_a1111(&p.to_a1111()).unwrap(), p);
    }

    /// Found by tests/fuzz.rs: after an empty value, the separator's comma was read into the
    /// next key (`A: , <VT>, B: 2` gave the key `, B`), so printing and reading again changed it.
    #[test]
    fn stray_commas_are_not_part_of_keys() {
        let p = Parameters::parse_a1111("x\nSteps: 1, A: , \u{b}, B: 2").unwrap();
        assert_eq!(
            p.extra,
            vec![("A".into(), "".into()), ("B".into(), "2".into())]
        );
        let again = Parameters::parse_a1111(&p.to_a1111()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn parses_a_real_a1111_line() {
        let text = "portrait of a cat\nNegative prompt: lowres, bad anatomy\nSteps: 30, Sampler: DPM++ 2M, \
                    Schedule type: Karras, CFG scale: 6.5, Seed: 3735928559, Size: 512x512, Model hash: e1441589a6, \
                    Model: v1-5, Denoising strength: 0.4, Version: v1.10.1";
        let p = Parameters::parse_a1111(text).unwrap();
        assert_eq!(p.negative_prompt, "lowres, bad anatomy");
        assert_eq!(
            (p.steps, p.seed, p.width, p.cfg_scale),
            (30, 3735928559, 512, 6.5)
        );
        assert_eq!(
            p.extra,
            vec![
                ("Denoising strength".into(), "0.4".into()),
                ("Version".into(), "v1.10.1".into())
            ]
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(Parameters::parse_a1111("just a prompt").is_err());
        assert!(Parameters::parse_a1111("p\nSteps: many").is_err());
    }
}
