"""Writes a full-size SDXL base diffusers folder with random weights (fp16 safetensors) for
measuring a real checkpoint's load and first image on a GPU: no model hub is reachable, and a
load's memory needs real files of real size. The configs are stabilityai/stable-diffusion-xl-base-1.0's (the same as torch_anchor.py's)."""
import json, os, sys
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sdxl"
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):
    unet = UNet2DConditionModel(
        sample_size=128, block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
        cross_attention_dim=2048, addition_embed_type="text_time", addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816, use_linear_projection=True, layers_per_block=2)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512),
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2,
                        latent_channels=4, sample_size=1024, scaling_factor=0.13025)
    te1 = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                       num_attention_heads=12, max_position_embeddings=77,
                                       hidden_act="quick_gelu", projection_dim=768))
    te2 = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
        max_position_embeddings=77, hidden_act="gelu", projection_dim=1280))
# The UNet and VAE as `*.fp16.safetensors`, the text encoders as `model.safetensors` (both
# spellings occur in downloads; transformers' `variant` differs across its versions).
for name, m, variant in (("unet", unet, "fp16"), ("vae", vae, "fp16"),
                         ("text_encoder", te1, None), ("text_encoder_2", te2, None)):
    kwargs = {"variant": variant} if variant else {}
    m.to(torch.float16).save_pretrained(os.path.join(out, name), **kwargs)
os.makedirs(os.path.join(out, "scheduler"), exist_ok=True)
json.dump({"_class_name": "EulerDiscreteScheduler", "beta_start": 0.00085, "beta_end": 0.012,
           "beta_schedule": "scaled_linear", "num_train_timesteps": 1000,
           "prediction_type": "epsilon", "steps_offset": 1, "timestep_spacing": "leading"},
          open(os.path.join(out, "scheduler", "scheduler_config.json"), "w"))
json.dump({"_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.42.1",
           "force_zeros_for_empty_prompt": True},
          open(os.path.join(out, "model_index.json"), "w"))
print("wrote", out, sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs) / 2**30, "GiB")
