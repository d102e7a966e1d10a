#!/bin/bash
# Issue 13 on a lent GPU, one part per device call (each call may run 10 minutes):
#   PART=fa PyTorch's SD 1.5 and SDXL steps (`torch_anchor.py` parts unet16,sdxl) first, then
#           the prompt's keys and values projected once a generation against by each
#           cross-attention layer at every step (`--context-ab`) on SD 1.5's and SDXL's steps
#           replayed, each process then profiled by kernel and op (`--kernel-profile 1`, as a
#           generation's step runs). One archive, fa.tgz
#   PART=ff as fe on SD 1.5 alone, with a third rule: the convolutions' fixed 128 × 128 tiles
#           split by the waves model where the model keeps the tile (`waves_fixed_tile`; SDXL's
#           plans are the fill rule's under it). One archive, ff.tgz
#   PART=fe the channels-last convolutions on 128 × 128 tiles split by the fill rule against
#           tiled and split by the GEMM's waves model (`--conv-tiles-ab`) on SD 1.5's and SDXL's
#           steps replayed. One archive, fe.tgz
#   PART=fd PyTorch's SD 1.5 step (part unet16) first, then SD 1.5's step with `--context-ab`
#           (cooperative matrices). One archive, fd.tgz
#   PART=fc PyTorch's SD 1.5 step, 20-step txt2img and SDXL step (parts unet16,e2e,sdxl) first,
#           then SD 1.5's `--context-ab --layernorm-ab`, the default 20-step txt2img and SDXL's
#           `--context-ab --layernorm-ab` (after the capture's fix: the keys and values read
#           where they lie; LayerNorm's rows pooled by plane reductions, level and removed: that
#           call's binary). One archive, fc.tgz
#   PART=fb PyTorch's SD 1.5 step (part unet16) first, then `--context-ab` on the SIMT routes:
#           SPIR-V with the cooperative matrices hidden (an iGPU's Vulkan route), then WGSL. One
#           archive, fb.tgz
#   PART=ea PyTorch's SD 1.5 and SDXL steps (`torch_anchor.py` parts unet16,sdxl) first, then
#           GroupNorm's small channels-last maps in one launch against three, and the skip
#           connections joined by our kernel against burn's cat (`--norm-ab`; the convolutions'
#           bias and time-embedding terms read in place in every rule) on SD 1.5's and SDXL's
#           steps replayed, each process then profiled by kernel and op (`--kernel-profile 1`).
#           One archive, ea.tgz
#   PART=eb PyTorch's SD 1.5 step (part unet16) first, then `--norm-ab` (as ea) on the SIMT
#           routes: SPIR-V with the cooperative matrices hidden (an iGPU's Vulkan route), then
#           WGSL. One archive, eb.tgz
#   PART=ec PyTorch's SD 1.5 step, VAE decode and 20-step txt2img (parts unet16,vae,e2e) first,
#           then eb's SPIR-V SIMT A/B alone (eb's ran after ea on one machine and restored its
#           tuning, taken with cooperative matrices: burn's attention failed), then the default
#           20-step txt2img (`--pipeline-only`, the VAE decode with it) with GroupNorm's slabs
#           and without (`--slab-max 0`). One archive, ec.tgz
#   PART=dz as dy, with tails on by default only where the reduction has 32 steps or more. One
#           archive, dz.tgz
#   PART=dy the waves model with split tails of rows (`GemmKnobs::tails`: a grid's whole waves of
#           row tiles unsplit, the rest split into one more wave) against the model alone and
#           the fill rule (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=waves`) on SD 1.5's and
#           SDXL's steps replayed; SDXL's process then profiled with tails on. One archive,
#           dy.tgz
#   PART=dx PyTorch's SD 1.5 and SDXL steps (`torch_anchor.py` parts unet16,sdxl) first, then
#           the waves model as adopted (splits within one wave; default on) against the fill
#           rule on both steps replayed (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=waves`). One
#           archive, dx.tgz
#   PART=dw the GEMM's tiles and splits by the waves model (`GemmKnobs::waves`) against the fill
#           rule (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=waves`) on SD 1.5's and SDXL's steps
#           replayed, each process then profiled by kernel and op with the model on
#           (`--gemm-waves on --kernel-profile 1`). One archive, dw.tgz
#   PART=dv the fenced sub-steps by rule (default: planes holding 4 accumulators or more) against
#           none (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=fence`) on SD 1.5's step replayed,
#           then SDXL's. One archive, dv.tgz
#   PART=du SD 1.5's and SDXL's steps profiled by kernel and op shape (`--kernel-profile 1`) with
#           the GEMM's sub-steps fenced and not (`--gemm-fence on|off`), which ops gain. One
#           archive, du.tgz
#   PART=dt the GEMM in 16 planes of 32 × 32 (`GemmKnobs::planes` [4, 4]: 512 lanes, at most 128
#           registers a lane) without and with the fenced sub-steps, against the default and
#           the fence alone (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=fence`) on SD 1.5's step
#           replayed with every kernel's compile statistics, then on SDXL's. One archive, dt.tgz.
#           Needs that call's binary (the 16 planes, lost and removed)
#   PART=ds the GEMM's accumulators seeded with their bias and residual (`GemmKnobs::seed`: no
#           global loads in the epilogue for the compiler to hoist), with and without the fenced
#           sub-steps, the prefetch and two stages (`--gemm-ab`, `LATENT_STUDIO_BENCH_KNOBS=fence`)
#           on SD 1.5's step replayed with every kernel's compile statistics, then on SDXL's.
#           One archive, ds.tgz. Needs that call's binary (`GemmKnobs::seed`, lost and removed)
#   PART=dr the GEMM's sub-steps fenced (`GemmKnobs::fence`: a lane holds one 16-deep sub-step's
#           fragments) alone and with the 32-deep step, the prefetch or two stages, against the
#           default and the other compilations (`--gemm-ab`) on SD 1.5's step replayed, with
#           every kernel's compile statistics; then SDXL's step replayed under the default and
#           the fenced ones (`LATENT_STUDIO_BENCH_KNOBS=fence`). One archive, dr.tgz
#   PART=dq every SPIR-V kernel's compile statistics as the driver reports them
#           (`LATENT_STUDIO_PIPELINE_STATS=1`: registers, spills…) on SD 1.5's step under the
#           GEMM's compilations (`--gemm-ab`, replayed), then SDXL's step. One archive, dq.tgz
#   PART=dp the planes attention's tiling over the 77 prompt tokens (`--planes-ab`, SD 1.5's step
#           then SDXL's, replayed): the narrowest key tile against 32/64 query rows over 16/32
#           keys. Needs that call's binary (`set_planes_few_tile`, level and removed)
#   PART=do PyTorch's SD 1.5 step, VAE decode and 20-step txt2img, then ours in the same call: the
#           SD 1.5 step replayed, the 20-step 512² txt2img, the VAE decode (`--vae-only`). One
#           archive, do.tgz
#   PART=dn the GEMM's compilations (`--gemm-ab`: 4 planes of 64 × 32 over 128 × 64 tiles among
#           them) on SD 1.5's step replayed, then on SDXL's. One archive, dn.tgz. Needs that
#           call's binary (`GemmKnobs::tile`, lost and removed)
#   PART=dm PyTorch's SD 1.5 step, 20-step 512² txt2img and SDXL step, then ours in the same
#           call: SD 1.5's step replayed under `--planes-ab` (the rows' references held in
#           registers between round trips among the rules), the 20-step txt2img, SDXL's step
#           under `--planes-ab`. One archive, dm.tgz
#   PART=dl PyTorch's SD 1.5 and SDXL steps, then ours in the same call: SD 1.5's step replayed
#           under `--planes-ab` (key/value rows padded or packed, 64 or 32 query rows) and
#           profiled by kernel, SDXL's step (launch by launch, replayed) profiled by kernel.
#           One archive, dl.tgz
#   PART=dk the planes attention's staged key/value rows padded 16 bytes against packed, and its
#           tilings with padded rows (`--planes-ab`), SD 1.5's step replayed with the GEMM's
#           compilations (`--gemm-ab`: double-buffered among them), then SDXL's step under
#           `--planes-ab` and profiled by kernel. One archive, dk.tgz
#   PART=dj the split reduction's slices by a wave model against two cubes an SM
#           (`--gemm-ab`): SDXL's step replayed under each, three interleaved rounds, then SD
#           1.5's (`LATENT_STUDIO_BENCH_KNOBS=waves`). One archive, dj.tgz. Needs that call's
#           binary (the knob `GemmKnobs::split_waves`, lost and removed)
#   PART=di SDXL's step profiled by kernel and op shape (`--kernel-profile 1`: every launch timed
#           with device timestamps), then replayed. One archive, di.tgz
#   PART=dh PyTorch's SD 1.5 step and VAE decode, then ours under WGSL (the iGPU route: no
#           cooperative matrices, the VAE's 512-wide head on the sliced matmuls): `--vae-only`
#           and the SD 1.5 step replayed. One archive, dh.tgz
#   PART=dg PyTorch's VAE decode and SD 1.5 step, then ours: `--vae-only --kernel-profile 1` (the
#           head's tilings alone, then the compiled decode with the mid block's head on the
#           wide-head kernel or the sliced matmuls: 512² replayed, five interleaved rounds, each
#           rule's kernels; 1024² whole, three rounds), then SD 1.5's step replayed. One
#           archive, dg.tgz
#   PART=df the VAE mid block's 512-wide head: PyTorch's VAE decode, then ours (`--vae-only`: each
#           of our tilings at 4096 and 16 384 tokens against the sliced matmuls, timed and
#           compared, and the compiled decode with the head on ours or on the sliced matmuls,
#           interleaved) under SPIR-V with cooperative matrices (the wide-head kernel), on
#           plain lanes (`LATENT_STUDIO_CMMA=off`: the per-row kernel) and in f32; SDXL's VAE
#           1024² last. Outputs in one archive, df.tgz
#   PART=de SDXL's step under the planes attention's tilings (`--planes-ab`: tiles in registers
#           at 32/64/128 query rows over 16/32/64 keys, and the round trip), each replayed from
#           a graph recorded under it, three interleaved rounds
#   PART=dd SDXL's refiner pair on a card of 8 GiB: a CUDA process holding all but FREE_MIB
#           (8192) of the free memory, then `bench --sdxl --pipeline-only --refiner` with
#           everything parked (`--text-encoders host`) in two processes sharing a tuning folder
#           (the first tunes) under the peak sampler; exit codes kept; one archive, dd.tgz
#   PART=dc a first launch on a card of 8 GiB: the SDXL folder, then a CUDA process holding all
#           but FREE_MIB (8192) of the H200's free memory, then `generate` 1024² 4 steps in two
#           processes sharing a tuning folder (the first tunes, with cubecl's bandwidth probes
#           and autotune trials beside the model) under the peak sampler; exit codes kept.
#           Outputs in one archive, dc.tgz
#   PART=db the bandwidth curves measured at device open (that call's binary: `device::bandwidth`,
#           45.7 s on a fresh H200, removed since; with another binary the run is issue 15's
#           first-launch peak as it stands): the SDXL folder,
#           `generate` 1024² 4 steps in two processes sharing a tuning folder under the peak
#           sampler (the first tunes), then PyTorch's SD 1.5 and SDXL steps and ours (SD 1.5
#           replayed; SDXL launch by launch and replayed). Its outputs go in one archive,
#           db.tgz (a call brings back at most 8 files)
#   PART=da where the SDXL tuning launch's +2 GiB steps come from: the SDXL folder
#           (bench/make_sdxl.py), then `generate` 1024² 4 steps in two processes sharing a
#           tuning folder (the first tunes) under the peak sampler with cubecl's memory log
#           (`[memory.logger] level = "basic"`: page growths, cleanups), then PyTorch's SDXL step
#           and ours, launch by launch and replayed from a recorded graph
#   PART=cz PyTorch's SD 1.5 step, then ours on plain lanes (the iGPU path): SPIR-V with the
#           cooperative matrices hidden (`LATENT_STUDIO_CMMA=off`) and WGSL, each replayed
#   PART=cy issue 15's 8 GiB with a real checkpoint's load: a full-size SDXL base folder of random
#           fp16 weights (bench/make_sdxl.py), then `generate` 1024² 20 steps in two processes
#           sharing a tuning folder (the first tunes), each under the peak sampler; then
#           PyTorch's SD 1.5 step and ours (replayed)
#   PART=cx PyTorch's SD 1.5 step, 20-step txt2img and SDXL step, then ours in the same call: SD
#           1.5's step (replayed) and SDXL's, each profiled by kernel and under `--norms-ab`, the
#           VAE decode profiled, the 20-step 512² txt2img (`--norms-ab`, GroupNorm pooled in its
#           normalising pass against its pooling launch, lost in calls cv–cx and was removed
#           with the pooled pass: these three parts need that session's binary)
#   PART=cw PyTorch's SD 1.5 step, VAE decode and SDXL step, then ours in the same call: SD 1.5's
#           step (replayed) and SDXL's, each profiled by kernel and under `--norms-ab`, the VAE
#           decode profiled
#   PART=cv PyTorch's SD 1.5 step, VAE decode and 20-step txt2img, then ours in the same call: SD
#           1.5's step (replayed) profiled by kernel and under `--norms-ab` (GroupNorm pooled in
#           its normalising pass or after a pooling launch; outputs compared), the VAE decode
#           profiled with and without the pooling launch, the 20-step 512² txt2img
#   PART=cu PyTorch's SD 1.5 step, VAE decode and 20-step txt2img, then ours in the same call: SD
#           1.5's step (replayed) and the VAE decode (replayed), each profiled by kernel, and the
#           20-step 512² txt2img
#   PART=ct SD 1.5's step and the VAE decode profiled by kernel (GroupNorm's normalising pass on
#           vectors of four channels)
#   PART=cs SDXL's first 1024² txt2img with an empty tuning folder under the peak sampler (its
#           samples kept, to place the tuning run's peak by phase), then SD 1.5's step and the
#           VAE decode profiled by kernel
#   PART=cr SDXL's 1024² txt2img in two processes sharing a tuning folder (the first tunes), each
#           under the peak sampler (issue 15's 8 GiB once the kernels are tuned), then PyTorch's
#           SD 1.5 step and ours (replayed)
#   PART=cq PyTorch's SD 1.5 step, VAE decode and 20-step txt2img, then ours: the VAE decode
#           compiled launch by launch against replayed from a recorded graph (interleaved,
#           outputs compared), the 20-step 512² txt2img (its decodes replayed from the second
#           image on), SD 1.5's step (replayed)
#   PART=cp PyTorch's SD 1.5 and SDXL steps, then ours with the channels-last GEMM's 128 × 128
#           tiles by default: SD 1.5's step (replayed), SDXL's under `--conv-ab` (its rules and
#           tiles, outputs compared)
#   PART=co PyTorch's SD 1.5 step, VAE decode and 20-step txt2img, then ours: SD 1.5's step
#           (replayed) and the VAE decode under `--conv-ab` (channels-last rules and the
#           channels-last GEMM's tiles forced, outputs compared), the 20-step 512² txt2img
#   PART=cn ours with every layer channels-last (the default): SD 1.5's step (replayed) under
#           `--gemm-ab` (the GEMM's compilations, now that the convolutions run on it), the VAE
#           decode and SDXL's step profiled by kernel
#   PART=cm PyTorch's SD 1.5 step, VAE decode, 20-step txt2img and SDXL step, then ours with
#           every layer channels-last by default (weights packed at load): SD 1.5's step
#           (replayed) and the VAE decode under `--conv-ab` (outputs compared), the 20-step 512²
#           txt2img, SDXL's step under `--conv-ab` and its memory, SDXL's 1024² txt2img peak
#   PART=cl convolutions channels-last on our GEMM (`--conv-ab`: the rules in force, channels-last
#           above 160 tiles, on every layer; outputs compared): SD 1.5's step (replayed), the VAE
#           decode, SDXL's step; then SD 1.5's step profiled by kernel with every layer
#           channels-last
#   PART=ck SD 1.5's step (replayed) and SDXL's under `--rows-ab` (SD 1.5's outputs compared; in
#           that call's binary the planes attention's tile offsets formed once were a third rule:
#           lost, removed)
#   PART=cj PyTorch's SD 1.5 step, VAE decode, 20-step txt2img and SDXL step, then ours in the
#           same call: SD 1.5's step (replayed) under `--rows-ab` (outputs compared), the 20-step
#           512² txt2img, the VAE decode, SDXL's step under `--rows-ab`
#   PART=ci our GEMM's products alone with each lane's row offsets formed once before the
#           reduction or at every step, then SD 1.5's step (replayed) and SDXL's under
#           `--rows-ab` (in that call's binary also a diagnostic reading a GEGLU's weight rows in
#           order, since removed)
#   PART=ch (the forty-second session's second call, its binary) our GEMM's GEGLU products
#           alone under each value hold (f32, f16, no gelu, the weight's rows read in order),
#           then SD 1.5's step with 3×3 weights stored channels-last or OIHW (`--weights-ab`,
#           since removed) and under `--geglu-ab` (now `--rows-ab`), the VAE under `--weights-ab`
#   PART=cg PyTorch's SD 1.5 and SDXL steps and SD 1.5's VAE decode, each also by kernel class
#           (torch.profiler); our GEMM's GEGLU products alone under each value hold and beside
#           the same products with the bias alone (`--workgroup-gemm`, no workgroup variant);
#           then SD 1.5's step (replayed) and SDXL's under `--rows-ab` (in that call: `--geglu-ab`, its value holds), each profiled by kernel
#           (`--kernel-profile`), and the VAE decode profiled
#   PART=cf the GEMM on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2:
#           `bench --workgroup-gemm`, each tile checked against the plane-scope GEMM and timed)
#   PART=ce PyTorch's SDXL and SD 1.5 steps, then part cd, then both steps under `--planes-ab`
#           (in the thirty-ninth session's binary, with the scores computed transposed, k·qᵀ,
#           among the rules: no gain, removed)
#   PART=cd the planes attention kernel's parts alone (`bench --attention-ceiling`: every planes
#           tiling whole, then the ladder down to no plane barriers; in the thirty-ninth
#           session's second call also no score stores, a rung since removed)
#   PART=cc `--text-encoders auto` placing SDXL's refiner by the adapter's memory (cut short)
#   PART=cb SDXL's refiner pair within 8 GiB (issue 15): PyTorch's base and refined 1024² txt2img,
#           then ours in two processes sharing a tuning folder (the first tunes), each the base's
#           runs then the refined runs with everything parked (`--text-encoders host`: the
#           UNets take turns on the device), under the peak sampler; then one process with
#           everything on the device (`--text-encoders device`: the time without the turns);
#           SWAPS=n times n turns leg by leg first, RUNS picks the processes (host1 host2 device)
#   PART=ca the plain VAE decode before and after GroupNorm's sums in pieces (two binaries,
#           interleaved; carry .gl and .gpu with latent-studio.xz and latent-studio-old.xz)
#   PART=bz PyTorch's fp16 step, then part by's runs with one step profiled under
#           `--simt-conv 8x8-16` (the binary whose staging registers held f16 as f16 until stored;
#           cubecl-ir panicked compiling that to SPIR-V, the change was reverted)
#   PART=by ours only, under SPIR-V with LATENT_STUDIO_CMMA=off: `--simt-ab` (f16 convolution
#           8 × 8 or 4 × 4, 16 deep without prefetch among its variants), then one step profiled
#           with `--simt-conv 8x8-16n` (whether f16's 8 × 8 penalty is the registers the
#           prefetch keeps live)
#   PART=bx PyTorch's fp16 and fp32 steps, then ours with two query rows a lane from 4096 queries
#           (the default since bw): under SPIR-V with LATENT_STUDIO_CMMA=off the step profiled
#           and `--simt-ab` (one row a lane; f16 convolution 8 × 8, 16 or 32 deep), then one step
#           profiled with `--simt-conv 8x8-16` (which layers f16's 8 × 8 loses on), then the
#           default step under WGSL and in f32
#   PART=bw PyTorch's fp16 and fp32 steps, then ours with `--simt-ab` (two query rows a lane in
#           the per-row attention from 4096/1024/256 queries; f16 convolution in 8 × 8 blocks)
#           under WGSL, under SPIR-V with LATENT_STUDIO_CMMA=off and in f32, the last two with
#           one step's kernels profiled (where f16's SIMT step loses to f32's)
#   PART=bv part bt, run with the binary whose `--simt-ab` compared 4 × 8 lane blocks on the
#           SIMT convolution's 64-channel tiles
#   PART=bu PyTorch's fp16 step, then ours in f16 on the two routes without cooperative matrices
#           (WGSL; SPIR-V with LATENT_STUDIO_CMMA=off), each with `--simt-ab` (the f16 SIMT
#           convolution's 32-deep staging, the default since, against 16 deep with prefetch)
#   PART=bt PyTorch's fp16 and fp32 steps, then ours with `--simt-ab` (in that call's binary: the
#           SIMT convolution staging 16 or 32 reduction indices a step) under WGSL, under SPIR-V
#           with LATENT_STUDIO_CMMA=off (the default rules: burn's matmul on plain lanes for the
#           linears), and in f32
#   PART=bs PyTorch's fp16 step, then ours: under WGSL `--simt-ab` (8- or 16-key attention tiles,
#           1×1 layers on the SIMT kernel); then under SPIR-V with LATENT_STUDIO_CMMA=off, which
#           now hides the cooperative matrices from cubecl too (burn's autotune runs plain-lane
#           kernels only, as on an iGPU): one step's kernels profiled, `--simt-ab`, the linears'
#           SIMT variants (`--product-ab`), then the step with the linears on burn's matmul
#   PART=br PyTorch's fp16 step, then ours on the two routes without cooperative matrices: SPIR-V
#           with LATENT_STUDIO_CMMA=off and every linear on the SIMT product (an iGPU on
#           Vulkan; burn's matmul would take this card's cooperative matrices there), one step's
#           kernels profiled, then WGSL; each with `--simt-ab` (16-key attention tiles among
#           its variants) and `--product-ab` (vector staging with and without prefetch)
#   PART=bn PyTorch's fp16 and fp32 steps, then ours under WGSL (f16) and in f32: the step under
#           the SIMT convolution's variants (4 × 4 / 8 × 8 blocks, staging read as vectors,
#           prefetch; `--simt-ab`), WGSL's step kernels profiled
#   PART=bo PyTorch's fp16 and fp32 steps, then ours: the linears on burn's matmul or the SIMT
#           product in each compilation (`--product-ab`) under WGSL (f16) and in f32, then
#           `--simt-ab` under SPIR-V with LATENT_STUDIO_CMMA=off (an iGPU's Vulkan route)
#   PART=bp f32's linears on the SIMT product, scalar against vector staging (one process each,
#           alternating), then `--simt-ab` under SPIR-V with LATENT_STUDIO_CMMA=off
#   PART=bq every SD 1.5 attention shape alone under WGSL, each tiling (per-row kernel on vectors)
#   PART=bi the cooperative matrices' ceiling with no global memory (`bench --mma-ceiling`)
#   PART=bj SDXL's step profiled by op and its rules A/B'd beside PyTorch, SD 1.5's linear rule
#   PART=bk the planes attention kernel's parts (`bench --attention-ceiling`), then SDXL's and
#           SD 1.5's steps with two row fragments a plane A/B'd (`--planes-ab`) beside PyTorch
#   PART=bm PyTorch's 20-step 512² txt2img (time, then peak memory), then ours in two SD 1.5 processes sharing a tuning
#           folder (the first tunes) under the peak sampler: the relocation patch on SD 1.5
#   PART=bl the attention parts again (ATTENTION=0: not); then SDXL's 1024² txt2img in three processes sharing a
#           tuning folder, the pool's free pages released after each run (SDXL parks its
#           encoders) or kept (LATENT_STUDIO_KEEP_POOL=1, launch 2), under the peak sampler
#   PART=a  PyTorch anchor (fp16 UNet, VAE, CLIP, TAESD, 20-step txt2img, torch.compile UNet) and
#           our default build's f16 bench (op-by-op kernel report, UNet, VAE, txt2img, previews)
#   PART=b  PyTorch fp32 UNet (TF32 off) and ours in f32; then peak device memory of one 20-step
#           f16 txt2img process each, sampled by nvidia-smi every 50 ms
#   PART=c  peak memory again (torch, ours), then ours on the WGSL/SIMT path of the same GPU
#           (LATENT_STUDIO_COMPILER=wgsl), f16
#   PART=d  the UNet step with cubecl-wgpu batching 32 (default) or more kernels per submission
#   PART=f  ours on the WGSL/SIMT path only (per-lane attention, no cooperative matrices): the UNet
#           step with our kernels and with burn ops, then the VAE decode
#   PART=g  the op report on the WGSL/SIMT path (which kernel runs each op, our implicit-GEMM
#           convolution against burn's conv2d on every UNet convolution shape), then the UNet step
#   PART=h  the op report under SPIR-V (default compiler) without PyTorch: our SIMT convolution
#           compiled to SPIR-V beside burn's cooperative-matrix one, on every UNet shape
#   PART=i  PyTorch's fp16 UNet step and VAE decode, then ours on the WGSL/SIMT path in the same
#           call (UNet step with our kernels and with burn ops, VAE decode): the same-run ratio
#           for the SIMT target
#   PART=j  PyTorch's fp16 UNet step and VAE decode, then part g (the WGSL op report with every
#           attention tiling timed, and the UNet step) and the WGSL VAE decode (with the VAE's
#           512-wide attention against our tilings) in the same call
#   PART=k  PyTorch's fp16 UNet step, then ours: the UNet step under the default compiler
#           (SPIR-V, cooperative matrices) and under WGSL, same call
#   PART=l  PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours under the default
#           compiler (SPIR-V, cooperative matrices): UNet step launch by launch and replayed from a
#           captured graph, VAE, txt2img (which replays its steps)
#   PART=m  PyTorch's fp16 UNet step, then ours both ways under WGSL, and under SPIR-V with
#           LATENT_STUDIO_CMMA=off (our SIMT convolution and per-row attention, as an iGPU runs)
#   PART=n  PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours (default compiler):
#           UNet step both ways, VAE, txt2img, no per-block profile; then every SD 1.5 attention
#           shape with each of our tilings (`bench --attention-only`)
#   PART=o  PyTorch's fp16 UNet step, then ours (default compiler): the step launch by launch and
#           replayed
#   PART=p  PyTorch (fp16 UNet step, 20-step txt2img, then its peak memory), then ours (default
#           compiler): UNet step both ways, VAE, 20-step txt2img with replayed steps, under the
#           peak-memory sampler (the whole bench process: an upper bound for one txt2img)
#   PART=r  PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours (default compiler):
#           UNet step both ways, VAE, 20-step txt2img with replayed steps; no burn-ops step, no
#           profile, no op report (each tunes kernels of its own)
#   PART=s  PyTorch's fp16 UNet step, then ours on the WGSL/SIMT path: the op report (every
#           linear shape on our tiled product and burn's matmul, in both weight layouts; every
#           convolution shape on ours and burn's) and the step; the step again with
#           LATENT_STUDIO_MATMUL=burn; then under SPIR-V with LATENT_STUDIO_CMMA=off (the iGPU route)
#   PART=t  PyTorch's fp16 UNet step, then ours: the step under the default compiler (SPIR-V,
#           cooperative matrices) and under WGSL, then the SPIR-V op report (every linear shape
#           with burn's matmul in both weight layouts)
#   PART=u  PyTorch's fp16 UNet step, then ours (default compiler): every SD 1.5 attention shape
#           with each tiling (the planes kernel among them) and every 3×3 convolution shape on
#           burn's, our SIMT and our cooperative-matrix kernel (`--conv-only`), each with its
#           difference from burn's; then the UNet step launch by launch and replayed
#   PART=v  PyTorch's fp16 UNet step, then ours: every SD 1.5 attention shape with each tiling
#           (default compiler, the shapes part u's limit cut), then the UNet step on the WGSL/SIMT
#           path (the iGPU route; the SIMT convolution now shares its staging and epilogue with
#           the cooperative-matrix one)
#   PART=w  PyTorch's fp16 UNet step, then ours (default compiler): every SD 1.5 attention shape
#           on burn's, each planes tiling (output in lanes, resident in fragments, resident with
#           the next tile prefetched; the lanes variant has since been removed) and the per-row kernel, each with its difference from
#           burn's; then the UNet step (launch by launch, replayed) and, in the same process, the
#           step under other planes rules (`--planes-ab`)
#   PART=am PyTorch fp32 UNet step (TF32 off), then ours in f32: the op report (every convolution
#           shape on burn's, our SIMT kernel in 4 × 4 and 8 × 8 lane blocks; every linear on burn's
#           and our SIMT product), the step with 4 × 4 against 8 × 8 blocks, one step's kernels
#   PART=an PyTorch fp16 UNet step, then ours on the WGSL/SIMT path: the step with 4 × 4 against
#           8 × 8 lane blocks
#   PART=ao PyTorch fp32 UNet step (TF32 off), then ours in f32: the step with the linears on
#           the SIMT product in 8 × 8 blocks where they fit (launch by launch, replayed), the
#           step with the linears on burn's matmul, SIMT 4 × 4 and SIMT 8 × 8 interleaved, then
#           every linear shape alone on each
#   PART=ap PyTorch fp16 UNet step, then ours on the WGSL/SIMT path: part ao's runs in f16
#   PART=aq PyTorch fp32 (TF32 off) and fp16 UNet steps, then ours: f32 with the linears on the
#           SIMT product (the default since part ao), the step with the SIMT convolution in 4 × 4,
#           8 × 8, and 8 × 8 with the 1×1 layers too; then part ap's f16 runs under WGSL
#   PART=ar PyTorch (fp16 and fp32 UNet steps, VAE decode, 20-step txt2img), then ours: the
#           default f16 path end to end (step both ways, VAE, 20-step txt2img and its anatomy:
#           10 and 3 steps, each step's host time stamp), then the f32 step with this session's
#           defaults
#   PART=as PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours: the VAE's kernel
#           profile (4 decodes), the UNet step's (2 steps), the default f16 path end to end, then
#           SDXL 1024² with its text encoders parked under the peak sampler, its memory trace
#           kept (the twenty-third session's calls)
#   PART=au PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours: the planes attention
#           kernel's plans on SD 1.5's attention shapes (time, difference from burn's), then the
#           default path end to end with the step under each planes rule (`--planes-ab`; the
#           twenty-fifth session's first call compared compilations since removed)
#   PART=av ours only: the UNet step replayed under each planes rule (`--planes-ab`)
#   PART=aw PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours: the planes kernel's
#           default plans against burn's, then the default path end to end with the step's
#           kernel profile and the planes rules interleaved (`--planes-ab`)
#   PART=ay SDXL's 1024² txt2img (decode tiled by auto), encoders parked, peak by phase
#   PART=az the GEMM with and without its split reduction on every SD 1.5 linear shape against
#           burn (`--gemm-only`, difference and device time; GEMM_TIMEOUT=1 skips it), then the
#           UNet step: its kernel profile by kernel and by the op that launched it, and the step
#           replayed under the split and the 8×8 layers' route, interleaved, each compared with
#           the first rule's output (`--gemm-ab`); EXTRA=" " runs the VAE and txt2img too.
#           PyTorch's step, VAE and txt2img first unless TORCH=0 (the twenty-sixth session)
#   PART=ba the GEMM reading a convolution's input in place (implicit GEMM) against burn's
#           convolution and the unrolled input on every SD 1.5 UNet 3×3 shape and every VAE
#           decoder shape (`--gemm-only`; GEMM_TIMEOUT=1 skips it), then the UNet step replayed
#           under the convolution rules, the in-place reads among them, interleaved (`--conv-ab`);
#           EXTRA=" " runs the VAE under those rules (`vae_ab`) and txt2img too. PyTorch's step,
#           VAE and txt2img first when TORCH=1 (the twenty-seventh session)
#   PART=bb kernel tuning kept across launches (`device::tuning`): SD 1.5's 20-step 512² txt2img
#           in two processes sharing a tuning folder (the first tunes, the second restores), then
#           SDXL's 1024² txt2img likewise under the peak-memory sampler (the first run's tuning
#           is what lifted its peak past 8 GiB); PyTorch's SD 1.5 txt2img first when TORCH=1
#   PART=bc SDXL's refiner (issue 15): PyTorch's SDXL step and 1024² txt2img, then its refiner's
#           step and the txt2img with the refiner taking over at 0.8 (diffusers' ensemble), then
#           ours (`bench --sdxl --refiner`): the same under the peak-memory sampler
#   PART=bd SDXL's UNet step at 1024² with the linears on our GEMM, then on burn's matmul
#           (LATENT_STUDIO_MATMUL=burn), one process each (`bench --sdxl --no-pipeline`)
#   PART=be issue 16's hires fix beside PyTorch: its UNet step, 20-step 512² txt2img and the
#           same with a x2 hires fix (latents upscaled, 10 steps at 1024², strength 0.5), then
#           ours (`bench --hires-scale 2`: the step, VAE, txt2img, the hires txt2img)
#   PART=bf issue 16's LoRA on the current code: `bench --unet-only --lora-rank 32` (the merge
#           on the device, the replayed step merged against the base, the low-rank products)
#   PART=bg PyTorch's SD 1.5 and SDXL steps, then ours: every planes tiling on SDXL's and a 1024²
#           hires pass's attention shapes and on SD 1.5's, then SD 1.5's step (launch by launch
#           and replayed)
#   PART=bh PyTorch's SDXL step, then ours: the step under the default planes tiling and two
#           32-key ones, under convolution and GEMM rules (each interleaved), its kernel profile,
#           and the decode (no txt2img)
#   PART=ax peak memory, one process each: SDXL's 1024² decode alone tiled and whole, then SD 1.5's
#           20-step 512² txt2img in PyTorch and ours
#   PART=x  PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours: the planes
#           tilings that the routing rules pick on every SD 1.5 attention shape (their difference
#           from burn's), then the default path end to end (step both ways, the step under each
#           planes rule interleaved over three rounds, VAE, 20-step txt2img)
#   PART=y  PyTorch (fp16 UNet step, VAE decode, 20-step txt2img), then ours end to end (step
#           both ways, the step under each planes rule interleaved over three rounds, VAE,
#           20-step txt2img): part x without its attention report, with more time
#   PART=y2 PyTorch (fp16 UNet step, 20-step txt2img), then ours end to end with this session's
#           default (step both ways, VAE, txt2img), then txt2img with a ×2 hires fix (Latent,
#           10 more steps at 1024², strength 0.5)
#   PART=z  PyTorch's fp16 UNet step, then ours (default compiler): the op report (every op shape
#           of one step alone, which kernel runs it, the largest re-timed last), then the step
#   PART=aa every 3×3 convolution shape on burn's, our SIMT and our cooperative-matrix kernel
#           (the latter reading its input unrolled and gathering it) (`--conv-only`)
#   PART=ab PyTorch (fp16 UNet step, 20-step txt2img), then ours: the step both ways, the step
#           with our cooperative-matrix convolution up to 160/64/640 tiles interleaved over three
#           rounds, VAE, 20-step txt2img
#   PART=ac PyTorch (fp16 UNet step, 20-step txt2img), then ours: the step both ways, every kernel
#           of three steps timed on the device (`--kernel-profile 3`: by kernel and by class), the
#           step with the 3×3 convolutions through the unrolled input and burn's matmul above
#           160/64/0 tiles, interleaved over three rounds (`--conv-ab`), VAE, 20-step txt2img
#   PART=ad our cooperative-matrix GEMM against burn on every UNet linear shape (each tile) and
#           every 3×3 convolution shape (input unrolled) (`--gemm-only`); PyTorch (fp16 UNet step,
#           20-step txt2img); then ours: the step both ways and with the GEMM taking the linears
#           and convolutions, interleaved over three rounds (`--gemm-ab`), VAE, txt2img
#   PART=ae PyTorch (fp16 UNet step, 20-step txt2img), then ours with the convolution rules
#           (split kernel at 8×8, GEMM on the unrolled input at 16×16, stride 2 and 1280 outputs):
#           the step both ways, its kernel profile, the step under six convolution rules and with
#           the linears on our GEMM, interleaved over three rounds, VAE, 20-step txt2img
#   PART=af part ae with this session's final default (GEMM for 3×3 layers up to 160 tiles or of
#           1280 outputs and for the 1×1 layers, burn's elsewhere) and five convolution rules
#           interleaved over five rounds, without the linear A/B
#   PART=ag our GEMM's compilations (reduction step 32/64, bounds checks on/off; the plane-barrier
#           vector epilogue) against burn on every UNet linear and 3×3 shape, device time of the
#           kernels (`--gemm-only`); PyTorch's fp16 UNet step; then ours: the step both ways, the
#           step with the linears on burn's matmul or our GEMM under each compilation
#           interleaved over three rounds (`--gemm-ab`), every kernel of three steps
#           (`--kernel-profile 3`, with EXTRA flags; at the time `--mma-linears` put the linears on
#           our GEMM, now the default: `--burn-linears` puts them back on burn's matmul)
#   PART=ah PyTorch (fp16 UNet step, 20-step txt2img), then ours end to end (step both ways,
#           VAE, 20-step txt2img) with every kernel of three steps profiled with the linears on
#           burn's matmul, on our GEMM, and on burn's again (`--profile-linears`), the GEMM A/B
#           (`--gemm-ab`); then the GEMM report (`--gemm-only`) in the time left
#   PART=ai the GEMM report first (each linear and 3×3 shape, and the GEGLU gate and residual
#           fused into the GEMM's epilogue against burn's fused matmul), PyTorch (fp16 UNet step,
#           20-step txt2img), then part ah's run of ours with EXTRA flags (then --mma-linears, now the default: the
#           linears on our GEMM for the whole run, the profile's A/B flips them to burn's)
#   PART=aj SDXL (issue 15): PyTorch's SDXL UNet step at 128² latents and a whole 20-step 1024²
#           txt2img (its peak allocated memory, weights included), then ours (`bench --sdxl`,
#           random full-size weights, f16: the step and the txt2img, the pool at each phase; EXTRA
#           such as --kernel-profile 2) under the peak-memory sampler
#   PART=ak PyTorch (fp16 and fp32 UNet step, 20-step txt2img, its peak memory), then ours: the
#           f16 default end to end under the peak-memory sampler, and the f32 UNet step and VAE
#   PART=al PyTorch (fp16 UNet step, VAE decode), then ours on the WGSL/SIMT path: the UNet step
#   PART=e  PyTorch (fp16 UNet, VAE, 20-step txt2img), then our f16 bench under perf (a flat
#           profile per thread: where the host time of a step goes). Needs .perf/perf.txz (perf
#           and its libraries) and a release build with symbols (CARGO_PROFILE_RELEASE_STRIP=false)
# The tracked tree is ~48 MB since the SDXL fixtures: for a call that does not need them, move
# tests/fixtures aside first (the copy takes the working tree as it is), or the tree, the binary
# and diffusers pass the 64 MiB a call carries.
# Carry .gl (Vulkan loader), .whl (diffusers) and .gpu/latent-studio.gz (stripped release build),
# or .gpu alone with latent-studio.xz and site.tar.xz in it (when the tree leaves less room).
for f in .gl/*.deb; do dpkg -x $f / >/dev/null 2>&1; done; ldconfig
# diffusers from .whl, or from .gpu/site.tar.xz (the same wheels installed and xz-compressed: a
# third of the size, where the working tree and the binary leave little of the 64 MiB).
if [ -f .gpu/site.tar.xz ]; then
  mkdir -p /tmp/site && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall('/tmp/site')" .gpu/site.tar.xz
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site
if ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a $OUT/gpu.txt
# The binary comes gzipped, or xz-compressed (a build with symbols, for PART=e).
unxz_py() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)" "$1"; }
if [ -f .gpu/latent-studio.xz ]; then unxz_py .gpu/latent-studio.xz > /tmp/ls; else gunzip -c .gpu/latent-studio.gz > /tmp/ls; fi
chmod +x /tmp/ls
export RUST_LOG=warn PYTHONUNBUFFERED=1
cd /tmp
/tmp/ls devices 2>&1 | tee -a $OUT/devices.txt

# Peak device memory of a command: nvidia-smi's memory.used, sampled, minus the idle reading.
peak() {
  local name=$1; shift
  local idle; idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  # Time-stamped samples (`2026/11/27 13:00:00.123, 5303`): the bench's phase marks place them.
  nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 50 > /tmp/mem-$name.txt &
  local sampler=$!
  "$@" 2>&1 | tee -a $OUT/$name.txt
  kill $sampler
  local max; max=$(cut -d, -f2 /tmp/mem-$name.txt | sort -n | tail -1)
  echo "$name: peak device memory $((max - idle)) MiB above idle ($idle MiB idle, $max MiB peak)" | tee -a $OUT/memory.txt
}

# A card of `$1` MiB on this GPU: a CUDA process holds the rest of its free memory (its pid in
# BLOCKER; what is left is written to $OUT/free.txt).
hold_all_but() {
  local free; free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  # The blocker's CUDA context takes ~0.5 GiB beside its buffer: aim below, then read what is left.
  local block=$((free - $1 - ${CTX_MIB:-520}))
  python3 -c "import torch, time; x = torch.empty($block << 20, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); print('holding', $block, 'MiB', flush=True); time.sleep(100000)" > $OUT/blocker.txt 2>&1 &
  BLOCKER=$!
  for _ in $(seq 60); do grep -q holding $OUT/blocker.txt 2>/dev/null && break; sleep 1; done
  sleep 2
  echo "free for the runs: $(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1) MiB (blocker: $(cat $OUT/blocker.txt))" | tee -a $OUT/free.txt
}

# A part's outputs in /tmp/$1, archived whole into $OUT as $1.tgz after each run (a call that
# runs out of time keeps what finished): sets OUT_REAL and OUT, and the shared tuning folder.
part_dir() {
  mkdir -p /tmp/$1 && export OUT_REAL=$OUT && export OUT=/tmp/$1 PART_NAME=$1
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
}

# `bench_part NAME SECONDS ARGS...`: one f16 `bench` run on the GPU within SECONDS (or
# $SD15_TIMEOUT / $SDXL_TIMEOUT by NAME's prefix), its report in NAME.txt, the archive refreshed.
bench_part() {
  local name=$1 limit=$2; shift 2
  case $name in
    sd15_*) limit=${SD15_TIMEOUT:-$limit} ;;
    sdxl_*) limit=${SDXL_TIMEOUT:-$limit} ;;
  esac
  timeout $limit /tmp/ls bench --device gpu --precision f16 "$@" 2>&1 | grep -v "WARN\\|Caused by\\|Too m\\|Requested\\|acktrace" | tee $OUT/$name.txt
  tar czf $OUT_REAL/$PART_NAME.tgz -C /tmp $PART_NAME
}

case ${PART:-a} in
ff)
  part_dir ff
  bench_part sd15_ff 120 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --conv-tiles-ab
  ;;
fe)
  part_dir fe
  bench_part sd15_fe 120 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --conv-tiles-ab
  bench_part sdxl_fe 200 --runs 5 --sdxl --no-pipeline --conv-tiles-ab
  ;;
fd)
  REPO=$OLDPWD; part_dir fd
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-100} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_fd.txt
  tar czf $OUT_REAL/fd.tgz -C /tmp fd
  bench_part sd15_fd 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --context-ab
  ;;
fa)
  REPO=$OLDPWD; part_dir fa
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-170} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_fa.txt
  tar czf $OUT_REAL/fa.tgz -C /tmp fa
  bench_part sd15_fa 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --context-ab --kernel-profile 1
  bench_part sdxl_fa 300 --runs 5 --sdxl --no-pipeline --context-ab --kernel-profile 1
  ;;
fc)
  REPO=$OLDPWD; part_dir fc
  PARTS=${TORCH_PARTS:-unet16,e2e,sdxl} timeout ${TORCH_TIMEOUT:-170} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_fc.txt
  tar czf $OUT_REAL/fc.tgz -C /tmp fc
  bench_part sd15_fc 130 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --context-ab --layernorm-ab
  bench_part sd15_fc_e2e 100 --steps 20 --pipeline-only --runs 5
  bench_part sdxl_fc 200 --runs 5 --sdxl --no-pipeline --context-ab --layernorm-ab
  ;;
fb)
  REPO=$OLDPWD; part_dir fb
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-100} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_fb.txt
  tar czf $OUT_REAL/fb.tgz -C /tmp fb
  # The SIMT routes keep tuning files of their own (keyed by the cooperative-matrix switch).
  LATENT_STUDIO_CMMA=off bench_part sd15_fb_spirv 220 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --context-ab
  LATENT_STUDIO_COMPILER=wgsl bench_part sd15_fb_wgsl 200 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --context-ab
  ;;
dy|dz)
  part_dir $PART; export LATENT_STUDIO_BENCH_KNOBS=waves
  bench_part sd15_$PART 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  bench_part sdxl_$PART 300 --runs 5 --sdxl --no-pipeline --gemm-ab --gemm-tails on --kernel-profile 1
  ;;
ea)
  REPO=$OLDPWD; part_dir ea
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-170} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_ea.txt
  tar czf $OUT_REAL/ea.tgz -C /tmp ea
  bench_part sd15_ea 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --norm-ab --kernel-profile 1
  bench_part sdxl_ea 300 --runs 5 --sdxl --no-pipeline --norm-ab --kernel-profile 1
  ;;
ec)
  REPO=$OLDPWD; part_dir ec
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_ec.txt
  tar czf $OUT_REAL/ec.tgz -C /tmp ec
  LATENT_STUDIO_CMMA=off bench_part sd15_ec_spirv 200 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --norm-ab
  for max in default 0; do
    extra=; [ $max = 0 ] && extra="--slab-max 0"
    bench_part sd15_ec_e2e_$max 110 --steps 20 --pipeline-only --runs 5 $extra
  done
  ;;
eb)
  REPO=$OLDPWD; part_dir eb
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-100} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_eb.txt
  tar czf $OUT_REAL/eb.tgz -C /tmp eb
  LATENT_STUDIO_CMMA=off bench_part sd15_eb_spirv 220 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --norm-ab --kernel-profile 1
  LATENT_STUDIO_COMPILER=wgsl bench_part sd15_eb_wgsl 200 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --norm-ab
  ;;
dx)
  REPO=$OLDPWD; part_dir dx; export LATENT_STUDIO_BENCH_KNOBS=waves
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-200} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_dx.txt
  tar czf $OUT_REAL/dx.tgz -C /tmp dx
  bench_part sd15_dx 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  bench_part sdxl_dx 220 --runs 5 --sdxl --no-pipeline --gemm-ab
  ;;
dw)
  part_dir dw; export LATENT_STUDIO_BENCH_KNOBS=waves
  bench_part sd15_dw 200 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab --gemm-waves on --kernel-profile 1
  bench_part sdxl_dw 300 --runs 5 --sdxl --no-pipeline --gemm-ab --gemm-waves on --kernel-profile 1
  ;;
dv)
  part_dir dv; export LATENT_STUDIO_BENCH_KNOBS=fence
  bench_part sd15_dv 150 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  bench_part sdxl_dv 200 --runs 5 --sdxl --no-pipeline --gemm-ab
  ;;
du)
  part_dir du
  for f in off on; do
    bench_part sd15_du_$f 100 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --gemm-fence $f --kernel-profile 1
  done
  for f in off on; do
    bench_part sdxl_du_$f 130 --runs 3 --sdxl --no-pipeline --gemm-fence $f --kernel-profile 1
  done
  ;;
dt|ds)
  # The two calls differed in their binaries (see above), not in their commands.
  part_dir $PART; export LATENT_STUDIO_BENCH_KNOBS=fence LATENT_STUDIO_PIPELINE_STATS=1
  bench_part sd15_$PART 240 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  bench_part sdxl_$PART 300 --runs 5 --sdxl --no-pipeline --gemm-ab
  ;;
dr)
  part_dir dr
  LATENT_STUDIO_PIPELINE_STATS=1 bench_part sd15_dr 260 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  LATENT_STUDIO_BENCH_KNOBS=fence bench_part sdxl_dr 280 --runs 5 --sdxl --no-pipeline --gemm-ab
  ;;
dq)
  part_dir dq; export LATENT_STUDIO_PIPELINE_STATS=1
  bench_part sd15_dq 200 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab
  bench_part sdxl_dq 200 --runs 5 --sdxl --no-pipeline
  ;;
dp)
  mkdir -p /tmp/dp && export OUT_REAL=$OUT && export OUT=/tmp/dp
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dp.txt
  tar czf $OUT_REAL/dp.tgz -C /tmp dp
  timeout ${SDXL_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dp.txt
  tar czf $OUT_REAL/dp.tgz -C /tmp dp
  ;;
do)
  REPO=$OLDPWD
  mkdir -p /tmp/do && export OUT_REAL=$OUT && export OUT=/tmp/do
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_do.txt
  tar czf $OUT_REAL/do.tgz -C /tmp do
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_do.txt
  tar czf $OUT_REAL/do.tgz -C /tmp do
  timeout ${E2E_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --steps 20 --pipeline-only --runs 5 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_do.txt
  tar czf $OUT_REAL/do.tgz -C /tmp do
  timeout ${VAE_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_do.txt
  tar czf $OUT_REAL/do.tgz -C /tmp do
  ;;
dn)
  mkdir -p /tmp/dn && export OUT_REAL=$OUT && export OUT=/tmp/dn
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dn.txt
  tar czf $OUT_REAL/dn.tgz -C /tmp dn
  timeout ${SDXL_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dn.txt
  tar czf $OUT_REAL/dn.tgz -C /tmp dn
  ;;
dm)
  REPO=$OLDPWD
  mkdir -p /tmp/dm && export OUT_REAL=$OUT && export OUT=/tmp/dm
  PARTS=${TORCH_PARTS:-unet16,e2e,sdxl} timeout ${TORCH_TIMEOUT:-220} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_dm.txt
  tar czf $OUT_REAL/dm.tgz -C /tmp dm
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-130} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dm.txt
  tar czf $OUT_REAL/dm.tgz -C /tmp dm
  timeout ${E2E_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --steps 20 --pipeline-only --runs 5 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_dm.txt
  tar czf $OUT_REAL/dm.tgz -C /tmp dm
  timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dm.txt
  tar czf $OUT_REAL/dm.tgz -C /tmp dm
  ;;
dl)
  REPO=$OLDPWD
  mkdir -p /tmp/dl && export OUT_REAL=$OUT && export OUT=/tmp/dl
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-200} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_dl.txt
  tar czf $OUT_REAL/dl.tgz -C /tmp dl
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dl.txt
  tar czf $OUT_REAL/dl.tgz -C /tmp dl
  timeout ${SDXL_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dl.txt
  tar czf $OUT_REAL/dl.tgz -C /tmp dl
  ;;
dk)
  mkdir -p /tmp/dk && export OUT_REAL=$OUT && export OUT=/tmp/dk
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SD15_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab --gemm-ab --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dk.txt
  tar czf $OUT_REAL/dk.tgz -C /tmp dk
  timeout ${SDXL_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dk.txt
  tar czf $OUT_REAL/dk.tgz -C /tmp dk
  ;;
dj)
  mkdir -p /tmp/dj && export OUT_REAL=$OUT && export OUT=/tmp/dj
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SDXL_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_dj.txt
  tar czf $OUT_REAL/dj.tgz -C /tmp dj
  LATENT_STUDIO_BENCH_KNOBS=waves timeout ${SD15_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dj.txt
  tar czf $OUT_REAL/dj.tgz -C /tmp dj
  ;;
di)
  mkdir -p /tmp/di && export OUT_REAL=$OUT && export OUT=/tmp/di
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SDXL_TIMEOUT:-400} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_di.txt
  tar czf $OUT_REAL/di.tgz -C /tmp di
  ;;
dh)
  REPO=$OLDPWD
  mkdir -p /tmp/dh && export OUT_REAL=$OUT && export OUT=/tmp/dh
  PARTS=${TORCH_PARTS:-unet16,vae} timeout ${TORCH_TIMEOUT:-90} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_dh.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning LATENT_STUDIO_COMPILER=wgsl
  timeout ${VAE_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_wgsl_dh.txt
  tar czf $OUT_REAL/dh.tgz -C /tmp dh
  timeout ${WGSL_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_wgsl_dh.txt
  tar czf $OUT_REAL/dh.tgz -C /tmp dh
  ;;
dg)
  REPO=$OLDPWD
  mkdir -p /tmp/dg && export OUT_REAL=$OUT && export OUT=/tmp/dg
  PARTS=${TORCH_PARTS:-vae,unet16} timeout ${TORCH_TIMEOUT:-90} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_dg.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${VAE_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_dg.txt
  tar czf $OUT_REAL/dg.tgz -C /tmp dg
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_dg.txt
  tar czf $OUT_REAL/dg.tgz -C /tmp dg
  ;;
df)
  REPO=$OLDPWD
  mkdir -p /tmp/df && export OUT_REAL=$OUT && export OUT=/tmp/df
  PARTS=${TORCH_PARTS:-vae} timeout ${TORCH_TIMEOUT:-60} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_df.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${VAE_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_df.txt
  tar czf $OUT_REAL/df.tgz -C /tmp df
  LATENT_STUDIO_CMMA=off timeout ${PLAIN_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_plain_df.txt
  tar czf $OUT_REAL/df.tgz -C /tmp df
  timeout ${F32_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f32 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_f32_df.txt
  tar czf $OUT_REAL/df.tgz -C /tmp df
  timeout ${SDXL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_df.txt
  tar czf $OUT_REAL/df.tgz -C /tmp df
  ;;
de)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${SDXL_TIMEOUT:-400} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_de.txt
  ;;
dd)
  REPO=$OLDPWD
  mkdir -p /tmp/dd && export OUT_REAL=$OUT && export OUT=/tmp/dd
  hold_all_but ${FREE_MIB:-8192}
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for run in host1 host2; do
    peak sdxl_pair_dd_$run timeout $([ $run = host1 ] && echo ${FIRST_TIMEOUT:-280} || echo ${LATER_TIMEOUT:-150}) bash -c "/tmp/ls bench --device gpu --precision f16 --runs ${RUNS:-2} --steps 20 --sdxl --pipeline-only --refiner --text-encoders host; echo exit code \$?"
    python3 $REPO/bench/mem_phases.py $OUT/sdxl_pair_dd_$run.txt /tmp/mem-sdxl_pair_dd_$run.txt | sed "s/^/$run /" | tee -a $OUT/memory.txt
    tar czf $OUT_REAL/dd.tgz -C /tmp dd
  done
  kill $BLOCKER
  tar czf $OUT_REAL/dd.tgz -C /tmp dd
  ;;
dc)
  REPO=$OLDPWD
  mkdir -p /tmp/dc && export OUT_REAL=$OUT && export OUT=/tmp/dc
  timeout ${MAKE_TIMEOUT:-200} python3 $REPO/bench/make_sdxl.py /tmp/sdxl 2>&1 | grep -v Warning | tee $OUT/make_dc.txt
  hold_all_but ${FREE_MIB:-8192}
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for i in 1 2; do
    peak sdxl_generate_dc$i timeout ${GEN_TIMEOUT:-240} bash -c "time /tmp/ls generate --model /tmp/sdxl --prompt 'a lighthouse at dusk' --seed 7 --width 1024 --height 1024 --steps ${STEPS:-4} --device gpu --out /tmp/dc$i.png --overwrite; echo exit code \$?"
    cp /tmp/mem-sdxl_generate_dc$i.txt $OUT/
    ls -la /tmp/dc$i.png >> $OUT/free.txt 2>&1
    tar czf $OUT_REAL/dc.tgz -C /tmp dc
  done
  kill $BLOCKER
  tar czf $OUT_REAL/dc.tgz -C /tmp dc
  ;;
db)
  REPO=$OLDPWD
  mkdir -p /tmp/db && export OUT_REAL=$OUT && export OUT=/tmp/db
  timeout ${MAKE_TIMEOUT:-200} python3 $REPO/bench/make_sdxl.py /tmp/sdxl 2>&1 | grep -v Warning | tee $OUT/make_db.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for i in 1 2; do
    RUST_LOG=warn,latent_engine::device::bandwidth=debug peak sdxl_generate_db$i timeout ${GEN_TIMEOUT:-200} bash -c "time /tmp/ls generate --model /tmp/sdxl --prompt 'a lighthouse at dusk' --seed 7 --width 1024 --height 1024 --steps ${STEPS:-4} --device gpu --out /tmp/db$i.png --overwrite"
    cp /tmp/mem-sdxl_generate_db$i.txt $OUT/
    tar czf $OUT_REAL/db.tgz -C /tmp db  # after each stage: a call cut short keeps what ran
  done
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_db.txt
  tar czf $OUT_REAL/db.tgz -C /tmp db
  timeout ${OURS_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_db.txt
  tar czf $OUT_REAL/db.tgz -C /tmp db
  timeout ${SDXL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_db.txt
  tar czf $OUT_REAL/db.tgz -C /tmp db
  ;;
da)
  REPO=$OLDPWD  # `cd` below moves OLDPWD
  timeout ${MAKE_TIMEOUT:-200} python3 $REPO/bench/make_sdxl.py /tmp/sdxl 2>&1 | grep -v Warning | tee $OUT/make_da.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  mkdir -p /tmp/memlog && cd /tmp/memlog
  printf 'import sys, datetime\nfor line in sys.stdin:\n    print(datetime.datetime.now().strftime("%%H:%%M:%%S.%%f")[:-3], line, end="", flush=True)\n' > /tmp/stamp.py
  printf '[memory.logger]\nlevel = "basic"\nstderr = true\n' > cubecl.toml
  for i in 1 2; do
    # Each line time-stamped as nvidia-smi's samples are, to place the log beside them.
    peak sdxl_generate_da$i timeout ${GEN_TIMEOUT:-200} bash -c "time /tmp/ls generate --model /tmp/sdxl --prompt 'a lighthouse at dusk' --seed 7 --width 1024 --height 1024 --steps ${STEPS:-4} --device gpu --out /tmp/da$i.png --overwrite 2>&1 | python3 -u /tmp/stamp.py" > /dev/null
    cp /tmp/mem-sdxl_generate_da$i.txt $OUT/
  done
  cd /tmp
  PARTS=${TORCH_PARTS:-sdxl} timeout ${TORCH_TIMEOUT:-120} python3 $REPO/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_da.txt
  timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_da.txt
  ;;
cz)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-70} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cz.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-190} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt_cz.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl_cz.txt
  ;;
cy)
  # A real checkpoint's load: a full-size SDXL base folder of random fp16 weights written here
  # (bench/make_sdxl.py, 6.5 GiB), then `generate` at 1024² in two processes sharing a tuning
  # folder (the first tunes), each under the peak sampler (its samples kept to place the peak).
  timeout ${MAKE_TIMEOUT:-200} python3 $OLDPWD/bench/make_sdxl.py /tmp/sdxl 2>&1 | grep -v Warning | tee $OUT/make_cy.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for i in 1 2; do
    peak sdxl_generate_cy$i timeout ${GEN_TIMEOUT:-170} bash -c "time /tmp/ls generate --model /tmp/sdxl --prompt 'a lighthouse at dusk' --seed 7 --width 1024 --height 1024 --steps 20 --device gpu --out /tmp/cy$i.png --overwrite"
    cp /tmp/mem-sdxl_generate_cy$i.txt $OUT/
  done
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-60} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cy.txt
  timeout ${OURS_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cy.txt
  ;;
cx)
  PARTS=${TORCH_PARTS:-unet16,e2e,sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cx.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-130} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 --norms-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cx.txt
  timeout ${VAE_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cx.txt
  timeout ${E2E_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cx.txt
  timeout ${SDXL_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --kernel-profile 1 --norms-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cx.txt
  ;;
cw)
  PARTS=${TORCH_PARTS:-unet16,vae,sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cw.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 --norms-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cw.txt
  timeout ${VAE_TIMEOUT:-70} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cw.txt
  timeout ${SDXL_TIMEOUT:-210} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --kernel-profile 1 --norms-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cw.txt
  ;;
cv)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cv.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 --norms-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cv.txt
  timeout ${VAE_TIMEOUT:-90} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cv.txt
  LATENT_STUDIO_GROUP_NORM_POOLED=off timeout ${VAE_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 3 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cv_off.txt
  timeout ${E2E_TIMEOUT:-110} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cv.txt
  ;;
cq)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cq.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${VAE_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cq.txt
  timeout ${E2E_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cq.txt
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cq.txt
  ;;
cu)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cu.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cu.txt
  timeout ${VAE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cu.txt
  timeout ${E2E_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cu.txt
  ;;
ct)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_ct.txt
  timeout ${VAE_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_ct.txt
  ;;
cs)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning-cs
  peak sdxl_peak_cs timeout ${PEAK_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 1 --steps 20 --sdxl --pipeline-only
  cp /tmp/mem-sdxl_peak_cs.txt $OUT/
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only --no-ops --no-profile --no-burn-ops --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cs.txt
  timeout ${VAE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 3 --vae-only --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cs.txt
  ;;
cr)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  peak sdxl_peak_cr1 timeout ${PEAK_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 1 --steps 20 --sdxl --pipeline-only
  peak sdxl_peak_cr2 timeout ${PEAK_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --sdxl --pipeline-only
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-60} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cr.txt
  timeout ${OURS_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cr.txt
  ;;
cp)
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-100} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cp.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cp.txt
  timeout ${SDXL_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cp.txt
  ;;
co)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_co.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_co.txt
  timeout ${VAE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_co.txt
  timeout ${E2E_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_co.txt
  ;;
cn)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cn.txt
  timeout ${VAE_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 2 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cn.txt
  timeout ${SDXL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --kernel-profile 1 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cn.txt
  ;;
cm)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e,sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cm.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cm.txt
  timeout ${E2E_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cm.txt
  timeout ${VAE_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cm.txt
  timeout ${SDXL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cm.txt
  [ "${PEAK:-1}" = 1 ] && peak sdxl_peak_cm timeout ${PEAK_TIMEOUT:-90} /tmp/ls bench --device gpu --precision f16 --runs 1 --steps 20 --sdxl --pipeline-only
  ;;
cl)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cl.txt
  timeout ${VAE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cl.txt
  timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cl.txt
  [ "${PROFILE:-1}" = 1 ] && timeout ${PROFILE_TIMEOUT:-90} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --channels-last-min-tiles 0 --kernel-profile 2 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cl_prof.txt
  ;;
ck)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-140} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --rows-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_ck.txt
  timeout ${SDXL_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --rows-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_ck.txt
  ;;
cj)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e,sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cj.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  timeout ${OURS_TIMEOUT:-130} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --rows-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cj.txt
  timeout ${E2E_TIMEOUT:-110} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|step [0-9]*/20 at" | tee $OUT/e2e_cj.txt
  timeout ${VAE_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cj.txt
  timeout ${SDXL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --rows-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cj.txt
  ;;
ci)
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  LATENT_STUDIO_BENCH_WG=none timeout ${GEMM_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 5 --workgroup-gemm 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/rows_ci.txt
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --rows-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_ci.txt
  [ "${SDXL:-1}" = 1 ] && timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --rows-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_ci.txt
  ;;
cg)
  PARTS=${TORCH_PARTS:-unet16,prof,vae,sdxl,sdxl_prof} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_cg.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  LATENT_STUDIO_BENCH_WG=none timeout ${GEMM_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --workgroup-gemm 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/geglu_cg.txt
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --rows-ab --kernel-profile 2 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_cg.txt
  timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --rows-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_cg.txt
  [ "${VAE:-1}" = 1 ] && timeout ${VAE_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only --kernel-profile 2 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/vae_cg.txt
  ;;
cf)
  # One process a variant (WG="lanes:bmxbnxbk ..."): a variant that loses the device poisons
  # every later launch in its process.
  for v in ${WG:-256:128x128x32}; do
    LATENT_STUDIO_BENCH_WG=$v timeout ${OURS_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 5 --workgroup-gemm $EXTRA 2>&1 | grep -v "Caused by\|Too m\|Requested\|acktrace\|^shader\|^SIMT\|^our GEMM\|^device:" | tail -c 6000 | tee -a $OUT/workgroup.txt
  done
  ;;
cd)
  timeout ${CEILING_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-ceiling $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/attention_cd.txt
  ;;
cc)
  # `auto` placing the refiner by the adapter's memory (`devices` above prints it): the H200's
  # 141 GiB keep it on the device beside the base.
  timeout ${OURS_TIMEOUT:-75} /tmp/ls bench --device auto --precision f16 --runs 3 --steps 20 --sdxl --pipeline-only --refiner --text-encoders auto 2>&1 | grep -v "step [0-9]*/20 at" | tee $OUT/auto.txt
  ;;
cb)
  PARTS=${TORCH_PARTS:-sdxl_e2e,sdxl_refiner} timeout ${TORCH_TIMEOUT:-200} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_cb.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  # The turns' uploads and host copies are logged at info.
  export RUST_LOG=warn,latent_engine::stable_diffusion=info
  for run in ${RUNS:-host1 host2 device}; do
    place=host; [ $run = device ] && place=device
    peak sdxl_pair_$run timeout $([ $run = host1 ] && echo ${FIRST_TIMEOUT:-200} || echo ${LATER_TIMEOUT:-130}) /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --sdxl --pipeline-only --refiner --text-encoders $place --swaps ${SWAPS:-0}
    python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_pair_$run.txt /tmp/mem-sdxl_pair_$run.txt | sed "s/^/$run /" | tee -a $OUT/memory.txt
  done
  export RUST_LOG=warn
  ;;
ca)
  # The plain VAE decode (VAE compilation off: burn ops' GroupNorm) before and after its sums in
  # pieces (engine/src/nn/rows.rs): .gpu/latent-studio-old.xz is the build before, one process
  # each, interleaved; the compiled decode rides along (unchanged code).
  unxz_py $OLDPWD/.gpu/latent-studio-old.xz > /tmp/ls-old && chmod +x /tmp/ls-old
  for round in 1 2 3; do
    for b in old new; do
      bin=/tmp/ls; [ $b = old ] && bin=/tmp/ls-old
      timeout 150 $bin bench --device gpu --precision f16 --runs 7 --vae-only 2>&1 | grep "VAE decode 512x512" | sed "s/^/$b round $round: /" | tee -a $OUT/ab.txt
    done
  done
  for b in old new; do
    bin=/tmp/ls; [ $b = old ] && bin=/tmp/ls-old
    LATENT_STUDIO_COMPILER=wgsl timeout 150 $bin bench --device gpu --precision f16 --runs 7 --vae-only 2>&1 | grep "VAE decode 512x512" | sed "s/^/$b wgsl: /" | tee -a $OUT/ab.txt
  done
  ;;
bu)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bu.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-180} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  ;;
bz)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bz.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  LATENT_STUDIO_CMMA=off timeout ${WIDE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-conv ${SIMT_CONV:-8x8-16} --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_conv.txt
  ;;
by)
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  LATENT_STUDIO_CMMA=off timeout ${WIDE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-conv ${SIMT_CONV:-8x8-16n} --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_conv.txt
  ;;
bx)
  PARTS=${TORCH_PARTS:-unet16,unet32} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bx.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-180} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  LATENT_STUDIO_CMMA=off timeout ${WIDE_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-conv 8x8-16 --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_wide.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  timeout ${F32_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  ;;
bw)
  PARTS=${TORCH_PARTS:-unet16,unet32} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bw.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-180} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  timeout ${F32_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  ;;
bt|bv)
  PARTS=${TORCH_PARTS:-unet16,unet32} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_$PART.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-180} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  timeout ${F32_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  ;;
bs)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bs.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears 4x4 --kernel-profile 1 --simt-ab --product-ab 4x4,4x4v,8x8 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  LATENT_STUDIO_CMMA=off timeout ${BURN_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears burn $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_burn.txt
  ;;
br)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_br.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears ${SPIRV_LINEARS:-4x4v} --kernel-profile 1 --simt-ab --product-ab ${SPIRV_PRODUCTS:-4x4,4x4v,4x4vp,8x8v,8x8vp} $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --product-ab ${WGSL_PRODUCTS:-burn,4x4v,4x4vp,8x8vp} $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  ;;
bq)
  # Every SD 1.5 attention shape alone under WGSL (f16): burn's and each of our tilings, the
  # per-row kernel on vectors among them (which key tile suits it now).
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 3 --attention-only $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl_attention.txt
  ;;
bp)
  # f32's linears on the SIMT product with scalar or vector staging, one process each,
  # alternating (burn's matmul, the A/B's first variant, tunes for minutes in f32), then the
  # SIMT variants under SPIR-V with cooperative matrices off (an iGPU's Vulkan route).
  for round in 1 2; do
    for linears in 8x8 8x8v; do
      echo "== f32, linears $linears, round $round" | tee -a $OUT/ours_f32.txt
      timeout ${F32_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears $linears $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee -a $OUT/ours_f32.txt
    done
  done
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  ;;
bo)
  # The SIMT product on vectors (the thirty-fourth session's second call): PyTorch's fp16 and
  # fp32 steps, then the step with the linears on burn's matmul or the SIMT product in each
  # compilation (`--product-ab`) under WGSL (f16) and in f32; then the SIMT convolution's and
  # attention's variants (`--simt-ab`) under SPIR-V with cooperative matrices off, the route
  # of an iGPU on Vulkan.
  PARTS=${TORCH_PARTS:-unet16,unet32} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bo.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --product-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  timeout ${F32_TIMEOUT:-160} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --product-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  LATENT_STUDIO_CMMA=off timeout ${SPIRV_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv_simt.txt
  ;;
bn)
  # The SIMT convolution's staging read as vectors (the thirty-fourth session): PyTorch's fp16
  # and fp32 steps, then ours on the WGSL/SIMT path (f16) and in f32 (SPIR-V, the SIMT
  # kernels: no f32 cooperative matrices), each step under the five SIMT variants interleaved
  # (`--simt-ab`) and one step's kernels profiled.
  PARTS=${TORCH_PARTS:-unet16,unet32} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bn.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  timeout ${F32_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  ;;
bi)
  # The cooperative matrices' ceiling (products alone, + the GEMM's fragment loads, + its
  # barriers, + its staging stores; no global memory), beside our GEMM and burn's matmul on
  # 4096³, then every GEMM compilation on SDXL's linear shapes (each alone).
  timeout ${OURS_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 5 --mma-ceiling $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ceiling.txt
  ;;
bj)
  # PyTorch's SDXL and SD 1.5 steps, then ours: SDXL's step with one step's kernels profiled by
  # op and its rules A/B'd (`--conv-ab`), then SD 1.5's step under the small-grid GEMM rules
  # (`--gemm-ab` with LATENT_STUDIO_BENCH_KNOBS=small). The thirty-second session ran it with a
  # rule (since removed) sending the smallest linears to burn's matmul.
  PARTS=sdxl,unet16 timeout ${TORCH_TIMEOUT:-100} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_bj.txt
  timeout ${SDXL_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --conv-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_bj.txt
  LATENT_STUDIO_BENCH_KNOBS=small timeout ${OURS_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_bj.txt
  ;;
bk|ce)
  # ce: the same runs under the thirty-ninth session's longer ceiling (its ladder grew).
  ceiling=100; [ $PART = ce ] && ceiling=170
  PARTS=sdxl,unet16 timeout ${TORCH_TIMEOUT:-100} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v "Warning\|kept in float32" | tee $OUT/torch_$PART.txt
  timeout ${CEILING_TIMEOUT:-$ceiling} /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-ceiling $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/attention_$PART.txt
  timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_$PART.txt
  timeout ${OURS_TIMEOUT:-110} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_$PART.txt
  ;;
bm)
  PARTS=${TORCH_PARTS:-e2e} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bm.txt
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for launch in 1 2; do
    peak sd15_launch$launch timeout $((launch == 1 ? ${SD15_TIMEOUT:-150} : 80)) /tmp/ls bench --device gpu --precision f16 --runs 5 --steps 20 --pipeline-only
  done
  ;;
bl)
  [ "${ATTENTION:-1}" = 1 ] && timeout ${CEILING_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-ceiling $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/attention_bl.txt
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  for launch in 1 2 3; do
    if [ $launch = 2 ]; then export LATENT_STUDIO_KEEP_POOL=1; else unset LATENT_STUDIO_KEEP_POOL; fi
    peak sdxl_pool$launch timeout $((launch == 1 ? ${SDXL_TIMEOUT:-170} : 110)) /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --sdxl --pipeline-only --text-encoders host
    python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_pool$launch.txt /tmp/mem-sdxl_pool$launch.txt | sed "s/^/sdxl launch $launch /" | tee -a $OUT/memory.txt
  done
  unset LATENT_STUDIO_KEEP_POOL
  ;;
a)
  PARTS=${TORCH_PARTS:-unet16,vae,taesd,clip,e2e,compile} timeout 200 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_a.txt
  timeout ${OURS_TIMEOUT:-370} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-previews --decisions $OUT/decisions_f16.jsonl 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_f16.txt
  ;;
b)
  PARTS=unet32 timeout 120 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_b.txt
  timeout 250 /tmp/ls bench --device gpu --precision f32 --runs 7 --no-pipeline --no-ops 2>&1 | tee $OUT/ours_f32.txt
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  peak ours_mem timeout 240 /tmp/ls bench --device gpu --precision f16 --runs 5 --steps 20 --no-ops --no-previews
  ;;
c)
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  peak ours_mem timeout 240 /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --pipeline-only
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-560} /tmp/ls bench --device gpu --precision f16 --runs 3 --no-pipeline --no-ops 2>&1 | tee $OUT/ours_wgsl.txt
  ;;
d)
  # How many kernels cubecl's wgpu runtime batches per queue submission (default 32).
  for t in ${TASKS:-32 256}; do
    CUBECL_WGPU_MAX_TASKS=$t timeout 170 /tmp/ls bench --device gpu --precision f16 --runs 9 --no-ops --unet-only 2>&1 | grep "UNet step\|enqueue" | sed "s/^/max_tasks=$t /" | tee -a $OUT/tasks.txt
  done
  ;;
e)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 170 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_e.txt
  mkdir -p /tmp/perf && unxz_py $OLDPWD/.perf/perf.txz | tar xf - -C /tmp/perf && cp /tmp/ls /tmp/latent-studio
  P="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
  ours="timeout ${OURS_TIMEOUT:-400} /tmp/latent-studio bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews"
  if $P record -o /tmp/probe.data -- true >/dev/null 2>&1; then
    $P record -F 499 -o /tmp/perf.data -- $ours 2>&1 | tee $OUT/ours_f16.txt
    $P report -i /tmp/perf.data --sort comm --stdio 2>/dev/null | grep % | head -20 | tee $OUT/perf_comm.txt
    for c in $(grep % $OUT/perf_comm.txt | awk '{print $2}' | head -4); do
      $P report -i /tmp/perf.data --comm "$c" --sort dso,sym --stdio 2>/dev/null | grep % | head -80 > "$OUT/perf_$c.txt"
    done
  else
    echo "perf cannot record here; bench without it" | tee $OUT/perf_comm.txt
    $ours 2>&1 | tee $OUT/ours_f16.txt
  fi
  ;;
f)
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-540} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only --no-ops 2>&1 | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_VAE_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 3 --vae-only 2>&1 | tee -a $OUT/ours_wgsl.txt
  ;;
g)
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-540} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_wgsl_ops.txt
  ;;
i)
  PARTS=${TORCH_PARTS:-unet16,vae} timeout 150 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_i.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops 2>&1 | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_VAE_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | tee -a $OUT/ours_wgsl.txt
  ;;
j)
  PARTS=${TORCH_PARTS:-unet16,vae} timeout 140 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_j.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_wgsl_ops.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_VAE_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --vae-only 2>&1 | tee -a $OUT/ours_wgsl.txt
  ;;
k)
  PARTS=unet16 timeout 120 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_k.txt
  timeout ${OURS_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops 2>&1 | tee $OUT/ours_spirv.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-220} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops 2>&1 | tee $OUT/ours_wgsl.txt
  ;;
l)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 140 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_l.txt
  timeout ${OURS_TIMEOUT:-420} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews 2>&1 | tee $OUT/ours_spirv.txt
  ;;
m)
  PARTS=unet16 timeout 80 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_m.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops 2>&1 | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_CMMA=off timeout ${SIMT_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops 2>&1 | tee $OUT/ours_spirv_simt.txt
  ;;
n)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 130 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_n.txt
  timeout ${OURS_TIMEOUT:-370} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  timeout ${ATTN_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 7 --attention-only 2>&1 | tee $OUT/ours_attention.txt
  ;;
o)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_o.txt
  timeout ${OURS_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  timeout ${ATTN_TIMEOUT:-45} /tmp/ls bench --device gpu --precision f16 --runs 1 --attention-only 2>&1 | grep "burn\|q64 k8" | tee $OUT/ours_attention.txt
  ;;
p)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 120 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_p.txt
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  peak ours_spirv timeout ${OURS_TIMEOUT:-360} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile
  ;;
r)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 110 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_r.txt
  timeout ${OURS_TIMEOUT:-440} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
s)
  PARTS=unet16 timeout 75 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_s.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-270} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only --no-burn-ops --no-profile 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_wgsl_ops.txt
  LATENT_STUDIO_COMPILER=wgsl LATENT_STUDIO_MATMUL=burn timeout ${BURN_TIMEOUT:-110} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | tee $OUT/ours_wgsl_burn_matmul.txt
  LATENT_STUDIO_CMMA=off timeout ${SIMT_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | tee $OUT/ours_spirv_simt.txt
  ;;
t)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_t.txt
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | tee $OUT/ours_wgsl.txt
  timeout ${OPS_TIMEOUT:-230} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only --no-burn-ops --no-profile 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_spirv_ops.txt
  ;;
u)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_u.txt
  timeout ${ATT_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-only 2>&1 | tee $OUT/ours_attention.txt
  timeout ${CONV_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --conv-only 2>&1 | tee $OUT/ours_conv.txt
  timeout ${OURS_TIMEOUT:-250} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
v)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_v.txt
  timeout ${ATT_TIMEOUT:-230} /tmp/ls bench --device gpu --precision f16 --runs 3 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_attention.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-burn-ops --no-profile 2>&1 | tee $OUT/ours_wgsl.txt
  ;;
w)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_w.txt
  LATENT_STUDIO_BENCH_PLANS=${PLANS:-planes,per-row} timeout ${ATT_TIMEOUT:-130} /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_attention.txt
  timeout ${OURS_TIMEOUT:-260} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
au)
  # The planes attention kernel's plans on SD 1.5's attention shapes against burn's, then the
  # step under each planes rule, interleaved, with the rest of the default path end to end.
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-110} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_au.txt
  LATENT_STUDIO_BENCH_PLANS=${PLANS:-16x16x16 q64 k64,16x16x16 q64 k16} timeout ${ATT_TIMEOUT:-90} /tmp/ls bench --device gpu --precision f16 --runs 3 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace\|prefetch" | tee $OUT/ours_attention.txt
  timeout ${OURS_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  grep -h "median\|ms" $OUT/torch_au.txt | tail -8
  ;;
az)
  export LATENT_STUDIO_BENCH_KNOBS=small
  if [ "${TORCH:-1}" = 1 ]; then
    PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-110} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_az.txt
  fi
  timeout ${GEMM_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  timeout ${OURS_TIMEOUT:-380} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 ${EXTRA:---unet-only} --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 2 --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  grep -h "median" $OUT/torch_az.txt 2>/dev/null | tail -4
  ;;
ba)
  export LATENT_STUDIO_BENCH_KNOBS=small
  if [ "${TORCH:-0}" = 1 ]; then
    PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-110} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ba.txt
  fi
  timeout ${GEMM_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  timeout ${OURS_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 ${EXTRA:---unet-only} --no-ops --no-previews --no-profile --no-burn-ops --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  grep -h "median" $OUT/torch_ba.txt 2>/dev/null | tail -4
  ;;
ay)
  # SDXL's 1024² txt2img with the decode tiled by auto (above 768² pixels since the twenty-fifth
  # session), its encoders parked, under the peak sampler, placed by phase.
  peak sdxl_host timeout ${SDXL_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --sdxl --pipeline-only --text-encoders host
  python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_host.txt /tmp/mem-sdxl_host.txt | tee $OUT/sdxl_phases.txt
  grep "reserved\|median\|decode" $OUT/sdxl_host.txt | tail -8
  ;;
ax)
  # Memory, each in a process of its own under the peak sampler: SDXL's 1024² VAE decode alone,
  # tiled and whole (after the weights, no UNet step); then SD 1.5's 20-step 512² txt2img,
  # PyTorch's and ours (ours now keeps its recorded step between generations).
  for mode in tiled whole; do
    peak sdxl_decode_$mode timeout 150 /tmp/ls bench --device gpu --precision f16 --runs 3 --sdxl --text-encoders host --sdxl-decode $mode
    grep "SDXL\|reserved\|pool" $OUT/sdxl_decode_$mode.txt | tail -8
  done
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  tail -3 $OUT/torch_mem.txt
  peak ours_mem timeout 200 /tmp/ls bench --device gpu --precision f16 --runs 5 --steps 20 --pipeline-only
  grep "txt2img\|reserved" $OUT/ours_mem.txt
  ;;
aw)
  # The session's final build: PyTorch, then our planes attention's default plans against
  # burn's, then the default path end to end with the step's kernel profile and the planes
  # rules (loads, prefetch, tilings) interleaved.
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-110} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_aw.txt
  LATENT_STUDIO_BENCH_PLANS=${PLANS:-wide prefetch 16x16x16 q64 k64,wide prefetch 16x16x16 q64 k16} timeout ${ATT_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 3 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_attention.txt
  timeout ${OURS_TIMEOUT:-360} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 2 --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  grep -h "median" $OUT/torch_aw.txt | tail -4
  ;;
av)
  # The planes rules (loads, prefetch, tilings, widest head) on replayed steps only.
  timeout ${OURS_TIMEOUT:-400} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  ;;
x)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 110 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_x.txt
  LATENT_STUDIO_BENCH_PLANS=${PLANS:-planes prefetch 16x16x16 q64 k16,planes prefetch 16x16x16 q32 k16} timeout ${ATT_TIMEOUT:-60} /tmp/ls bench --device gpu --precision f16 --runs 3 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_attention.txt
  timeout ${OURS_TIMEOUT:-320} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
y)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout 110 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_y.txt
  timeout ${OURS_TIMEOUT:-450} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --planes-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
y2)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 90 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_y2.txt
  timeout ${OURS_TIMEOUT:-440} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --hires-scale 2 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
z)
  PARTS=unet16 timeout 70 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_z.txt
  timeout ${OPS_TIMEOUT:-480} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only --no-burn-ops --no-profile 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_spirv_ops.txt
  ;;
aa)
  timeout ${CONV_TIMEOUT:-400} /tmp/ls bench --device gpu --precision f16 --runs 5 --conv-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_conv.txt
  ;;
ab)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ab.txt
  timeout ${OURS_TIMEOUT:-450} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
ac)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ac.txt
  timeout ${OURS_TIMEOUT:-470} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 3 --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
ad)
  timeout ${GEMM_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ad.txt
  timeout ${OURS_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
ae)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ae.txt
  timeout ${OURS_TIMEOUT:-470} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 3 --conv-ab --gemm-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
af)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_af.txt
  timeout ${OURS_TIMEOUT:-470} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 3 --conv-ab 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
ag)
  timeout ${GEMM_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  PARTS=${TORCH_PARTS:-unet16} timeout 80 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ag.txt
  timeout ${OURS_TIMEOUT:-280} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-profile --no-burn-ops --gemm-ab --kernel-profile 3 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
ah)
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 100 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ah.txt
  timeout ${OURS_TIMEOUT:-360} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 3 --profile-linears --gemm-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  timeout ${GEMM_TIMEOUT:-80} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  ;;
ai)
  timeout ${GEMM_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f16 --runs 5 --gemm-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/gemm.txt
  PARTS=${TORCH_PARTS:-unet16,e2e} timeout 90 python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ai.txt
  timeout ${OURS_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 3 --profile-linears --gemm-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_spirv.txt
  ;;
bb)
  if [ "${TORCH:-0}" = 1 ]; then
    PARTS=${TORCH_PARTS:-e2e} timeout ${TORCH_TIMEOUT:-100} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bb.txt
  fi
  export LATENT_STUDIO_TUNING_CACHE=/tmp/tuning
  # SD 1.5: launch 1 tunes and generates SPIR-V; launch 2 restores the tuning only
  # (LATENT_STUDIO_KEEP_SPIRV=0); launch 3 restores both.
  for launch in 1 2 3; do
    export LATENT_STUDIO_KEEP_SPIRV=$([ $launch = 2 ] && echo 0 || echo 1)
    peak sd15_launch$launch timeout $((launch == 1 ? ${SD15_TIMEOUT:-140} : 80)) /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --pipeline-only
  done
  unset LATENT_STUDIO_KEEP_SPIRV
  for launch in 1 2; do
    peak sdxl_launch$launch timeout $((launch == 1 ? ${SDXL_TIMEOUT:-150} : 120)) /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --sdxl --pipeline-only --text-encoders host
    python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_launch$launch.txt /tmp/mem-sdxl_launch$launch.txt | sed "s/^/sdxl launch $launch /" | tee -a $OUT/memory.txt
  done
  ls -la /tmp/tuning | tee -a $OUT/memory.txt
  ;;
bc)
  PARTS=${TORCH_PARTS:-sdxl,sdxl_e2e,sdxl_refiner} timeout ${TORCH_TIMEOUT:-240} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bc.txt
  peak sdxl_refiner_ours timeout ${OURS_TIMEOUT:-320} /tmp/ls bench --device gpu --precision f16 --runs 3 --steps 20 --sdxl --refiner $EXTRA
  python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_refiner_ours.txt /tmp/mem-sdxl_refiner_ours.txt | tee -a $OUT/memory.txt
  ;;
bd)
  for m in ours burn; do
    if [ $m = burn ]; then export LATENT_STUDIO_MATMUL=burn; else unset LATENT_STUDIO_MATMUL; fi
    timeout ${OURS_TIMEOUT:-270} /tmp/ls bench --device gpu --precision f16 --runs 7 --sdxl --no-pipeline $EXTRA 2>&1 | grep -v " at [0-9:.]* UTC$" | sed "s/^/$m /" | tee -a $OUT/sdxl_linears.txt
  done
  unset LATENT_STUDIO_MATMUL
  ;;
be)
  PARTS=${TORCH_PARTS:-unet16,e2e,hires} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_be.txt
  timeout ${OURS_TIMEOUT:-380} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --hires-scale 2 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_be.txt
  ;;
bg)
  PARTS=${TORCH_PARTS:-unet16,sdxl} timeout ${TORCH_TIMEOUT:-200} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bg.txt
  export LATENT_STUDIO_BENCH_PLANS=${PLANS:-planes wide prefetch}
  timeout 150 /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/attention_long.txt
  timeout 90 /tmp/ls bench --device gpu --precision f16 --runs 5 --attention-only 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/attention_sd15.txt
  unset LATENT_STUDIO_BENCH_PLANS
  timeout ${OURS_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sd15_step.txt
  ;;
bh)
  PARTS=${TORCH_PARTS:-sdxl} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_bh.txt
  timeout ${OURS_TIMEOUT:-420} /tmp/ls bench --device gpu --precision f16 --runs 5 --sdxl --no-pipeline --planes-ab --conv-ab --kernel-profile 2 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/sdxl_bh.txt
  ;;
bf)
  timeout ${OURS_TIMEOUT:-400} /tmp/ls bench --device gpu --precision f16 --runs 7 --unet-only --no-ops --no-burn-ops --no-profile --lora-rank ${RANK:-32} $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/lora.txt
  ;;
aj)
  PARTS=${TORCH_PARTS:-sdxl,sdxl_e2e} timeout ${TORCH_TIMEOUT:-200} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_aj.txt
  peak sdxl_ours timeout ${OURS_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f16 --runs 5 --steps 20 --sdxl $EXTRA
  ;;
ak)
  PARTS=${TORCH_PARTS:-unet16,unet32,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ak.txt
  peak torch_mem timeout 90 python3 $OLDPWD/bench/torch_txt2img_mem.py
  peak ours_mem timeout ${OURS_TIMEOUT:-270} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops
  timeout ${F32_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f32 --runs 5 --no-pipeline --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  ;;
al)
  PARTS=${TORCH_PARTS:-unet16,vae} timeout ${TORCH_TIMEOUT:-100} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_al.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-420} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  ;;
am)
  PARTS=${TORCH_PARTS:-unet32} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_am.txt
  timeout ${F32_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  timeout ${OPS_TIMEOUT:-240} /tmp/ls bench --device gpu --precision f32 --runs 3 --unet-only --no-profile --no-burn-ops $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | grep -v "^\[F32\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_f32_ops.txt
  ;;
an)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-80} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_an.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-460} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  ;;
ao)
  PARTS=${TORCH_PARTS:-unet32} timeout ${TORCH_TIMEOUT:-120} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ao.txt
  timeout ${F32_TIMEOUT:-330} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears 8x8 --product-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  timeout ${OPS_TIMEOUT:-120} /tmp/ls bench --device gpu --precision f32 --runs 5 --linear-only $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32_linears.txt
  ;;
ap)
  PARTS=${TORCH_PARTS:-unet16} timeout ${TORCH_TIMEOUT:-90} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ap.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-360} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears 8x8 --product-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${OPS_TIMEOUT:-100} /tmp/ls bench --device gpu --precision f16 --runs 5 --linear-only $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl_linears.txt
  ;;
aq)
  PARTS=${TORCH_PARTS:-unet32,unet16} timeout ${TORCH_TIMEOUT:-130} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_aq.txt
  timeout ${F32_TIMEOUT:-180} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-ab $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  LATENT_STUDIO_COMPILER=wgsl timeout ${WGSL_TIMEOUT:-270} /tmp/ls bench --device gpu --precision f16 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops --simt-linears 8x8 --product-ab --kernel-profile 1 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_wgsl.txt
  ;;
ar)
  PARTS=${TORCH_PARTS:-unet16,unet32,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_ar.txt
  timeout ${OURS_TIMEOUT:-300} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --pipeline-anatomy $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  timeout ${F32_TIMEOUT:-130} /tmp/ls bench --device gpu --precision f32 --runs 5 --unet-only --no-ops --no-profile --no-burn-ops $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f32.txt
  ;;
as)
  PARTS=${TORCH_PARTS:-unet16,vae,e2e} timeout ${TORCH_TIMEOUT:-150} python3 $OLDPWD/bench/torch_anchor.py 2>&1 | grep -v Warning | tee $OUT/torch_as.txt
  timeout ${VAE_TIMEOUT:-150} /tmp/ls bench --device gpu --precision f16 --runs 7 --vae-only --kernel-profile 4 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_vae.txt
  timeout ${OURS_TIMEOUT:-200} /tmp/ls bench --device gpu --precision f16 --runs 7 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops --kernel-profile 2 $EXTRA 2>&1 | grep -v "WARN\|Caused by\|Too m\|Requested\|acktrace" | tee $OUT/ours_f16.txt
  peak sdxl_host timeout ${SDXL_TIMEOUT:-170} /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --sdxl --pipeline-only --text-encoders host
  cp /tmp/mem-sdxl_host.txt $OUT/
  python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_host.txt /tmp/mem-sdxl_host.txt | tee $OUT/sdxl_phases.txt
  ;;
at)
  # Weights in cubecl's persistent pool or in the shared pages (LATENT_STUDIO_WEIGHT_POOL): the
  # VAE, SD 1.5's txt2img and SDXL's 1024² peak, each pair in one process each, interleaved.
  for pool in shared persistent; do
    LATENT_STUDIO_WEIGHT_POOL=$pool timeout 150 /tmp/ls bench --device gpu --precision f16 --runs 7 --vae-only 2>&1 | grep "VAE decode 512x512" | sed "s/^/$pool /" | tee -a $OUT/ab.txt
    LATENT_STUDIO_WEIGHT_POOL=$pool timeout 200 /tmp/ls bench --device gpu --precision f16 --runs 5 --steps 20 --no-ops --no-previews --no-profile --no-burn-ops 2>&1 | grep "replayed\|txt2img\|reserved" | sed "s/^/$pool /" | tee -a $OUT/ab.txt
  done
  for pool in shared persistent; do
    LATENT_STUDIO_WEIGHT_POOL=$pool peak sdxl_$pool timeout 170 /tmp/ls bench --device gpu --precision f16 --runs 2 --steps 20 --sdxl --pipeline-only --text-encoders host > /dev/null
    python3 $OLDPWD/bench/mem_phases.py $OUT/sdxl_$pool.txt /tmp/mem-sdxl_$pool.txt | sed "s/^/$pool /" | tee -a $OUT/ab.txt
    grep "reserved\|median" $OUT/sdxl_$pool.txt | sed "s/^/$pool /" | tee -a $OUT/ab.txt
  done
  ;;
h)
  timeout ${OURS_TIMEOUT:-540} /tmp/ls bench --device gpu --precision f16 --runs 3 --unet-only 2>&1 | grep -v "^\[F16\]   [a-z_]*  *[0-9.]* ms  {" | tee $OUT/ours_spirv_ops.txt
  ;;
esac
