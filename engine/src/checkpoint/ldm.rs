//! The original LDM single-file layout (A1111, ComfyUI, CivitAI downloads) as rename tables from
//! diffusers names. Each rule is the inverse of one rule in diffusers' `single_file_utils.py`.

use crate::unet::UNetConfig;
use crate::vae::VaeConfig;

pub const UNET_PREFIX: &str = "model.diffusion_model.";
pub const VAE_PREFIX: &str = "first_stage_model.";
pub const CLIP_PREFIX: &str = "cond_stage_model.transformer.";
/// SD 2.x files store OpenCLIP's text tower under this, in OpenCLIP's own names.
pub const OPENCLIP_PREFIX: &str = "cond_stage_model.model.";
/// SDXL files (SGM layout) store CLIP ViT-L under this, in transformers' names …
pub const SDXL_CLIP_PREFIX: &str = "conditioner.embedders.0.transformer.";
/// … and OpenCLIP ViT-bigG under this, in OpenCLIP's names, its projection as `text_projection`.
pub const SDXL_OPENCLIP_PREFIX: &str = "conditioner.embedders.1.model.";
/// The SDXL refiner's files hold bigG alone, as the first (and only) embedder.
pub const SDXL_REFINER_OPENCLIP_PREFIX: &str = "conditioner.embedders.0.model.";

/// Splits `a.b.rest` into (`a`, `b`, `rest`).
fn split3(name: &str) -> Option<(&str, &str, &str)> {
    let mut it = name.splitn(3, '.');
    Some((it.next()?, it.next()?, it.next()?))
}

/// Resnet parameter names: diffusers `ResnetBlock2D` -> LDM `ResBlock`.
fn unet_resnet(rest: &str) -> String {
    const RULES: [(&str, &str); 6] = [
        ("norm1.", "in_layers.0."),          // GroupNorm before the first conv
        ("conv1.", "in_layers.2."),          // first 3x3 conv (index 1 is SiLU)
        ("time_emb_proj.", "emb_layers.1."), // time embedding projection (index 0 is SiLU)
        ("norm2.", "out_layers.0."),
        ("conv2.", "out_layers.3."), // indices 1, 2 are SiLU and dropout
        ("conv_shortcut.", "skip_connection."),
    ];
    rename(rest, &RULES)
}

fn rename(rest: &str, rules: &[(&str, &str)]) -> String {
    for (from, to) in rules {
        if let Some(tail) = rest.strip_prefix(from) {
            return format!("{to}{tail}");
        }
    }
    rest.to_string()
}

/// diffusers UNet name -> LDM key (with `model.diffusion_model.` prefix).
pub fn unet_key(name: &str, config: &UNetConfig) -> String {
    let per_block = config.layers_per_block + 1; // resnets (+ attentions) then a down/upsampler
    let key = unet_key_inner(name, config, per_block).unwrap_or_else(|| name.to_string());
    format!("{UNET_PREFIX}{key}")
}

fn unet_key_inner(name: &str, config: &UNetConfig, per_block: usize) -> Option<String> {
    let top = [
        ("time_embedding.linear_1.", "time_embed.0."),
        ("time_embedding.linear_2.", "time_embed.2."),
        // SDXL's added conditioning.
        ("add_embedding.linear_1.", "label_emb.0.0."),
        ("add_embedding.linear_2.", "label_emb.0.2."),
        ("conv_in.", "input_blocks.0.0."),
        ("conv_norm_out.", "out.0."),
        ("conv_out.", "out.2."),
    ];
    for (from, to) in top {
        if let Some(tail) = name.strip_prefix(from) {
            return Some(format!("{to}{tail}"));
        }
    }
    if let Some(rest) = name.strip_prefix("mid_block.") {
        let (kind, idx, tail) = split3(rest)?;
        return Some(match (kind, idx) {
            ("resnets", "0") => format!("middle_block.0.{}", unet_resnet(tail)),
            ("attentions", "0") => format!("middle_block.1.{tail}"),
            ("resnets", "1") => format!("middle_block.2.{}", unet_resnet(tail)),
            _ => return None,
        });
    }
    let (group, block, rest) = split3(name)?;
    let block: usize = block.parse().ok()?;
    let (kind, idx, tail) = split3(rest)?;
    let idx: usize = idx.parse().ok()?;
    match (group, kind) {
        ("down_blocks", "resnets") => Some(format!(
            "input_blocks.{}.0.{}",
            1 + block * per_block + idx,
            unet_resnet(tail)
        )),
        ("down_blocks", "attentions") => Some(format!(
            "input_blocks.{}.1.{tail}",
            1 + block * per_block + idx
        )),
        // `downsamplers.0.conv.weight` -> `input_blocks.N.0.op.weight`
        ("down_blocks", "downsamplers") => {
            let tail = tail.strip_prefix("conv.")?;
            Some(format!(
                "input_blocks.{}.0.op.{tail}",
                1 + block * per_block + per_block - 1
            ))
        }
        ("up_blocks", "resnets") => Some(format!(
            "output_blocks.{}.0.{}",
            block * per_block + idx,
            unet_resnet(tail)
        )),
        ("up_blocks", "attentions") => Some(format!(
            "output_blocks.{}.1.{tail}",
            block * per_block + idx
        )),
        // The upsampler follows the last resnet, and its attention if the block has one.
        ("up_blocks", "upsamplers") => {
            let slot = if config.up_has_attention(block) { 2 } else { 1 };
            Some(format!(
                "output_blocks.{}.{slot}.{tail}",
                block * per_block + per_block - 1
            ))
        }
        _ => None,
    }
}

fn vae_resnet(rest: &str) -> String {
    rename(rest, &[("conv_shortcut.", "nin_shortcut.")])
}

fn vae_attention(rest: &str) -> String {
    const RULES: [(&str, &str); 5] = [
        ("group_norm.", "norm."),
        ("to_q.", "q."),
        ("to_k.", "k."),
        ("to_v.", "v."),
        ("to_out.0.", "proj_out."),
    ];
    rename(rest, &RULES)
}

/// diffusers VAE name -> LDM key (with `first_stage_model.` prefix).
pub fn vae_key(name: &str, config: &VaeConfig) -> String {
    let key =
        vae_key_inner(name, config.block_out_channels.len()).unwrap_or_else(|| name.to_string());
    format!("{VAE_PREFIX}{key}")
}

fn vae_key_inner(name: &str, blocks: usize) -> Option<String> {
    let (coder, rest) = name.split_once('.')?;
    if coder != "encoder" && coder != "decoder" {
        return None; // quant_conv, post_quant_conv keep their names
    }
    if let Some(tail) = rest.strip_prefix("conv_norm_out.") {
        return Some(format!("{coder}.norm_out.{tail}"));
    }
    if let Some(r) = rest.strip_prefix("mid_block.") {
        let (kind, idx, tail) = split3(r)?;
        return Some(match (kind, idx) {
            ("resnets", "0") => format!("{coder}.mid.block_1.{}", vae_resnet(tail)),
            ("resnets", "1") => format!("{coder}.mid.block_2.{}", vae_resnet(tail)),
            ("attentions", "0") => format!("{coder}.mid.attn_1.{}", vae_attention(tail)),
            _ => return None,
        });
    }
    let (group, block, r) = split3(rest)?;
    let block: usize = block.parse().ok()?;
    let (kind, idx, tail) = split3(r)?;
    match (group, kind) {
        ("down_blocks", "resnets") => Some(format!(
            "encoder.down.{block}.block.{idx}.{}",
            vae_resnet(tail)
        )),
        ("down_blocks", "downsamplers") => Some(format!("encoder.down.{block}.downsample.{tail}")),
        // LDM numbers decoder levels from the lowest resolution up; diffusers the other way.
        ("up_blocks", "resnets") => Some(format!(
            "decoder.up.{}.block.{idx}.{}",
            blocks - 1 - block,
            vae_resnet(tail)
        )),
        ("up_blocks", "upsamplers") => {
            Some(format!("decoder.up.{}.upsample.{tail}", blocks - 1 - block))
        }
        _ => None,
    }
}

/// transformers `CLIPTextModel` name -> SD 2.x single-file key: OpenCLIP's names (the inverse of
/// `convert_open_clip_checkpoint`). q, k and v are parts of OpenCLIP's fused `in_proj_*`, made
/// readable by [`split_openclip`].
pub fn openclip_key(name: &str) -> String {
    openclip_key_under(OPENCLIP_PREFIX, name)
}

/// [`openclip_key`] under `prefix` (SD 2.x's or SDXL's). OpenCLIP keeps the projection it
/// right-multiplies, `text_projection` `[hidden, proj]`: the transpose of transformers'
/// `text_projection.weight`, which therefore maps to no stored key (the encoder reads
/// `text_projection` as it lies, [`crate::clip::ClipTextModel::load`]).
pub fn openclip_key_under(prefix: &str, name: &str) -> String {
    let key = match name {
        "text_projection" => Some("text_projection".to_string()),
        "text_projection.weight" => Some("text_projection.weight (stored transposed)".to_string()),
        _ => openclip_key_inner(name),
    };
    format!("{prefix}{}", key.unwrap_or_else(|| name.to_string()))
}

fn openclip_key_inner(name: &str) -> Option<String> {
    let name = name.strip_prefix("text_model.").unwrap_or(name);
    match name {
        "embeddings.token_embedding.weight" => return Some("token_embedding.weight".into()),
        "embeddings.position_embedding.weight" => return Some("positional_embedding".into()),
        _ => {}
    }
    if let Some(tail) = name.strip_prefix("final_layer_norm.") {
        return Some(format!("ln_final.{tail}"));
    }
    let rest = name.strip_prefix("encoder.layers.")?;
    let (layer, tail) = rest.split_once('.')?;
    const RULES: [(&str, &str); 6] = [
        ("layer_norm1.", "ln_1."),
        ("layer_norm2.", "ln_2."),
        ("mlp.fc1.", "mlp.c_fc."),
        ("mlp.fc2.", "mlp.c_proj."),
        ("self_attn.out_proj.", "attn.out_proj."),
        ("self_attn.", "attn."), // q_proj, k_proj, v_proj: parts of in_proj
    ];
    Some(format!(
        "transformer.resblocks.{layer}.{}",
        rename(tail, &RULES)
    ))
}

/// Splits every fused OpenCLIP `attn.in_proj_weight`/`in_proj_bias` of `file` into the
/// `attn.q_proj`/`k_proj`/`v_proj` parts [`openclip_key`] names (rows q, k, v in that order).
pub fn split_openclip(file: &mut super::SafetensorsFile) -> crate::Result<()> {
    split_openclip_under(file, OPENCLIP_PREFIX)
}

/// [`split_openclip`] for the tower under `prefix`.
pub fn split_openclip_under(file: &mut super::SafetensorsFile, prefix: &str) -> crate::Result<()> {
    let fused: Vec<(String, String, &'static str)> = file
        .entries()
        .keys()
        .filter(|k| k.starts_with(prefix))
        .filter_map(|k| {
            let (base, kind) = k
                .strip_suffix("in_proj_weight")
                .map(|b| (b, "weight"))
                .or_else(|| k.strip_suffix("in_proj_bias").map(|b| (b, "bias")))?;
            Some((k.clone(), base.to_string(), kind))
        })
        .collect();
    for (key, base, kind) in fused {
        let names: Vec<String> = ["q", "k", "v"]
            .iter()
            .map(|p| format!("{base}{p}_proj.{kind}"))
            .collect();
        file.split_rows(&key, &names)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sd15_unet_keys_match_real_files() {
        let c = UNetConfig::sd15();
        let cases = [
            ("conv_in.weight", "input_blocks.0.0.weight"),
            ("time_embedding.linear_2.bias", "time_embed.2.bias"),
            (
                "down_blocks.0.resnets.0.norm1.weight",
                "input_blocks.1.0.in_layers.0.weight",
            ),
            (
                "down_blocks.0.attentions.1.proj_in.weight",
                "input_blocks.2.1.proj_in.weight",
            ),
            (
                "down_blocks.0.downsamplers.0.conv.weight",
                "input_blocks.3.0.op.weight",
            ),
            (
                "down_blocks.1.resnets.0.conv_shortcut.weight",
                "input_blocks.4.0.skip_connection.weight",
            ),
            (
                "down_blocks.3.resnets.1.time_emb_proj.bias",
                "input_blocks.11.0.emb_layers.1.bias",
            ),
            (
                "mid_block.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                "middle_block.1.transformer_blocks.0.attn2.to_k.weight",
            ),
            (
                "mid_block.resnets.1.conv2.weight",
                "middle_block.2.out_layers.3.weight",
            ),
            (
                "up_blocks.0.resnets.2.conv1.weight",
                "output_blocks.2.0.in_layers.2.weight",
            ),
            (
                "up_blocks.0.upsamplers.0.conv.weight",
                "output_blocks.2.1.conv.weight",
            ),
            (
                "up_blocks.1.upsamplers.0.conv.bias",
                "output_blocks.5.2.conv.bias",
            ),
            (
                "up_blocks.3.attentions.2.proj_out.bias",
                "output_blocks.11.1.proj_out.bias",
            ),
            ("conv_norm_out.weight", "out.0.weight"),
            ("conv_out.bias", "out.2.bias"),
        ];
        for (diffusers, ldm) in cases {
            assert_eq!(
                unet_key(diffusers, &c),
                format!("{UNET_PREFIX}{ldm}"),
                "{diffusers}"
            );
        }
    }

    #[test]
    fn sd15_vae_keys_match_real_files() {
        let c = VaeConfig::sd15();
        let cases = [
            (
                "encoder.down_blocks.0.resnets.1.conv2.weight",
                "encoder.down.0.block.1.conv2.weight",
            ),
            (
                "encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
                "encoder.down.1.block.0.nin_shortcut.weight",
            ),
            (
                "encoder.down_blocks.2.downsamplers.0.conv.bias",
                "encoder.down.2.downsample.conv.bias",
            ),
            (
                "encoder.mid_block.attentions.0.to_out.0.weight",
                "encoder.mid.attn_1.proj_out.weight",
            ),
            (
                "decoder.mid_block.attentions.0.group_norm.bias",
                "decoder.mid.attn_1.norm.bias",
            ),
            (
                "decoder.up_blocks.0.resnets.2.norm1.weight",
                "decoder.up.3.block.2.norm1.weight",
            ),
            (
                "decoder.up_blocks.2.upsamplers.0.conv.weight",
                "decoder.up.1.upsample.conv.weight",
            ),
            ("decoder.conv_norm_out.weight", "decoder.norm_out.weight"),
            ("post_quant_conv.weight", "post_quant_conv.weight"),
        ];
        for (diffusers, ldm) in cases {
            assert_eq!(
                vae_key(diffusers, &c),
                format!("{VAE_PREFIX}{ldm}"),
                "{diffusers}"
            );
        }
    }

    #[test]
    fn openclip_keys_match_sd2_files() {
        let cases = [
            (
                "text_model.embeddings.token_embedding.weight",
                "token_embedding.weight",
            ),
            (
                "text_model.embeddings.position_embedding.weight",
                "positional_embedding",
            ),
            ("text_model.final_layer_norm.bias", "ln_final.bias"),
            (
                "text_model.encoder.layers.22.layer_norm1.weight",
                "transformer.resblocks.22.ln_1.weight",
            ),
            (
                "text_model.encoder.layers.0.mlp.fc2.bias",
                "transformer.resblocks.0.mlp.c_proj.bias",
            ),
            (
                "text_model.encoder.layers.3.self_attn.out_proj.weight",
                "transformer.resblocks.3.attn.out_proj.weight",
            ),
            (
                "text_model.encoder.layers.3.self_attn.k_proj.bias",
                "transformer.resblocks.3.attn.k_proj.bias",
            ),
        ];
        for (diffusers, ldm) in cases {
            assert_eq!(
                openclip_key(diffusers),
                format!("{OPENCLIP_PREFIX}{ldm}"),
                "{diffusers}"
            );
        }
    }

    /// SDXL's single-file names (SGM layout, as diffusers' `convert_ldm_unet_checkpoint` and
    /// `convert_open_clip_checkpoint` read them): the added conditioning, bigG's tower under its
    /// own prefix, its projection under OpenCLIP's name only.
    #[test]
    fn sdxl_keys() {
        let c = UNetConfig::sd15();
        assert_eq!(
            unet_key("add_embedding.linear_1.weight", &c),
            format!("{UNET_PREFIX}label_emb.0.0.weight")
        );
        assert_eq!(
            unet_key("add_embedding.linear_2.bias", &c),
            format!("{UNET_PREFIX}label_emb.0.2.bias")
        );
        let g = |n| openclip_key_under(SDXL_OPENCLIP_PREFIX, n);
        assert_eq!(
            g("text_model.encoder.layers.31.mlp.fc1.weight"),
            format!("{SDXL_OPENCLIP_PREFIX}transformer.resblocks.31.mlp.c_fc.weight")
        );
        assert_eq!(
            g("text_projection"),
            format!("{SDXL_OPENCLIP_PREFIX}text_projection")
        );
        assert_ne!(
            g("text_projection.weight"),
            format!("{SDXL_OPENCLIP_PREFIX}text_projection"),
            "transformers' [proj, hidden] is not OpenCLIP's [hidden, proj]"
        );
    }
}
