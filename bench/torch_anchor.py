"""PyTorch/diffusers anchor timings for SD components on one GPU (random weights, same shapes).

Prints a table of median milliseconds (CUDA events) and peak memory for:
SD1.5 UNet (batch 2 = CFG, 64x64 latent), SD1.5 VAE decode 512^2, TAESD decode 512^2,
CLIP ViT-L text encoder, a 20-step Euler loop (UNet only), a whole 20-step txt2img (CLIP + Euler CFG loop +
VAE decode + uint8 image), the UNet in fp32 with TF32 off, SDXL UNet (batch 2, 128x128).
fp16 with SDPA attention (diffusers default), then torch.compile for the SD1.5 UNet.
"""
import json, os, sys, time
import torch
from diffusers import UNet2DConditionModel, AutoencoderKL, AutoencoderTiny
from transformers import CLIPTextConfig, CLIPTextModel

# PARTS (comma separated) picks sections; unset runs them all: unet16, euler20, vae, taesd, clip,
# e2e, hires, unet32, compile, sdxl, sdxl_e2e, sdxl_refiner; only when named: prof (SD 1.5's UNet step
# and VAE decode by kernel class), sdxl_prof (SDXL's step by kernel class). (Latent Studio's copy: the shared script
# plus this switch, the refiner and the kernel profiles.)
PARTS = set(p for p in os.environ.get("PARTS", "").split(",") if p)


# Parts that run only when named (kernel profiles: slower, and not timings).
OPT_IN = {"prof", "sdxl_prof"}


def want(part):
    return part in PARTS if part in OPT_IN else (not PARTS or part in PARTS)


dev = "cuda"
dt = torch.float16
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
results = {}


def bench(name, fn, iters=30, warm=5):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    med = times[len(times) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30
    results[name] = {"median_ms": med, "min_ms": times[0], "max_ms": times[-1], "peak_gib": peak}
    print(f"{name:40s} median {med:9.3f} ms  min {times[0]:9.3f}  max {times[-1]:9.3f}  peak {peak:6.2f} GiB", flush=True)


def kernel_class(name):
    """What a CUDA kernel does, from its name (cuDNN's, cuBLAS's, PyTorch's own)."""
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "attn", "softmax")):
        return "attention"
    if any(k in n for k in ("fprop", "conv", "winograd", "implicit")):
        return "convolution"
    if any(k in n for k in ("nchwtonhwc", "nhwctonchw", "transpose", "permute")):
        return "layout"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "cublas", "gemv", "nvjet")):
        return "gemm"
    if "norm" in n or "moments" in n:
        return "norm"
    if "memcpy" in n or "memset" in n:
        return "memory"
    return "elementwise/other"


def profile_kernels(name, fn, steps=5):
    """Device time of every kernel over `steps` calls of `fn` (torch.profiler), per call: the
    total by class, then the 25 largest kernels."""
    from torch.profiler import profile, ProfilerActivity
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    by_name = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        tr = getattr(e, "time_range", None)
        us = (tr.end - tr.start) if tr is not None else getattr(e, "device_time", 0)
        ms, count = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (ms + us / 1000.0, count + 1)
    classes = {}
    for k, (ms, count) in by_name.items():
        c = kernel_class(k)
        cms, ccount = classes.get(c, (0.0, 0))
        classes[c] = (cms + ms, ccount + count)
    total = sum(ms for ms, _ in classes.values()) / steps
    print(f"{name}: {total:.2f} ms of kernels a call (torch.profiler, {steps} calls)", flush=True)
    for c, (ms, count) in sorted(classes.items(), key=lambda kv: -kv[1][0]):
        print(f"  {c:20s} {ms / steps:8.3f} ms  {count / steps:6.1f} launches", flush=True)
    for k, (ms, count) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {ms / steps:8.3f} ms {count / steps:6.1f}x  [{kernel_class(k)}] {k[:150]}", flush=True)


@torch.inference_mode()
def main():
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).to(dev, dt).eval()
    print("sd15 unet params", sum(p.numel() for p in unet.parameters()) / 1e6, flush=True)
    x = torch.randn(2, 4, 64, 64, device=dev, dtype=dt)
    ctx = torch.randn(2, 77, 768, device=dev, dtype=dt)
    t = torch.tensor([500.0, 500.0], device=dev)
    if want("unet16"):
        bench("sd15_unet_b2_64x64_fp16", lambda: unet(x, t, ctx).sample)
    if want("prof"):
        profile_kernels("sd15_unet_b2_64x64_fp16", lambda: unet(x, t, ctx).sample)

    def euler20():
        lat = torch.randn(1, 4, 64, 64, device=dev, dtype=dt)
        for i in range(20):
            inp = torch.cat([lat, lat])
            eps = unet(inp, t, ctx).sample
            u, c = eps.chunk(2)
            lat = lat + 0.01 * (u + 7.5 * (c - u))
        return lat
    if want("euler20"):
        bench("sd15_euler20_loop_fp16", euler20, iters=5, warm=1)

    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512),
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=2, latent_channels=4, sample_size=512).to(dev, dt).eval()
    z = torch.randn(1, 4, 64, 64, device=dev, dtype=dt)
    if want("vae"):
        bench("sd15_vae_decode_512_fp16", lambda: vae.decode(z).sample, iters=20)
    if want("prof"):
        profile_kernels("sd15_vae_decode_512_fp16", lambda: vae.decode(z).sample)
    if want("vae"):
        vae32 = vae.to(torch.float32)
        z32 = z.float()
        bench("sd15_vae_decode_512_fp32", lambda: vae32.decode(z32).sample, iters=10)
        del vae32
    del vae

    taesd = AutoencoderTiny().to(dev, dt).eval()
    if want("taesd"):
        bench("taesd_decode_512_fp16", lambda: taesd.decode(z).sample, iters=50)
    del taesd

    cfg = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                         num_hidden_layers=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)
    te = CLIPTextModel(cfg).to(dev, dt).eval()
    ids = torch.randint(0, 49407, (2, 77), device=dev)
    if want("clip"):
        bench("clip_l_text_b2_fp16", lambda: te(ids).last_hidden_state, iters=50)
    del te

    # The whole 20-step txt2img as a pipeline runs it (tokenizing aside): CLIP on (uncond, cond),
    # Euler with CFG 7.5 over the UNet at batch 2, VAE decode, uint8 image on the host.
    from diffusers import EulerDiscreteScheduler
    te = CLIPTextModel(cfg).to(dev, dt).eval()
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                        sample_size=512).to(dev, dt).eval()
    sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   steps_offset=1, timestep_spacing="leading")

    def denoise(lat, timesteps, emb):
        for ts in timesteps:
            inp = sched.scale_model_input(torch.cat([lat, lat]), ts)
            u, c = unet(inp, ts, emb).sample.chunk(2)
            lat = sched.step(u + 7.5 * (c - u), ts, lat).prev_sample
        return lat

    def to_image(lat):
        img = vae.decode(lat / 0.18215).sample
        return (img / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8).cpu()

    def txt2img20():
        emb = te(ids).last_hidden_state
        sched.set_timesteps(20, device=dev)
        lat = torch.randn(1, 4, 64, 64, device=dev, dtype=dt) * sched.init_noise_sigma
        return to_image(denoise(lat, sched.timesteps, emb))
    if want("e2e"):
        bench("sd15_txt2img_512_20steps_e2e_fp16", txt2img20, iters=5, warm=1)

    # A1111's hires fix as `bench --hires-scale 2` runs it (diffusers has no such pipeline): the
    # 20-step 512² txt2img, its latents upscaled x2 (bilinear: A1111's "Latent" upscaler), noised
    # to the 11th of 20 timesteps and denoised over the last 10 at 1024² (10 hires steps at
    # strength 0.5), the 1024² decode, uint8 image on the host.
    def hires20():
        emb = te(ids).last_hidden_state
        sched.set_timesteps(20, device=dev)
        lat = torch.randn(1, 4, 64, 64, device=dev, dtype=dt) * sched.init_noise_sigma
        lat = denoise(lat, sched.timesteps, emb)
        lat = torch.nn.functional.interpolate(lat, scale_factor=2, mode="bilinear")
        sched.set_timesteps(20, device=dev)
        tail = sched.timesteps[10:]
        sched.set_begin_index(10)
        lat = sched.add_noise(lat, torch.randn_like(lat), tail[:1])
        return to_image(denoise(lat, tail, emb))
    if want("hires"):
        bench("sd15_txt2img_512_hires_x2_1024_20_10steps_e2e_fp16", hires20, iters=5, warm=1)
    del te, vae

    # fp32 UNet with TF32 off (true fp32 on both sides).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    unet32 = UNet2DConditionModel(sample_size=64, cross_attention_dim=768, attention_head_dim=8).to(dev).eval()
    if want("unet32"):
        bench("sd15_unet_b2_64x64_fp32_notf32", lambda: unet32(x.float(), t, ctx.float()).sample, iters=10)
    del unet32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.cuda.empty_cache()

    if want("compile") and os.environ.get("SKIP_COMPILE") != "1":
        t0 = time.time()
        cunet = torch.compile(unet)
        cunet(x, t, ctx)
        print(f"compile took {time.time()-t0:.1f}s", flush=True)
        bench("sd15_unet_b2_64x64_fp16_compiled", lambda: cunet(x, t, ctx).sample)
    del unet
    torch.cuda.empty_cache()

    if want("sdxl") or want("sdxl_prof") or want("sdxl_e2e") or want("sdxl_refiner"):
        sdxl(t)

    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "torch_anchor.json"), "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


@torch.inference_mode()
def sdxl(t):
    xl = UNet2DConditionModel(sample_size=128, block_out_channels=(320, 640, 1280),
                              down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                              up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                              transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
                              cross_attention_dim=2048, addition_embed_type="text_time", addition_time_embed_dim=256,
                              projection_class_embeddings_input_dim=2816, use_linear_projection=True,
                              layers_per_block=2).to(dev, dt).eval()
    print("sdxl unet params", sum(p.numel() for p in xl.parameters()) / 1e6, flush=True)
    xx = torch.randn(2, 4, 128, 128, device=dev, dtype=dt)
    cx = torch.randn(2, 77, 2048, device=dev, dtype=dt)
    add = {"text_embeds": torch.randn(2, 1280, device=dev, dtype=dt), "time_ids": torch.randn(2, 6, device=dev, dtype=dt)}
    if want("sdxl"):
        bench("sdxl_unet_b2_128x128_fp16", lambda: xl(xx, t, cx, added_cond_kwargs=add).sample, iters=20)
    if want("sdxl_prof"):
        profile_kernels("sdxl_unet_b2_128x128_fp16", lambda: xl(xx, t, cx, added_cond_kwargs=add).sample)
    if not (want("sdxl_e2e") or want("sdxl_refiner")):
        return
    # The whole 20-step 1024^2 txt2img as StableDiffusionXLPipeline runs it (tokenizing aside):
    # both encoders' penultimate states side by side and bigG's projected pooled output, Euler
    # ("leading") with CFG 7.5 over the UNet at batch 2, VAE decode, uint8 image on the host.
    # Its peak (max_memory_allocated, weights included) is what SDXL's <= 8 GiB is measured against.
    from diffusers import EulerDiscreteScheduler
    from transformers import CLIPTextModelWithProjection
    te1 = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                       num_attention_heads=12, projection_dim=768)).to(dev, dt).eval()
    te2 = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                                     num_attention_heads=20, projection_dim=1280,
                                                     hidden_act="gelu")).to(dev, dt).eval()
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4,
                        sample_size=1024, scaling_factor=0.13025).to(dev, dt).eval()
    sched = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                   steps_offset=1, timestep_spacing="leading")
    ids = torch.randint(0, 49408, (2, 77), device=dev)
    time_ids = torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * 2, device=dev, dtype=dt)

    def txt2img20():
        h1 = te1(ids, output_hidden_states=True).hidden_states[-2]
        o2 = te2(ids, output_hidden_states=True)
        emb = torch.cat([h1, o2.hidden_states[-2]], dim=-1)
        cond = {"text_embeds": o2.text_embeds, "time_ids": time_ids}
        sched.set_timesteps(20, device=dev)
        lat = torch.randn(1, 4, 128, 128, device=dev, dtype=dt) * sched.init_noise_sigma
        for ts in sched.timesteps:
            inp = sched.scale_model_input(torch.cat([lat, lat]), ts)
            u, c = xl(inp, ts, emb, added_cond_kwargs=cond).sample.chunk(2)
            lat = sched.step(u + 7.5 * (c - u), ts, lat).prev_sample
        img = vae.decode(lat / 0.13025).sample
        return (img / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
    if want("sdxl_e2e"):
        bench("sdxl_txt2img_1024_20steps_e2e_fp16", txt2img20, iters=3, warm=1)
    if not want("sdxl_refiner"):
        return
    # The refiner (stabilityai/stable-diffusion-xl-refiner-1.0's UNet config, its own bigG) taking
    # over at 0.8, as diffusers' ensemble of experts runs it (base denoising_end=0.8, refiner
    # denoising_start=0.8, one Euler schedule): the base for timesteps >= 200, the refiner below,
    # its negative with the low aesthetic score and no crop.
    ref = UNet2DConditionModel(sample_size=128, block_out_channels=(384, 768, 1536, 1536),
                               down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                                 "DownBlock2D"),
                               up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                               transformer_layers_per_block=4, attention_head_dim=(6, 12, 24, 24),
                               cross_attention_dim=1280, addition_embed_type="text_time", addition_time_embed_dim=256,
                               projection_class_embeddings_input_dim=2560, use_linear_projection=True,
                               layers_per_block=2).to(dev, dt).eval()
    print("sdxl refiner unet params", sum(p.numel() for p in ref.parameters()) / 1e6, flush=True)
    te2r = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                                                      num_attention_heads=20, projection_dim=1280,
                                                      hidden_act="gelu")).to(dev, dt).eval()
    cr = torch.randn(2, 77, 1280, device=dev, dtype=dt)
    rids = torch.tensor([[1024, 1024, 0, 0, 2.5], [1024, 1024, 0, 0, 6.0]], device=dev, dtype=dt)
    radd = {"text_embeds": torch.randn(2, 1280, device=dev, dtype=dt), "time_ids": rids}
    bench("sdxl_refiner_unet_b2_128x128_fp16", lambda: ref(xx, t, cr, added_cond_kwargs=radd).sample, iters=20)

    def refined20():
        h1 = te1(ids, output_hidden_states=True).hidden_states[-2]
        o2 = te2(ids, output_hidden_states=True)
        emb = torch.cat([h1, o2.hidden_states[-2]], dim=-1)
        cond = {"text_embeds": o2.text_embeds, "time_ids": time_ids}
        r2 = te2r(ids, output_hidden_states=True)
        rcond = {"text_embeds": r2.text_embeds, "time_ids": rids}
        sched.set_timesteps(20, device=dev)
        lat = torch.randn(1, 4, 128, 128, device=dev, dtype=dt) * sched.init_noise_sigma
        for ts in sched.timesteps:
            inp = sched.scale_model_input(torch.cat([lat, lat]), ts)
            if ts >= 200:
                u, c = xl(inp, ts, emb, added_cond_kwargs=cond).sample.chunk(2)
            else:
                u, c = ref(inp, ts, r2.hidden_states[-2], added_cond_kwargs=rcond).sample.chunk(2)
            lat = sched.step(u + 7.5 * (c - u), ts, lat).prev_sample
        img = vae.decode(lat / 0.13025).sample
        return (img / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
    bench("sdxl_refined_txt2img_1024_20steps_e2e_fp16", refined20, iters=3, warm=1)


if __name__ == "__main__":
    main()
