"""Writes a full-size SD 1.5 diffusers folder with random weights (fp16 safetensors) for the
model-cache benchmark: no model hub is reachable, and load timing needs real files of real size."""
import json, os, sys
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sd15"
# fp16 (as the common "-fp16" downloads) or fp32 (as v1-5-pruned-emaonly.safetensors).
dtype = torch.float32 if len(sys.argv) > 2 and sys.argv[2] == "f32" else torch.float16
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(dev):
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8,
                                block_out_channels=(320, 640, 1280, 1280), layers_per_block=2)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
                        block_out_channels=(128, 256, 512, 512),
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512)
    te = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                      num_attention_heads=12, max_position_embeddings=77,
                                      hidden_act="quick_gelu", projection_dim=768))
for name, m in (("unet", unet), ("vae", vae), ("text_encoder", te)):
    m.to(dtype).save_pretrained(os.path.join(out, name))
json.dump({"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.42.1"},
          open(os.path.join(out, "model_index.json"), "w"))
print("wrote", out, sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs) / 2**30, "GiB")
