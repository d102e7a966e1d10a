//! The command line: its subcommands (`generate`, `bench`, `doctor`, `devices`, `inspect`, and
//! the hidden `probe` and `screenshot`) and their dispatch; no subcommand opens the studio.

pub mod bench;
pub mod doctor;
pub mod generate;
mod tools;

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

/// Parses the command line and runs what it asks for.
pub fn main() -> ExitCode {
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
        Some(Command::Inspect { model }) => tools::inspect(&model),
        Some(Command::Devices) => tools::devices(),
        Some(Command::Screenshot {
            out,
            prompt,
            timeout_secs,
        }) => studio::screenshot(out, prompt, timeout_secs),
        Some(Command::Doctor(args)) => doctor::run(args),
        Some(Command::Probe { adapter }) => tools::probe(adapter),
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
