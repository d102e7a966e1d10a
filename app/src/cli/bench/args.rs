//! The `bench` subcommand's arguments: which workloads run, and the rules they run under.

use clap::Args;
use latent_engine::Precision;
use latent_engine::device::DeviceChoice;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// auto, cpu, gpu, gpu:N or part of an adapter name (`arc`, `lavapipe`).
    #[arg(long, default_value = "auto")]
    pub(super) device: DeviceChoice,
    /// Precisions to measure, comma separated.
    #[arg(long, default_value = "f32,f16", value_delimiter = ',')]
    pub(super) precision: Vec<Precision>,
    /// Timed repetitions per measurement.
    #[arg(long, default_value_t = 10)]
    pub(super) runs: usize,
    /// Steps of the end-to-end run.
    #[arg(long, default_value_t = 20)]
    pub(super) steps: usize,
    /// Skip the end-to-end txt2img run.
    #[arg(long)]
    pub(super) no_pipeline: bool,
    /// Only the end-to-end txt2img (for measuring a process's peak device memory from outside).
    #[arg(long)]
    pub(super) pipeline_only: bool,
    /// Skip the preview-overhead runs after the end-to-end txt2img.
    #[arg(long)]
    pub(super) no_previews: bool,
    /// After the end-to-end txt2img, the same with a hires fix by this factor (Latent upscaler,
    /// half the steps again at strength 0.5, as a quick A1111 hires pass).
    #[arg(long)]
    pub(super) hires_scale: Option<f64>,
    /// Skip the op-by-op kernel report.
    #[arg(long)]
    pub(super) no_ops: bool,
    /// Skip the UNet step with burn ops in place of our kernels (it tunes kernels of its own:
    /// minutes on a fresh GPU).
    #[arg(long)]
    pub(super) no_burn_ops: bool,
    /// Only the UNet step (and its host enqueue time).
    #[arg(long)]
    pub(super) unet_only: bool,
    /// Only the attention report: every SD 1.5 attention shape (with `--sdxl`: SDXL's at 1024²
    /// and SD 1.5's at a 1024² hires pass), burn's and each tiling of ours.
    #[arg(long)]
    pub(super) attention_only: bool,
    /// Only the convolution report: every SD 1.5 UNet 3×3 convolution shape, burn's and ours.
    #[arg(long)]
    pub(super) conv_only: bool,
    /// After the txt2img: the same at fewer steps (per-step and fixed costs inside the
    /// pipeline) and each step's host time stamp.
    #[arg(long)]
    pub(super) pipeline_anatomy: bool,
    /// Only the linear report: every SD 1.5 UNet linear shape on burn's matmul and the SIMT
    /// product in 4 × 4 and 8 × 8 lane blocks, with the transformer block's epilogues.
    #[arg(long)]
    pub(super) linear_only: bool,
    /// Skip the per-block UNet profile (a sync after each block: it tunes fused kernels of its
    /// own, minutes on a fresh GPU, and does not describe the unsynchronised step).
    #[arg(long)]
    pub(super) no_profile: bool,
    /// Diagnostic: divide the UNet's channel widths by this (the same ops and op count at smaller
    /// sizes), to profile the host's per-op cost on a slow device such as lavapipe.
    #[arg(long, default_value_t = 1, hide = true)]
    pub(super) unet_divisor: usize,
    /// Instead of the random-weight model: time the model cache with this checkpoint (load from
    /// the checkpoint, from the disk cache, resident; second-generation start with cache on/off).
    #[arg(long)]
    pub(super) cache_model: Option<std::path::PathBuf>,
    /// After the UNet step, the same step under other rules for the planes attention kernel
    /// (its staged key/value rows packed instead of padded, other tilings; SD 1.5's or, with
    /// `--sdxl`, SDXL's), interleaved over three rounds in the same process.
    #[arg(long)]
    pub(super) planes_ab: bool,
    /// After the UNet step (SD 1.5 replayed, or SDXL's with `--sdxl`), the same step with our
    /// GEMM's step-invariant offsets formed at every step instead of once before the reduction
    /// (SD 1.5's outputs compared), interleaved over three rounds.
    #[arg(long)]
    pub(super) rows_ab: bool,
    /// After the UNet step, the same step with our cooperative-matrix convolution on more or
    /// fewer map sizes (with `--sdxl`: SDXL's step under convolution and GEMM rules),
    /// interleaved over three rounds in the same process.
    #[arg(long)]
    pub(super) conv_ab: bool,
    /// Layers of at least this many 64 × 64 output tiles run channels-last on our GEMM for the
    /// whole run (0: every layer it takes; default: the engine's rule).
    #[arg(long)]
    pub(super) channels_last_min_tiles: Option<usize>,
    /// After the UNet step, the same step with the per-row attention holding one query row a
    /// lane (the default: two from 4096 queries) and with f16's SIMT convolution in 8 × 8
    /// blocks (16 deep with or without prefetch, 32 deep) or 4 × 4 blocks 16 deep without
    /// prefetch (where they run: no cooperative matrices, or f32 beside f16-only ones),
    /// interleaved over five rounds in the same process.
    #[arg(long)]
    pub(super) simt_ab: bool,
    /// After the UNet step, the same step with the linears on each of these choices (as
    /// `--simt-linears` names them; default burn,4x4,8x8,4x4v,8x8v): burn's matmul or the SIMT
    /// product (where the product's rules reach: f32 on a card, f16 without cooperative
    /// matrices), interleaved over five rounds in the same process.
    #[arg(long, num_args = 0..=1, value_delimiter = ',', default_missing_value = super::simt::PRODUCT_AB_DEFAULT)]
    pub(super) product_ab: Option<Vec<String>>,
    /// The linears on a card for the whole run: `burn` (burn's matmul), `4x4` or `8x8` (the SIMT
    /// product, 8 × 8 where the tiles fit; `4x4v`, `8x8v` with vector staging, `4x4vp`, `8x8vp`
    /// with the next step prefetched too); default: the engine's rules.
    #[arg(long)]
    pub(super) simt_linears: Option<String>,
    /// f16's SIMT convolution for the whole run: `4x4` (the default), `8x8` (8 × 8 lane blocks
    /// where 128 channels divide the layer), each with `-16` for 16 reduction indices a step
    /// and the next prefetched (f32's staging) instead of 32, or `-16n` for 16 without it.
    #[arg(long)]
    pub(super) simt_conv: Option<String>,
    /// After the UNet step: every kernel of this many launch-by-launch steps timed on the device
    /// (timestamp queries, no wait between kernels), summed by kernel and by class.
    #[arg(long)]
    pub(super) kernel_profile: Option<usize>,
    /// Only our cooperative-matrix GEMM against burn: every SD 1.5 UNet linear shape (each tile)
    /// and every 3×3 convolution shape (input unrolled).
    #[arg(long)]
    pub(super) gemm_only: bool,
    /// Only the cooperative matrices' ceiling: products alone, with the GEMM's fragment loads
    /// from workgroup memory, and with its barriers, per plane arrangement (no global memory).
    #[arg(long)]
    pub(super) mma_ceiling: bool,
    /// Only the workgroup-scope GEMM (NVIDIA's `VK_NV_cooperative_matrix2`): the device's
    /// configurations, then each tile on a 4096³ product and SDXL's linears, checked against
    /// our plane-scope GEMM and timed beside it.
    #[arg(long)]
    pub(super) workgroup_gemm: bool,
    /// Only the planes attention kernel's parts: SD 1.5's and SDXL's long shapes with the
    /// output's rescaling, the softmax, the global loads and the staging left out in turn, with
    /// one and two fragments of query rows a plane.
    #[arg(long)]
    pub(super) attention_ceiling: bool,
    /// Route the linears and every convolution through our cooperative-matrix GEMM for the whole
    /// run (where it runs).
    #[arg(long)]
    pub(super) gemm_all: bool,
    /// After the UNet step, the same step with the linears on burn's matmul or our
    /// cooperative-matrix GEMM under each of its compilations, interleaved over three rounds in
    /// the same process.
    #[arg(long)]
    pub(super) gemm_ab: bool,
    /// After the UNet step (SD 1.5's, or SDXL's with `--sdxl`), the same step with GroupNorm's
    /// small channels-last maps in one launch or three and the skip connections joined by our
    /// kernel or burn's `cat`, replayed, interleaved over three rounds.
    #[arg(long)]
    pub(super) norm_ab: bool,
    /// The UNet step with the prompt's keys and values projected once for the generation
    /// (default) or by each cross-attention layer at every step, replayed, interleaved over
    /// three rounds.
    #[arg(long)]
    pub(super) context_ab: bool,
    /// The UNet step with the channels-last convolutions on 128 × 128 tiles split by the fill
    /// rule (default) or tiled and split by the GEMM's waves model, replayed, interleaved over
    /// three rounds.
    #[arg(long)]
    pub(super) conv_tiles_ab: bool,
    /// With `--kernel-profile`: profile again with the linears on the other product (burn's
    /// matmul or our GEMM), then once more as at first.
    #[arg(long)]
    pub(super) profile_linears: bool,
    /// Run the linears on burn's matmul for the whole run instead of our cooperative-matrix GEMM
    /// (where that runs).
    #[arg(long)]
    pub(super) burn_linears: bool,
    /// Our GEMM's reduction step for the whole run (32 or 64).
    #[arg(long)]
    pub(super) gemm_bk: Option<usize>,
    /// Keep cubecl's bounds checks in our GEMM for the whole run.
    #[arg(long)]
    pub(super) gemm_checked: bool,
    /// Our GEMM's planes over a tile for the whole run: `2x4` or `2x2`.
    #[arg(long)]
    pub(super) gemm_planes: Option<String>,
    /// Our GEMM's staging copies for the whole run (1, or 2 where they fit).
    #[arg(long)]
    pub(super) gemm_stages: Option<usize>,
    /// Our GEMM's sub-steps fenced for the whole run (`GemmKnobs::fence`: `on` or `off`).
    #[arg(long)]
    pub(super) gemm_fence: Option<String>,
    /// Our GEMM's tiles and splits by the waves model for the whole run (`GemmKnobs::waves`:
    /// `on` or `off`).
    #[arg(long)]
    pub(super) gemm_waves: Option<String>,
    /// Our GEMM's split tails of rows for the whole run (`GemmKnobs::tails`: `on` or `off`).
    #[arg(long)]
    pub(super) gemm_tails: Option<String>,
    /// The largest GroupNorm slab (elements of one image's group) normalised in one launch, for
    /// the whole run (`group_norm::slab_max`; 0: three launches everywhere).
    #[arg(long)]
    pub(super) slab_max: Option<usize>,
    /// Only the VAE decode (plain and compiled) and the GroupNorm kernels.
    #[arg(long)]
    pub(super) vae_only: bool,
    /// After the UNet step: a LoRA of this rank on every layer, merged (its cost once, the step
    /// with it) against the same products applied beside each layer every step.
    #[arg(long)]
    pub(super) lora_rank: Option<usize>,
    /// Instead of SD 1.5: full-size SDXL with random weights in f16, its UNet step at 128²
    /// latents and (unless `--no-pipeline`) a 1024² txt2img of `--steps`, with the pool's
    /// reserved bytes and each phase's wall-clock time.
    #[arg(long)]
    pub(super) sdxl: bool,
    /// With `--sdxl`: also a full-size refiner (random weights), parked as `--text-encoders`
    /// parks the base's encoders: its UNet step (not with `--pipeline-only`), and the 1024²
    /// txt2img again with it taking over at 0.8 (A1111's default switch).
    #[arg(long)]
    pub(super) refiner: bool,
    /// With `--sdxl --refiner --pipeline-only`: this many turns of the two UNets on the device
    /// timed leg by leg, after the base's runs.
    #[arg(long, default_value_t = 0)]
    pub(super) swaps: usize,
    /// With `--sdxl`: where the text encoders wait between prompts (auto parks SDXL's in host
    /// memory). The pool keeps pages, so compare two processes.
    #[arg(long, default_value_t = latent_engine::TextEncoders::Auto)]
    pub(super) text_encoders: latent_engine::TextEncoders,
    /// With `--sdxl`: the image's side in pixels (SDXL's native 1024 by default; smaller for a
    /// slow adapter's memory measurement).
    #[arg(long, default_value_t = 1024)]
    pub(super) sdxl_size: usize,
    /// With `--sdxl`: only the VAE decode of one image, `tiled` (64-latent tiles) or `whole`,
    /// after the weights (no UNet step): its own memory, in a process of its own.
    #[arg(long, value_parser = ["tiled", "whole"])]
    pub(super) sdxl_decode: Option<String>,
    /// Disk cache folder for `--cache-model` (emptied first).
    #[arg(long)]
    pub(super) cache_dir: Option<std::path::PathBuf>,
    /// Where cubecl writes its autotune decisions (JSON lines; default: a temporary file).
    #[arg(long)]
    pub(super) decisions: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// Sets the engine's kernel knobs and rules these arguments name, process-wide, and prints
    /// the ones in force.
    pub(super) fn apply_kernel_rules(&self) -> anyhow::Result<()> {
        use latent_engine::kernels::matmul;
        let mut knobs = matmul::gemm_knobs();
        if let Some(bk) = self.gemm_bk {
            anyhow::ensure!(
                matmul::GEMM_STEPS.contains(&bk),
                "--gemm-bk {bk}: one of {:?}",
                matmul::GEMM_STEPS
            );
            knobs.bk = Some(bk);
        }
        knobs.unchecked &= !self.gemm_checked;
        if let Some(planes) = &self.gemm_planes {
            knobs.planes = matmul::GEMM_PLANES
                .into_iter()
                .find(|p| format!("{}x{}", p[0], p[1]) == *planes)
                .ok_or_else(|| anyhow::anyhow!("--gemm-planes {planes}: 2x4 or 2x2"))?;
        }
        if let Some(stages) = self.gemm_stages {
            anyhow::ensure!((1..=2).contains(&stages), "--gemm-stages {stages}: 1 or 2");
            knobs.stages = stages;
        }
        if let Some(fence) = &self.gemm_fence {
            knobs.fence = match fence.as_str() {
                "on" => true,
                "off" => false,
                other => anyhow::bail!("--gemm-fence {other}: on or off"),
            };
        }
        if let Some(waves) = &self.gemm_waves {
            knobs.waves = match waves.as_str() {
                "on" => true,
                "off" => false,
                other => anyhow::bail!("--gemm-waves {other}: on or off"),
            };
        }
        if let Some(tails) = &self.gemm_tails {
            knobs.tails = match tails.as_str() {
                "on" => true,
                "off" => false,
                other => anyhow::bail!("--gemm-tails {other}: on or off"),
            };
        }
        matmul::set_gemm_knobs(knobs);
        if let Some(max) = self.slab_max {
            latent_engine::kernels::group_norm::set_slab_max(max);
        }
        println!(
            "GroupNorm in one launch up to {} elements a slab",
            latent_engine::kernels::group_norm::slab_max()
        );
        matmul::set_mma_linears(!self.burn_linears);
        if let Some(choice) = &self.simt_linears {
            let rules = super::simt::simt_linears(choice).ok_or_else(|| {
                anyhow::anyhow!(
                    "--simt-linears {choice}: one of burn, 4x4, 8x8, 4x4v, 8x8v, 4x4vp, 8x8vp"
                )
            })?;
            matmul::set_product_rules(rules);
        }
        if let Some(choice) = &self.simt_conv {
            let rules = super::simt::simt_conv(choice).ok_or_else(|| {
                anyhow::anyhow!(
                    "--simt-conv {choice}: one of 4x4, 4x4-16, 4x4-16n, 8x8, 8x8-16, 8x8-16n"
                )
            })?;
            latent_engine::kernels::conv::set_conv_rules(rules);
        }
        println!("SIMT product rules: {:?}", matmul::product_rules());
        println!(
            "our GEMM: {knobs:?}, linears on it where it runs: {}",
            matmul::mma_linears()
        );
        if let Some(tiles) = self.channels_last_min_tiles {
            use latent_engine::kernels::conv::{ConvRules, conv_rules, set_conv_rules};
            set_conv_rules(ConvRules {
                channels_last_min_tiles: tiles,
                ..conv_rules()
            });
        }
        if self.gemm_all {
            use latent_engine::kernels::conv::{ConvRules, conv_rules, set_conv_rules};
            latent_engine::kernels::matmul::set_mma_linears(true);
            set_conv_rules(ConvRules {
                split_max_tiles: 0,
                gemm_max_tiles: usize::MAX,
                gemm_min_out: 0,
                gemm_one_by_one: true,
                implicit_min_tiles: 0,
                simt_wide: true,
                simt_one_by_one_f32: true,
                ..conv_rules()
            });
        }
        println!(
            "convolution rules: {:?}",
            latent_engine::kernels::conv::conv_rules()
        );
        Ok(())
    }
}
