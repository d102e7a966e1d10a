//! The engine's device: the one opened before the window (shared with it), the one a setting
//! names, its precision and its check.

use super::*;

/// The engine's GPU device, opened before the window so the window renders with the same wgpu
/// device and queue ([`open_for_window`]). The engine uses it while the device setting is the one
/// it was opened for; another setting opens a device of its own.
#[derive(Debug, Clone)]
pub struct SharedDevice {
    /// The device setting it was opened for (may be `auto`).
    pub requested: DeviceChoice,
    pub gpu: latent_engine::device::SharedGpu,
}

impl SharedDevice {
    /// The handles for eframe / egui_kittest (`WgpuSetup::Existing`).
    pub fn wgpu_setup(&self) -> eframe::egui_wgpu::WgpuSetup {
        let s = &self.gpu.setup;
        eframe::egui_wgpu::WgpuSetup::Existing(eframe::egui_wgpu::WgpuSetupExisting {
            instance: s.instance.clone(),
            adapter: s.adapter.clone(),
            device: s.device.clone(),
            queue: s.queue.clone(),
        })
    }
}

/// Opens the device the settings name before the window exists, so that both can share it.
/// `Ok(None)` for the CPU backend. Auto resolves as the engine does (probe verdicts; an adapter
/// seen for the first time is probed in a child process). Creation runs under the watchdog; the
/// first kernels are compiled later, on the engine thread.
pub fn open_for_window(
    config: &EngineConfig,
    note: &mut dyn FnMut(String),
) -> Result<Option<SharedDevice>> {
    if config.device == DeviceChoice::Cpu {
        return Ok(None);
    }
    // The window waits for this: creating a device takes well under a second on a healthy
    // driver, so a stuck one costs at most 20 s before the window opens on its own device.
    let timeout = device_timeout()
        .unwrap_or(config.device_timeout)
        .min(Duration::from_secs(20));
    let choice = crate::probe::select_device(&config.device, true, timeout, &mut |n| match n {
        crate::probe::ResolveNote::Status(s) => tracing::info!("{s}"),
        crate::probe::ResolveNote::Notice(s) => note(s),
    });
    let gpu = latent_engine::device::open_shared(&choice, timeout)
        .with_context(|| format!("opening device {choice}"))?;
    Ok(gpu.map(|gpu| SharedDevice {
        requested: config.device.clone(),
        gpu,
    }))
}

impl Worker {
    pub(super) fn device(&mut self) -> Result<burn::tensor::Device> {
        if let Some(d) = &self.device {
            return Ok(d.clone());
        }
        // The opening and first kernel compilation run under a watchdog on their own thread; this
        // engine thread waits, the UI does not.
        let timeout = device_timeout().unwrap_or(self.config.device_timeout);
        if let Some(shared) = self
            .shared
            .as_ref()
            .filter(|s| s.requested == self.config.device)
        {
            let (device, label) = (shared.gpu.device.clone(), shared.gpu.label.clone());
            self.emit(Event::Status(format!(
                "{label} (shared with the window): compiling kernels…"
            )));
            latent_engine::device::warm_up_watched(&device, &label, timeout)
                .with_context(|| format!("opening device {label}"))?;
            self.device = Some(device.clone());
            self.emit(Event::DeviceReady {
                label,
                shared: true,
            });
            return Ok(device);
        }
        // Probing is on by default here: a driver crash on first use must cost a child process,
        // not the artist's window.
        let requested = self.config.device.clone();
        self.emit(Event::Status(format!(
            "opening device {requested} and compiling kernels…"
        )));
        let (choice, device) =
            crate::probe::open_device(&requested, true, timeout, &mut |note| match note {
                crate::probe::ResolveNote::Status(s) => self.emit(Event::Status(s)),
                crate::probe::ResolveNote::Notice(s) => self.emit(Event::Notice(s)),
            })
            .with_context(|| format!("opening device {requested}"))?;
        self.device = Some(device.clone());
        self.emit(Event::DeviceReady {
            label: choice.to_string(),
            shared: false,
        });
        Ok(device)
    }

    pub(super) fn precision(&self, device: &burn::tensor::Device) -> Precision {
        self.config
            .precision
            .unwrap_or_else(|| latent_engine::device::preferred_precision(device))
    }

    /// The built-in demo model on the engine's device and on the CPU backend, compared per
    /// component: a device whose numbers disagree is flagged, not trusted.
    pub(super) fn verify_device(&mut self) -> Result<()> {
        let device = self.device()?;
        let precision = self.precision(&device);
        self.emit(Event::Status(
            "verifying the device against the CPU backend…".into(),
        ));
        let path = crate::demo::demo_model_path().context("unpacking the demo model")?;
        let report = latent_engine::selfcheck::self_check(&path, &device, precision)
            .context("running the device check")?;
        let mut lines: Vec<String> = report.components.iter().map(|c| c.to_string()).collect();
        let passed = report.passed();
        lines.push(if passed {
            "all components agree with the CPU backend".into()
        } else {
            "this device disagrees with the CPU backend: try another adapter or the CPU".into()
        });
        self.emit(Event::Status(if passed {
            "device verified".into()
        } else {
            "device check failed".into()
        }));
        self.emit(Event::DeviceCheck { passed, lines });
        Ok(())
    }
}
