//! The small subcommands: the adapter list, the probe child, a checkpoint's summary.

pub(super) fn devices() -> anyhow::Result<()> {
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
pub(super) fn probe(adapter: usize) -> anyhow::Result<()> {
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

pub(super) fn inspect(path: &std::path::Path) -> anyhow::Result<()> {
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
