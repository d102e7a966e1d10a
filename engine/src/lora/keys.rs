//! What a LoRA file's keys say: which network, which layer, which part. Two naming families are in
//! circulation: kohya-ss / A1111 (`lora_unet_<module with _>.lora_down.weight`, `.alpha`; LoCon uses
//! the same names on convolutions) and diffusers / PEFT (`unet.<module>.lora_A.weight`, and the
//! older `lora.down`, `lora_linear_layer.down` and attention-processor spellings). SDXL's have
//! two text encoders: kohya's `lora_te1_`/`lora_te2_`, diffusers' `text_encoder_2.`.

/// The network a layer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Net {
    TextEncoder,
    /// SDXL's second text encoder (OpenCLIP bigG).
    TextEncoder2,
    Unet,
}

impl Net {
    pub fn label(self) -> &'static str {
        match self {
            Net::TextEncoder => "text encoder",
            Net::TextEncoder2 => "second text encoder",
            Net::Unet => "UNet",
        }
    }
}

/// How a key names its layer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Name {
    /// kohya: the module path with every `.` written `_` (resolved against the model's names).
    Flat(String),
    /// diffusers: the module path itself.
    Dotted(String),
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::Flat(s) | Name::Dotted(s) => f.write_str(s),
        }
    }
}

/// Which tensor of a layer a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `[rank, in, (kh, kw)]`: applied first.
    Down,
    /// `[out, rank, (1, 1)]`.
    Up,
    /// The scalar alpha; the update is scaled by alpha / rank.
    Alpha,
}

/// A key this loader does not apply, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A network of another model family (a transformer's, …).
    Family(&'static str),
    /// A LyCORIS algorithm other than LoRA/LoCon.
    Algorithm(&'static str),
    /// Not a LoRA key of any known format.
    Unknown,
}

/// The network, layer and part a key holds, or why it is refused.
pub fn classify(key: &str) -> Result<(Net, Name, Part), Refusal> {
    if let Some(rest) = key.strip_prefix("lora_") {
        return kohya(rest);
    }
    diffusers(key)
}

fn kohya(rest: &str) -> Result<(Net, Name, Part), Refusal> {
    let (stem, suffix) = rest.split_once('.').ok_or(Refusal::Unknown)?;
    let (net, flat) = if let Some(f) = stem.strip_prefix("unet_") {
        (Net::Unet, f)
    } else if let Some(f) = stem
        .strip_prefix("te_")
        .or_else(|| stem.strip_prefix("te1_"))
    {
        (Net::TextEncoder, f)
    } else if let Some(f) = stem.strip_prefix("te2_") {
        (Net::TextEncoder2, f)
    } else {
        return Err(Refusal::Unknown);
    };
    let part = match suffix {
        "lora_down.weight" => Part::Down,
        "lora_up.weight" => Part::Up,
        "alpha" => Part::Alpha,
        other => return Err(algorithm(other)),
    };
    Ok((net, Name::Flat(flat.to_string()), part))
}

/// The LyCORIS algorithm a non-LoRA suffix belongs to.
fn algorithm(suffix: &str) -> Refusal {
    if suffix.starts_with("hada_") {
        Refusal::Algorithm("LoHa")
    } else if suffix.starts_with("lokr_") {
        Refusal::Algorithm("LoKr")
    } else if suffix.starts_with("lora_mid") {
        Refusal::Algorithm("LoCon with a Tucker (CP) decomposition")
    } else if suffix.starts_with("dora_scale") || suffix.contains("magnitude") {
        Refusal::Algorithm("DoRA")
    } else if suffix.starts_with("diff") || suffix.starts_with("oft_") || suffix.starts_with("ia3")
    {
        Refusal::Algorithm("a full-weight or OFT/IA3 LyCORIS network")
    } else {
        Refusal::Unknown
    }
}

/// diffusers/PEFT: `<net>.<module>.<part>`.
fn diffusers(key: &str) -> Result<(Net, Name, Part), Refusal> {
    let (net, rest) = if let Some(r) = key.strip_prefix("unet.") {
        (Net::Unet, r)
    } else if let Some(r) = key.strip_prefix("text_encoder.") {
        (Net::TextEncoder, r)
    } else if let Some(r) = key.strip_prefix("text_encoder_2.") {
        (Net::TextEncoder2, r)
    } else if key.starts_with("transformer.") {
        return Err(Refusal::Family("a transformer model (Flux, SD3, …)"));
    } else if let Some(r) = key.strip_prefix("base_model.model.") {
        (Net::Unet, r)
    } else {
        return Err(Refusal::Unknown);
    };
    const PARTS: [(&str, Part); 7] = [
        (".lora_A.weight", Part::Down),
        (".lora_B.weight", Part::Up),
        (".lora.down.weight", Part::Down),
        (".lora.up.weight", Part::Up),
        (".lora_linear_layer.down.weight", Part::Down),
        (".lora_linear_layer.up.weight", Part::Up),
        (".alpha", Part::Alpha),
    ];
    for (suffix, part) in PARTS {
        if let Some(module) = rest.strip_suffix(suffix) {
            return Ok((net, Name::Dotted(processor_to_module(module)), part));
        }
    }
    // The attention-processor format: `attn1.processor.to_q_lora.down.weight`.
    for (suffix, part) in [(".down.weight", Part::Down), (".up.weight", Part::Up)] {
        if let Some(module) = rest.strip_suffix(suffix)
            && module.contains(".processor.")
        {
            return Ok((net, Name::Dotted(processor_to_module(module)), part));
        }
    }
    if rest.contains("lora_magnitude_vector") {
        return Err(Refusal::Algorithm("DoRA"));
    }
    Err(Refusal::Unknown)
}

/// `attn1.processor.to_q_lora` → `attn1.to_q`; `to_out_lora` → `to_out.0`.
fn processor_to_module(module: &str) -> String {
    let Some((attn, proc)) = module.split_once(".processor.") else {
        return module.to_string();
    };
    let layer = proc.strip_suffix("_lora").unwrap_or(proc);
    let layer = if layer == "to_out" { "to_out.0" } else { layer };
    format!("{attn}.{layer}")
}

/// A module path as kohya flattens it.
pub fn flatten(module: &str) -> String {
    module.replace('.', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dotted(net: Net, s: &str, part: Part) -> Result<(Net, Name, Part), Refusal> {
        Ok((net, Name::Dotted(s.to_string()), part))
    }

    #[test]
    fn every_known_spelling_is_classified() {
        let q = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q";
        assert_eq!(
            classify("lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"),
            Ok((
                Net::Unet,
                Name::Flat("down_blocks_0_attentions_0_proj_in".into()),
                Part::Down
            ))
        );
        assert_eq!(
            classify("lora_te_text_model_encoder_layers_0_mlp_fc1.alpha"),
            Ok((
                Net::TextEncoder,
                Name::Flat("text_model_encoder_layers_0_mlp_fc1".into()),
                Part::Alpha
            ))
        );
        assert_eq!(
            classify(&format!("unet.{q}.lora_A.weight")),
            dotted(Net::Unet, q, Part::Down)
        );
        assert_eq!(
            classify(&format!("unet.{q}.lora.up.weight")),
            dotted(Net::Unet, q, Part::Up)
        );
        assert_eq!(
            classify(
                "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_out_lora.down.weight"
            ),
            dotted(
                Net::Unet,
                "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_out.0",
                Part::Down
            )
        );
        assert_eq!(
            classify(
                "text_encoder.text_model.encoder.layers.1.self_attn.q_proj.lora_linear_layer.up.weight"
            ),
            dotted(
                Net::TextEncoder,
                "text_model.encoder.layers.1.self_attn.q_proj",
                Part::Up
            )
        );
    }

    #[test]
    fn sdxl_encoders_are_told_apart() {
        let fc1 = "text_model_encoder_layers_0_mlp_fc1";
        assert_eq!(
            classify(&format!("lora_te1_{fc1}.lora_up.weight")),
            Ok((Net::TextEncoder, Name::Flat(fc1.into()), Part::Up))
        );
        assert_eq!(
            classify(&format!("lora_te2_{fc1}.lora_up.weight")),
            Ok((Net::TextEncoder2, Name::Flat(fc1.into()), Part::Up))
        );
        assert_eq!(
            classify("text_encoder_2.text_model.encoder.layers.0.mlp.fc1.lora_A.weight"),
            dotted(
                Net::TextEncoder2,
                "text_model.encoder.layers.0.mlp.fc1",
                Part::Down
            )
        );
    }

    #[test]
    fn other_families_and_algorithms_are_named() {
        assert_eq!(
            classify("transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight"),
            Err(Refusal::Family("a transformer model (Flux, SD3, …)"))
        );
        assert_eq!(
            classify("lora_unet_mid_block_resnets_0_conv1.hada_w1_a"),
            Err(Refusal::Algorithm("LoHa"))
        );
        assert_eq!(
            classify("lora_unet_mid_block_resnets_0_conv1.lokr_w1"),
            Err(Refusal::Algorithm("LoKr"))
        );
        assert_eq!(
            classify("model.diffusion_model.out.2.weight"),
            Err(Refusal::Unknown)
        );
    }
}
