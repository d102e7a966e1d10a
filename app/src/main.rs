//! `latent-studio`: the studio's command line (the GUI arrives with the desktop issue).

mod bench;
mod generate;

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
enum Command {
    /// Generate images from a prompt (txt2img).
    Generate(generate::GenerateArgs),
    /// Time full-size SD 1.5 (random weights) on a device.
    Bench(bench::BenchArgs),
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
    let result = match cli.command {
        Some(Command::Generate(args)) => generate::run(args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Inspect { model }) => inspect(&model),
        None => {
            eprintln!("the desktop studio is not built yet; see `latent-studio --help`");
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: what failed and why.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn inspect(path: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let ckpt = latent_engine::checkpoint::Checkpoint::open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    println!("family: {}", ckpt.family.describe());
    println!("layout: {:?}", ckpt.layout);
    println!("unet blocks: {:?}", ckpt.config.unet.block_out_channels);
    Ok(())
}
