//! A1111's extra-network tags in prompts: `<lora:name:0.8>` and friends. A tag is removed from the
//! text the encoder reads; the parameters text keeps the prompt as written, so a PNG dragged back
//! activates the same LoRAs.
//!
//! As A1111's `extra_networks_lora`: `<lora:name>` is strength 1; `<lora:name:te>` sets both;
//! `<lora:name:te:unet>` sets them apart; `te=` and `unet=` name them. `<lyco:…>` (the LyCORIS
//! extension's tag, which A1111 now reads as a LoRA) is the same.

use std::sync::LazyLock;

use regex::Regex;

/// A1111's `re_extra_net`.
static TAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<(\w+):([^>]+)>").unwrap_or_else(|e| panic!("tag pattern: {e}")));

/// One `<lora:…>` tag.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraTag {
    pub name: String,
    /// Text-encoder strength.
    pub te: f32,
    /// UNet strength.
    pub unet: f32,
}

/// What a prompt's tags ask for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tags {
    pub loras: Vec<LoraTag>,
    /// Tags of other kinds (hypernetworks, …) or with unreadable arguments: removed, not applied.
    pub ignored: Vec<String>,
}

/// The prompt without its extra-network tags, as the text encoder reads it.
pub fn strip(prompt: &str) -> String {
    TAG.replace_all(prompt, "").into_owned()
}

/// Every tag in `prompt`, in order.
pub fn parse(prompt: &str) -> Tags {
    let mut tags = Tags::default();
    for c in TAG.captures_iter(prompt) {
        let (kind, args) = (&c[1], &c[2]);
        match (kind, lora(args)) {
            ("lora" | "lyco", Some(tag)) => tags.loras.push(tag),
            _ => tags.ignored.push(c[0].to_string()),
        }
    }
    tags
}

/// `name[:te[:unet]]` with `te=`/`unet=` named arguments; `None` when a number does not parse.
fn lora(args: &str) -> Option<LoraTag> {
    let mut positional = Vec::new();
    let mut named = Vec::new();
    for item in args.split(':') {
        match item.split_once('=') {
            Some((k, v)) => named.push((k.trim(), v.trim())),
            None => positional.push(item.trim()),
        }
    }
    let name = (*positional.first()?).to_string();
    if name.is_empty() {
        return None;
    }
    let number = |s: &str| s.parse::<f32>().ok().filter(|v| v.is_finite());
    let named_number = |key: &str| {
        named
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| number(v))
    };
    let mut te = match positional.get(1) {
        Some(v) => number(v)?,
        None => 1.0,
    };
    if let Some(v) = named_number("te") {
        te = v?;
    }
    let mut unet = match positional.get(2) {
        Some(v) => number(v)?,
        None => te,
    };
    if let Some(v) = named_number("unet") {
        unet = v?;
    }
    Some(LoraTag { name, te, unet })
}

/// `prompt` with `tag` added at its end (or its strengths changed where `name` already has a
/// tag): how the studio's LoRA list edits the prompt, the one place a LoRA choice lives.
pub fn set(prompt: &str, tag: &LoraTag) -> String {
    let text = format_tag(tag);
    let mut done = false;
    let replaced = TAG.replace_all(prompt, |c: &regex::Captures<'_>| {
        let is_this =
            matches!(&c[1], "lora" | "lyco") && lora(&c[2]).is_some_and(|t| t.name == tag.name);
        if is_this && !done {
            done = true;
            text.clone()
        } else {
            c[0].to_string()
        }
    });
    if done {
        return replaced.into_owned();
    }
    let trimmed = prompt.trim_end();
    if trimmed.is_empty() {
        text
    } else {
        format!("{trimmed} {text}")
    }
}

/// `prompt` without the tags of LoRA `name`.
pub fn remove(prompt: &str, name: &str) -> String {
    let out = TAG.replace_all(prompt, |c: &regex::Captures<'_>| {
        let is_this =
            matches!(&c[1], "lora" | "lyco") && lora(&c[2]).is_some_and(|t| t.name == name);
        if is_this {
            String::new()
        } else {
            c[0].to_string()
        }
    });
    out.split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The tag as A1111 writes it: one strength when both are equal.
pub fn format_tag(tag: &LoraTag) -> String {
    let n = |v: f32| {
        let s = format!("{:.2}", v);
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if tag.te == tag.unet {
        format!("<lora:{}:{}>", tag.name, n(tag.te))
    } else {
        format!("<lora:{}:{}:{}>", tag.name, n(tag.te), n(tag.unet))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str, te: f32, unet: f32) -> LoraTag {
        LoraTag {
            name: name.into(),
            te,
            unet,
        }
    }

    #[test]
    fn tags_read_as_a1111_reads_them() {
        let t = parse(
            "a fox <lora:inkStyle:0.8>, <lora:detail> <lyco:paper:0.5:0.3> \
             <lora:mix:te=0.2:unet=0.7> <lora:half:1:unet=0.5> <hypernet:old:1> <lora:bad:x>",
        );
        assert_eq!(
            t.loras,
            [
                tag("inkStyle", 0.8, 0.8),
                tag("detail", 1.0, 1.0),
                tag("paper", 0.5, 0.3),
                tag("mix", 0.2, 0.7),
                tag("half", 1.0, 0.5),
            ]
        );
        assert_eq!(t.ignored, ["<hypernet:old:1>", "<lora:bad:x>"]);
        assert_eq!(strip("a fox <lora:inkStyle:0.8>, red"), "a fox , red");
        assert_eq!(strip("no tags (here:1.2)"), "no tags (here:1.2)");
    }

    #[test]
    fn the_studio_edits_tags_in_place() {
        let p = "a fox <lora:ink:0.8>, red";
        assert_eq!(set(p, &tag("ink", 0.5, 0.5)), "a fox <lora:ink:0.5>, red");
        assert_eq!(
            set(p, &tag("paper", 1.0, 0.25)),
            "a fox <lora:ink:0.8>, red <lora:paper:1:0.25>"
        );
        assert_eq!(set("", &tag("ink", 0.75, 0.75)), "<lora:ink:0.75>");
        assert_eq!(remove(p, "ink"), "a fox , red");
        assert_eq!(
            parse(&set(p, &tag("ink", 0.3, 0.6))).loras,
            [tag("ink", 0.3, 0.6)]
        );
    }
}
