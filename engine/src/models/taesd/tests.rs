use super::*;

#[test]
fn standard_is_diffusers_default() {
    let c = TaesdConfig::standard();
    assert_eq!(c.block_out_channels, [64, 64, 64, 64]);
    assert_eq!(c.num_blocks, [3, 3, 3, 1]);
    assert_eq!(c.upscale(), 8);
    assert_eq!(TaesdConfig::from_json("{}").unwrap(), c);
}

#[test]
fn parses_diffusers_config() {
    // diffusers writes the decoder widths twice; the explicit decoder key wins.
    let text = r#"{"_class_name": "AutoencoderTiny", "act_fn": "relu", "block_out_channels": [8, 8, 8],
        "decoder_block_out_channels": [16, 16, 16], "encoder_block_out_channels": [32, 32, 32],
        "latent_channels": 16, "num_decoder_blocks": [2, 1, 1], "num_encoder_blocks": [1, 1, 1],
        "out_channels": 3, "upsample_fn": "nearest", "upsampling_scaling_factor": 2,
        "latent_magnitude": 3, "latent_shift": 0.5, "scaling_factor": 1.0}"#;
    let c = TaesdConfig::from_json(text).unwrap();
    assert_eq!(
        c,
        TaesdConfig {
            latent_channels: 16,
            block_out_channels: vec![16, 16, 16],
            num_blocks: vec![2, 1, 1],
            upsample_factor: 2,
            out_channels: 3,
        }
    );
    assert_eq!(c.upscale(), 4);
    let only_shared = r#"{"block_out_channels": [8, 8], "num_decoder_blocks": [1, 1]}"#;
    assert_eq!(
        TaesdConfig::from_json(only_shared)
            .unwrap()
            .block_out_channels,
        [8, 8]
    );
}

#[test]
fn rejects_bad_configs() {
    for text in [
        r#"{"act_fn": "silu"}"#,
        r#"{"upsample_fn": "bilinear"}"#,
        r#"{"decoder_block_out_channels": [64, 64], "num_decoder_blocks": [1, 1, 1]}"#,
        r#"{"decoder_block_out_channels": [], "num_decoder_blocks": []}"#,
        r#"{"upsampling_scaling_factor": 0}"#,
        r#"{"latent_channels": "four"}"#,
        "not json",
    ] {
        assert!(TaesdConfig::from_json(text).is_err(), "{text}");
    }
}

#[test]
fn detects_layouts() {
    let madebyollin = ["1.weight", "1.bias", "3.conv.0.weight", "19.bias"];
    assert_eq!(
        TaesdLayout::detect(madebyollin),
        Some(TaesdLayout::Madebyollin)
    );
    let diffusers = [
        "encoder.layers.0.weight",
        "decoder.layers.0.weight",
        "decoder.layers.2.conv.0.weight",
    ];
    assert_eq!(TaesdLayout::detect(diffusers), Some(TaesdLayout::Diffusers));
    let vae = ["decoder.conv_in.weight", "encoder.conv_in.weight"];
    assert_eq!(TaesdLayout::detect(vae), None);
    let ldm = [
        "first_stage_model.decoder.conv_in.weight",
        "model.diffusion_model.x",
    ];
    assert_eq!(TaesdLayout::detect(ldm), None);
    assert_eq!(TaesdLayout::detect(["encoder.layers.0.weight"]), None);
    assert_eq!(TaesdLayout::detect(Vec::<&str>::new()), None);
}

#[test]
fn maps_names_to_stored_keys() {
    let m = TaesdLayout::Madebyollin;
    assert_eq!(m.stored_key("0.weight"), "1.weight");
    assert_eq!(m.stored_key("2.conv.4.bias"), "3.conv.4.bias");
    assert_eq!(m.stored_key("18.weight"), "19.weight");
    let d = TaesdLayout::Diffusers;
    assert_eq!(
        d.stored_key("2.conv.4.bias"),
        "decoder.layers.2.conv.4.bias"
    );
    assert_eq!((d.key_map())("0.bias"), "decoder.layers.0.bias");
}

#[test]
fn random_weights_decode_to_8x_images() {
    let device = Device::flex();
    let config = TaesdConfig {
        block_out_channels: vec![4; 4],
        num_blocks: vec![1, 0, 1, 1],
        ..TaesdConfig::standard()
    };
    let w = Weights::random("TAESD decoder", &device, DType::F32);
    let decoder = TaesdDecoder::load(&w, &config).unwrap();
    let z = Tensor::<4>::zeros([2, 4, 3, 5], (&device, DType::F32));
    assert_eq!(decoder.decode(z).dims(), [2, 3, 24, 40]);
}
