//! `latent-studio`: the desktop studio (no subcommand) and its command line.

mod bench;
mod doctor;
mod generate;

use latent_studio::studio;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "latent-studio",
    version,
    about = "Stable Diffusion studio for Intel and every wgpu GPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
// Parsed once per process.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Generate images from a prompt (txt2img).
    Generate(generate::GenerateArgs),
    /// Time full-size SD 1.5 (random weights) on a device.
    Bench(bench::BenchArgs),
    /// List the GPU adapters and which one `--device auto` picks.
    Devices,
    /// Open the studio, generate with the built-in demo model and save a screenshot of the window
    /// (how docs/screenshot.png is made, under Xvfb).
    #[command(hide = true)]
    Screenshot {
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long, default_value = "a lighthouse on a cliff at dusk, oil painting")]
        prompt: String,
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
    },
    /// Check that a device computes what the CPU does (demo model: text encoder, UNet, VAE).
    Doctor(doctor::DoctorArgs),
    /// Probe one adapter in this process and print one JSON line (the studio runs it as a child,
    /// so a driver crash or hang costs the child).
    #[command(hide = true)]
    Probe {
        /// The adapter's number in `latent-studio devices`.
        #[arg(long)]
        adapter: usize,
    },
    /// Open a checkpoint and report what it holds.
    Inspect {
        /// A `.safetensors` file (LDM layout) or a diffusers folder.
        #[arg(long)]
        model: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Scripts want one line: clap's first line names the bad flag and value.
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("invalid arguments"));
            return ExitCode::from(2);
        }
    };
    // Commands that generate keep their kernel tuning across launches (the others tune nothing
    // worth keeping, and a probe must not touch the artist's files). `bench` only when asked
    // (LATENT_STUDIO_TUNING_CACHE): its kernel report names kernels by the tuning it watches.
    let keeps_tuning = match &cli.command {
        None | Some(Command::Generate(_) | Command::Screenshot { .. }) => true,
        Some(Command::Bench(_)) => std::env::var_os("LATENT_STUDIO_TUNING_CACHE").is_some(),
        _ => false,
    };
    if keeps_tuning {
        latent_engine::device::tuning::set_folder(latent_studio::paths::tuning_cache());
    }
    let result = match cli.command {
        Some(Command::Generate(args)) => generate::run(args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Inspect { model }) => inspect(&model),
        Some(Command::Devices) => devices(),
        Some(Command::Screenshot {
            out,
            prompt,
            timeout_secs,
        }) => studio::screenshot(out, prompt, timeout_secs),
        Some(Command::Doctor(args)) => doctor::run(args),
        Some(Command::Probe { adapter }) => probe(adapter),
        None => studio::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: what failed and why, and the command-line way out where there is one
            // (the engine's own wording suits the studio too).
            eprintln!("error: {e:#}{}", cli_hint(&e));
            ExitCode::FAILURE
        }
    }
}

fn devices() -> anyhow::Result<()> {
    let all = latent_engine::adapters::enumerate();
    if all.is_empty() {
        println!("no GPU adapter found; `--device auto` uses the CPU backend");
        return Ok(());
    }
    let path = latent_studio::probe::verdict_path();
    let (verdicts, damaged) = latent_engine::probe::VerdictCache::load(&path);
    if let Some(d) = damaged {
        eprintln!("warning: {d}");
    }
    // `--device auto` skips adapters whose remembered probe was not ok; so does the mark.
    let auto = latent_studio::probe::auto_adapter(&all, &path);
    for a in &all {
        let mark = if Some(a.index) == auto { "*" } else { " " };
        let probed = match verdicts.get(a) {
            Some(v) => format!(" | probe: {v}"),
            None => String::new(),
        };
        println!("{mark} {a}{probed}");
        let compiler = latent_engine::compiler::for_adapter(a);
        let shapes = latent_engine::compiler::cooperative_matrices(a);
        let cmma = match (compiler, shapes.is_empty()) {
            (_, true) => "no cooperative matrices (SIMT kernels)".to_string(),
            (latent_engine::compiler::ShaderCompiler::SpirV, false) => {
                format!("cooperative matrices used: {}", shapes.join(", "))
            }
            (latent_engine::compiler::ShaderCompiler::Wgsl, false) => format!(
                "cooperative matrices not used under WGSL (driver has {})",
                shapes.join(", ")
            ),
        };
        println!("      shader compiler {compiler}, {cmma}");
    }
    println!(
        "shader compiler: SPIR-V on hardware Vulkan adapters, WGSL elsewhere ({}=wgsl forces WGSL)",
        latent_engine::compiler::COMPILER_ENV
    );
    println!(
        "* = the automatic choice (Intel discrete, other discrete, Intel integrated, other integrated, software; adapters whose probe failed are skipped)"
    );
    Ok(())
}

/// The probe child: one JSON line on stdout, exit status 0 only when the adapter computed.
fn probe(adapter: usize) -> anyhow::Result<()> {
    if latent_studio::test_seam::probe_crashes() {
        // What a driver segfault looks like to the parent: no report, a signal.
        std::process::abort();
    }
    if latent_studio::test_seam::probe_hangs() {
        loop {
            std::thread::park();
        }
    }
    let report = latent_engine::probe::probe_here(adapter);
    println!("{}", serde_json::to_string(&report)?);
    match report.error {
        Some(e) => anyhow::bail!("probe of gpu:{adapter} failed: {e}"),
        None => Ok(()),
    }
}

fn inspect(path: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let ckpt = latent_engine::checkpoint::Checkpoint::open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    println!("family: {}", ckpt.family.describe());
    println!(
        "unet input channels: {}{}",
        ckpt.config.unet.in_channels,
        if ckpt.config.unet.is_inpainting() {
            " (inpainting)"
        } else {
            ""
        }
    );
    println!("layout: {:?}", ckpt.layout);
    println!("prediction: {}", ckpt.config.scheduler.prediction);
    println!("native size: {0}x{0}", ckpt.config.native_size());
    println!("unet blocks: {:?}", ckpt.config.unet.block_out_channels);
    Ok(())
}

/// The flags that act on an engine error, for the one-line message on the command line.
fn cli_hint(e: &anyhow::Error) -> &'static str {
    match e
        .chain()
        .find_map(|c| c.downcast_ref::<latent_engine::error::Error>())
    {
        Some(
            latent_engine::error::Error::DeviceTimeout { .. }
            | latent_engine::error::Error::DevicePanicked { .. },
        ) => " (see `latent-studio devices`; --device gpu:N or --device cpu)",
        Some(latent_engine::error::Error::OutputExists { .. }) => {
            " (pass --overwrite to replace it)"
        }
        Some(latent_engine::error::Error::TensorTooLarge { .. }) => {
            " (--precision f16 or --device cpu)"
        }
        _ => "",
    }
}
