#!/bin/bash
# Issue 6 on the GPU: VAE compilation on/off (WGSL build: our fused kernels are WGSL) and the model
# cache with a full-size SD 1.5 folder of random weights written here by diffusers/transformers.
# Copy this folder's files into .gpu/ with the gzipped WGSL release binary as latent-studio-wgsl.gz.
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
gunzip -c .gpu/latent-studio-wgsl.gz > /tmp/latent-studio && chmod +x /tmp/latent-studio
export RUST_LOG=warn
timeout ${VAE_TIMEOUT:-200} /tmp/latent-studio bench --device gpu --precision f16,f32 --runs 7 --vae-only 2>&1 | tee $OUT/vae.txt
# fp16 and fp32 checkpoints, both loaded as f16 (in separate calls: each takes about 3 minutes).
DTYPE=${DTYPE:-f16}
timeout 150 python3 .gpu/make_sd15.py /tmp/sd15-$DTYPE $DTYPE 2>&1 | grep -v Warning | tee $OUT/make.txt
timeout ${CACHE_TIMEOUT:-400} /tmp/latent-studio bench --device gpu --precision f16 --runs 5 --cache-model /tmp/sd15-$DTYPE --cache-dir /tmp/ls-cache 2>&1 | tee $OUT/cache.txt
