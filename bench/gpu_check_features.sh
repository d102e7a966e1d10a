#!/bin/bash
# The artist's features on a real GPU's fast path (SPIR-V, cooperative matrices) against the CPU
# backend, with the tiny fixture model: txt2img, img2img, inpainting, hires fix (both upscalers),
# LoRAs (a kohya file with LoCon layers and a diffusers/PEFT one at once), each image made on both
# devices with the same seed, then the largest pixel difference.
# Also the tiny SD 2.x model (v-prediction, OpenCLIP text tower) from both layouts and with the
# LCM sampler, and once in f16 on the GPU (our cooperative-matrix kernels run in f16 only)
# against f32 on the CPU, where only the largest difference is reported.
# Carry .gl (Vulkan loader) and .gpu/latent-studio.gz or .xz; f32 so the two devices can agree
# to ±1.
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a $OUT/gpu.txt
if [ -f .gpu/latent-studio.xz ]; then
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)" .gpu/latent-studio.xz > /tmp/ls
else
  gunzip -c .gpu/latent-studio.gz > /tmp/ls
fi
chmod +x /tmp/ls
F=tests/fixtures
COMMON="--model $F/tiny-sd --prompt a_fox_in_tinystyle --negative blurry --seed 7 --steps 6 --precision f32 --overwrite --embeddings $F/embeddings"
run() {  # name, extra args
  for dev in gpu cpu; do
    timeout 120 /tmp/ls generate $COMMON --device $dev --out $OUT/$1-$dev.png "${@:2}" > $OUT/$1-$dev.log 2>&1
    echo "$1 $dev rc=$?" | tee -a $OUT/summary.txt
  done
}
run txt2img --width 64 --height 64
run img2img --init-image $F/img2img-init.png --denoising-strength 0.6
run inpaint --init-image $F/img2img-init.png --mask $F/img2img-mask.png --denoising-strength 0.75 --sampler euler_a
run hires_latent --width 64 --height 48 --hires-scale 1.5 --hires-steps 3 --hires-strength 0.5
run hires_lanczos --width 64 --height 48 --hires-scale 1.5 --hires-steps 3 --hires-strength 0.5 --hires-upscaler Lanczos
run lora --width 64 --height 64 --loras $F/loras --lora kohya:0.7 --lora peft:0.5:0.8
run_sd2() {  # name, model, gpu precision, extra args
  for dev in gpu cpu; do
    precision=f32; [ $dev = gpu ] && precision=$3
    timeout 120 /tmp/ls generate --model $F/$2 --prompt "a lighthouse at night" --negative fog --seed 7 --steps 6 --width 64 --height 64 --precision $precision --overwrite --device $dev --out $OUT/$1-$dev.png "${@:4}" > $OUT/$1-$dev.log 2>&1
    echo "$1 $dev rc=$?" | tee -a $OUT/summary.txt
  done
}
run_sd2 sd2_folder tiny-sd2 f32 --sampler ddim
run_sd2 sd2_single tiny-sd2.safetensors f32
run_sd2 sd2_lcm tiny-sd2 f32 --sampler lcm --cfg 1.5
run_sd2 sd2_f16 tiny-sd2 f16
python3 - "$OUT" <<'PY' | tee -a $OUT/summary.txt
import os, struct, sys, zlib

def read_png(path):
    """8-bit RGB, non-interlaced (what latent-studio writes): rows of bytes."""
    data = open(path, "rb").read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), w * 3, [], bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], prev[i - 3] if i >= 3 else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line); prev = line
    return w, h, rows

out = sys.argv[1]
for name in ["txt2img", "img2img", "inpaint", "hires_latent", "hires_lanczos", "lora", "sd2_folder", "sd2_single", "sd2_lcm", "sd2_f16"]:
    a, b = (os.path.join(out, f"{name}-{d}.png") for d in ("gpu", "cpu"))
    if not (os.path.exists(a) and os.path.exists(b)):
        print(name, "missing"); continue
    (wa, ha, ra), (wb, hb, rb) = read_png(a), read_png(b)
    if (wa, ha) != (wb, hb):
        print(name, "sizes differ", (wa, ha), (wb, hb)); continue
    worst = max(abs(x - y) for la, lb in zip(ra, rb) for x, y in zip(la, lb))
    print(name, f"{wa}x{ha}", "max |gpu - cpu|", worst)
PY
