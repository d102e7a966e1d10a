//! `latent-studio doctor`: runs the built-in demo model's text encoder, one UNet step and VAE
//! decode on the chosen device and on the CPU backend, and says whether the device computes the
//! same numbers. A GPU driver that gets them wrong is caught here, not in an artist's image.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use latent_engine::Precision;
use latent_engine::device::DeviceChoice;
use latent_engine::selfcheck::self_check;

use latent_studio::demo;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// auto, cpu, gpu, gpu:N or part of an adapter name (`arc`, `lavapipe`).
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// f32 (tolerance: relative error 1e-3) or f16 (2e-2).
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Check with this model instead of the built-in demo (a small one: it runs at 64x64).
    #[arg(long)]
    model: Option<PathBuf>,
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let model = match args.model {
        Some(m) => m,
        None => demo::demo_model_path().context("unpacking the demo model")?,
    };
    let (_, device) = latent_studio::probe::open_device(
        &args.device,
        false,
        latent_engine::device::DEFAULT_TIMEOUT,
        &mut latent_studio::probe::print_note,
    )
    .context("opening the device")?;
    println!(
        "checking --device {} ({}, {:?}) against the CPU backend (f32)",
        args.device,
        describe(&args.device, &device),
        args.precision
    );
    match latent_engine::compiler::of_device(&device) {
        Some(c) => println!("shader compiler: {c}"),
        None => println!("shader compiler: none (burn's CPU backend)"),
    }
    let report = self_check(&model, &device, args.precision)
        .with_context(|| format!("running the self-check with {}", model.display()))?;
    for c in &report.components {
        println!("{c}");
    }
    let failed: Vec<String> = report
        .failures()
        .map(|c| format!("{} (rel error {:.2e})", c.component, c.rel))
        .collect();
    if !failed.is_empty() {
        bail!(
            "--device {} disagrees with the CPU backend on {}: its results cannot be trusted; \
             try another adapter (`latent-studio devices`) or --device cpu",
            args.device,
            failed.join(", ")
        );
    }
    println!("all components agree");
    Ok(())
}

/// The adapter a choice resolved to, by name, as `latent-studio devices` lists it.
fn describe(choice: &DeviceChoice, device: &burn::tensor::Device) -> String {
    use latent_engine::device::{Target, resolve};
    if latent_engine::device::is_cpu(device) {
        return "burn's CPU backend".into();
    }
    match resolve(choice, &latent_engine::adapters::enumerate()) {
        Ok(Target::Adapter(a)) => a.name,
        _ => format!("{device:?}"),
    }
}
