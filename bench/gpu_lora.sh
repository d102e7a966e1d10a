#!/bin/bash
# LoRA on a lent GPU (issue 16): full-size SD 1.5 with random weights in f16, a rank-$RANK LoRA on
# every matrix and convolution of the text encoder and UNet. Prints what merging costs once (on
# the device, from the kept tensors), the UNet step replayed with the merged weights against the
# base (three rounds interleaved), and what the same rank's products beside every UNet layer of
# one step take (the low-rank alternative to merging).
# Carry .gl (Vulkan loader) and .gpu/latent-studio.gz (stripped release build).
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a $OUT/gpu.txt
gunzip -c .gpu/latent-studio.gz > /tmp/ls && chmod +x /tmp/ls
export RUST_LOG=warn
for rank in ${RANKS:-32 128}; do
  timeout ${LORA_TIMEOUT:-540} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops \
    --no-burn-ops --lora-rank $rank 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee -a $OUT/lora.txt
done
