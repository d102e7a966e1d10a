"""The 20-step 512x512 txt2img of torch_anchor.py alone in its own process (fp16, SDPA, random
weights of the real SD 1.5 shapes), so an outside sampler (nvidia-smi) sees this process's peak
device memory the way it sees latent-studio's. Prints the median of 3 runs and torch's own peaks."""
import time
import torch
from diffusers import UNet2DConditionModel, AutoencoderKL, EulerDiscreteScheduler
from transformers import CLIPTextConfig, CLIPTextModel

dev, dt = "cuda", torch.float16


@torch.inference_mode()
def main():
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).to(dev, dt).eval()
    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                         num_hidden_layers=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)
    te = CLIPTextModel(cfg).to(dev, dt).eval()
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                        sample_size=512).to(dev, dt).eval()
    sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   steps_offset=1, timestep_spacing="leading")
    ids = torch.randint(0, 49407, (2, 77), device=dev)

    def txt2img20():
        emb = te(ids).last_hidden_state
        sched.set_timesteps(20, device=dev)
        lat = torch.randn(1, 4, 64, 64, device=dev, dtype=dt) * sched.init_noise_sigma
        for ts in sched.timesteps:
            inp = sched.scale_model_input(torch.cat([lat, lat]), ts)
            u, c = unet(inp, ts, emb).sample.chunk(2)
            lat = sched.step(u + 7.5 * (c - u), ts, lat).prev_sample
        img = vae.decode(lat / 0.18215).sample
        return (img / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8).cpu()

    txt2img20()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        txt2img20()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print(f"torch txt2img 512x512 20 steps fp16: median {times[1]:.0f} ms; "
          f"max_memory_allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "
          f"max_memory_reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
