//! Probing adapters in a child process (`latent-studio probe --adapter N`), and `--device auto`
//! resolution that skips adapters whose remembered probe crashed, hung or failed.
//!
//! Probing is on by default in the studio (an artist's first run on a new driver is where a crash
//! would lose the window) and off by default in `generate` (scripts and tests should not pay a
//! child process that JIT-compiles kernels; `--probe on` turns it on). Remembered verdicts are
//! honoured either way: reading them costs one small file. `LATENT_STUDIO_NO_PROBE=1` turns
//! probing off everywhere.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use latent_engine::adapters::AdapterSummary;
use latent_engine::device::DeviceChoice;
use latent_engine::probe::{Outcome, ProbeReport, Verdict, VerdictCache};

/// Set (to anything but `0`) to never spawn probes.
pub const NO_PROBE_ENV: &str = "LATENT_STUDIO_NO_PROBE";

/// `probes.json` beside the settings (`LATENT_STUDIO_CONFIG` overrides the folder): verdicts are
/// about this machine's drivers, not disposable cache.
pub fn verdict_path() -> PathBuf {
    crate::paths::settings_file().with_file_name("probes.json")
}

/// The `latent-studio` binary to re-invoke, when this process is one. Test harnesses that embed
/// the studio are other binaries: re-running them with `probe` would run their tests instead.
pub fn probe_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let stem = exe.file_stem()?.to_string_lossy().into_owned();
    (stem == "latent-studio").then_some(exe)
}

/// Whether probes may be spawned, given the caller's default.
pub fn probing_enabled(default_on: bool) -> bool {
    match std::env::var_os(NO_PROBE_ENV) {
        Some(v) if v != "0" => false,
        _ => default_on,
    }
}

/// Runs `exe probe --adapter N` and judges it: a JSON line with `ok` is a usable adapter, one
/// without is a failure, no line (a signal, an abort) a crash, and no exit within `timeout` a
/// hang (the child is killed).
pub fn probe_adapter(exe: &Path, adapter: &AdapterSummary, timeout: Duration) -> Verdict {
    let started = Instant::now();
    let verdict = |outcome, detail: String, f16| Verdict {
        outcome,
        detail,
        secs: started.elapsed().as_secs_f64(),
        f16,
    };
    let child = Command::new(exe)
        .args(["probe", "--adapter", &adapter.index.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // The child's driver chatter is not ours to show; its verdict comes on stdout.
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return verdict(
                Outcome::Failed,
                format!("cannot start the probe: {e}"),
                false,
            );
        }
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return verdict(
                    Outcome::Hung,
                    format!("no answer within {:.0} s", timeout.as_secs_f64()),
                    false,
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return verdict(Outcome::Failed, format!("probe lost: {e}"), false),
        }
    };
    // The report is one short line, so the pipe never filled while we polled.
    let mut stdout = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    let report = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<ProbeReport>(l).ok());
    match report {
        Some(r) if r.ok && r.adapter == adapter.name => verdict(Outcome::Ok, String::new(), r.f16),
        Some(r) if r.ok => verdict(
            Outcome::Failed,
            format!("the probe opened {} instead", r.adapter),
            false,
        ),
        Some(r) => verdict(
            Outcome::Failed,
            r.error.unwrap_or_else(|| "failed".into()),
            false,
        ),
        None => verdict(
            Outcome::Crashed,
            format!("probe exited with {status}"),
            false,
        ),
    }
}

/// Progress and notices from [`resolve_auto`], for the CLI's stderr or the studio's events.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolveNote {
    /// Something is taking a while (a probe).
    Status(String),
    /// Something the artist should know (an adapter skipped).
    Notice(String),
}

/// The device `choice` names on this machine: the one rule the CLI and the studio follow. `auto`
/// resolves by remembered probe verdicts, an adapter seen for the first time probed in a child
/// process (within `timeout`) when `probe` is on and this process is the `latent-studio` binary.
pub fn select_device(
    choice: &DeviceChoice,
    probe: bool,
    timeout: Duration,
    note: &mut dyn FnMut(ResolveNote),
) -> DeviceChoice {
    let exe = (probe && probing_enabled(true)).then(probe_exe).flatten();
    resolve_auto(
        choice,
        exe.as_deref().map(|exe| (exe, timeout)),
        &verdict_path(),
        note,
    )
}

/// The one way the command line opens a device: `choice` resolved by [`select_device`], then
/// opened with its first kernels compiled under the engine's watchdog. Returns what it resolved
/// to (never `Auto` unless the usual choice stood) with the device.
pub fn open_device(
    choice: &DeviceChoice,
    probe: bool,
    timeout: Duration,
    note: &mut dyn FnMut(ResolveNote),
) -> latent_engine::error::Result<(DeviceChoice, burn::tensor::Device)> {
    let resolved = select_device(choice, probe, timeout, note);
    let device = latent_engine::device::create_watched(&resolved, timeout)?;
    Ok((resolved, device))
}

/// Prints resolution notes on stderr, as the command line shows them.
pub fn print_note(note: ResolveNote) {
    match note {
        ResolveNote::Status(s) => eprintln!("{s}"),
        ResolveNote::Notice(s) => eprintln!("warning: {s}"),
    }
}

/// The adapter `--device auto` would take now without probing anything new: remembered verdicts
/// skip adapters as [`resolve_auto`] skips them (what `latent-studio devices` marks).
pub fn auto_adapter(all: &[AdapterSummary], verdicts: &Path) -> Option<usize> {
    match resolve_auto(&DeviceChoice::Auto, None, verdicts, &mut |_| {}) {
        DeviceChoice::Gpu(Some(n)) => Some(n),
        DeviceChoice::Auto => latent_engine::adapters::choose_auto(all).map(|a| a.index),
        _ => None,
    }
}

/// `--device auto` with memory: the adapters in preference order, skipping any whose remembered
/// probe was not ok, probing unknown ones first when `probe` is given (the exe and a timeout).
/// Returns `Auto` when the usual choice stands, else the adapter (`gpu:N`) or `Cpu`. Explicit
/// choices are returned as they are: the artist asked for that adapter (the watchdog still
/// guards it). Skipped adapters make exactly one notice line.
pub fn resolve_auto(
    choice: &DeviceChoice,
    probe: Option<(&Path, Duration)>,
    verdicts: &Path,
    note: &mut dyn FnMut(ResolveNote),
) -> DeviceChoice {
    if *choice != DeviceChoice::Auto {
        return choice.clone();
    }
    let all = latent_engine::adapters::enumerate();
    let mut candidates: Vec<&AdapterSummary> = all.iter().collect();
    candidates.sort_by_key(|a| (a.preference_rank(), a.index));
    let (mut cache, damaged) = VerdictCache::load(verdicts);
    if let Some(d) = damaged {
        note(ResolveNote::Notice(d));
    }
    let mut skipped = Vec::new();
    let mut picked = None;
    for a in candidates {
        let verdict = match cache.get(a) {
            Some(v) => Some(v.clone()),
            None => probe.map(|(exe, timeout)| {
                note(ResolveNote::Status(format!(
                    "checking gpu:{} {} in a separate process (first use of this driver)…",
                    a.index, a.name
                )));
                let v = probe_adapter(exe, a, timeout);
                match VerdictCache::remember(verdicts, a, v.clone()) {
                    Ok(c) => cache = c,
                    Err(e) => tracing::warn!("probe verdict not saved: {e}"),
                }
                v
            }),
        };
        match verdict {
            Some(v) if !v.outcome.usable() => {
                skipped.push(format!(
                    "gpu:{} {} ({} when probed: {})",
                    a.index, a.name, v.outcome, v.detail
                ));
            }
            _ => {
                picked = Some(a);
                break;
            }
        }
    }
    let resolved = match picked {
        Some(_) if skipped.is_empty() => return DeviceChoice::Auto,
        Some(a) => (
            DeviceChoice::Gpu(Some(a.index)),
            format!("using gpu:{} {}", a.index, a.name),
        ),
        None => (DeviceChoice::Cpu, "using the CPU backend".to_string()),
    };
    if !skipped.is_empty() {
        note(ResolveNote::Notice(format!(
            "skipping {}; {} (delete {} to probe again)",
            skipped.join(", "),
            resolved.1,
            verdicts.display()
        )));
    }
    resolved.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use latent_engine::adapters::AdapterKind;

    /// A stand-in for the probe child: a shell script that answers like `latent-studio probe`
    /// would (or crashes, or hangs).
    #[cfg(unix)]
    fn fake_child(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[cfg(unix)]
    #[test]
    fn probe_outcomes_from_the_child() {
        let dir = std::env::temp_dir().join(format!("latent-probe-app-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let adapter = AdapterSummary {
            index: 1,
            name: "Intel(R) Arc(tm) A770 Graphics".into(),
            vendor: latent_engine::adapters::VENDOR_INTEL,
            kind: AdapterKind::Discrete,
            backend: "Vulkan".into(),
            driver: "Mesa 24.2".into(),
            max_buffer_size: 1 << 32,
            max_storage_binding: 1 << 31,
            shader_f16: true,
            device_memory: None,
        };
        let timeout = Duration::from_secs(20);
        let ok = fake_child(
            &dir,
            "ok",
            r#"[ "$1 $2 $3" = "probe --adapter 1" ] || exit 3
echo 'driver noise'
echo '{"ok":true,"adapter":"Intel(R) Arc(tm) A770 Graphics","driver":"Mesa 24.2","f16":true,"secs":0.5}'"#,
        );
        let v = probe_adapter(&ok, &adapter, timeout);
        assert_eq!((v.outcome, v.f16), (Outcome::Ok, true), "{v:?}");

        let failed = fake_child(
            &dir,
            "failed",
            r#"echo '{"ok":false,"adapter":"x","driver":"","f16":false,"secs":0.1,"error":"device error: no"}'; exit 1"#,
        );
        let v = probe_adapter(&failed, &adapter, timeout);
        assert_eq!(v.outcome, Outcome::Failed);
        assert_eq!(v.detail, "device error: no");

        let other = fake_child(
            &dir,
            "other",
            r#"echo '{"ok":true,"adapter":"llvmpipe","driver":"","f16":false,"secs":0.1}'"#,
        );
        let v = probe_adapter(&other, &adapter, timeout);
        assert_eq!(v.outcome, Outcome::Failed, "another adapter is no answer");

        let crashed = fake_child(&dir, "crashed", "kill -SEGV $$");
        let v = probe_adapter(&crashed, &adapter, timeout);
        assert_eq!(v.outcome, Outcome::Crashed, "{v:?}");
        assert!(v.detail.contains("signal"), "{}", v.detail);

        let started = Instant::now();
        let hung = fake_child(&dir, "hung", "exec sleep 600");
        let v = probe_adapter(&hung, &adapter, Duration::from_millis(300));
        assert_eq!(v.outcome, Outcome::Hung);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the child was killed"
        );

        let v = probe_adapter(&dir.join("missing"), &adapter, timeout);
        assert_eq!(v.outcome, Outcome::Failed);
    }
}
