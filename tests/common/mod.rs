//! Shared helpers of the integration tests: fixture paths, devices, tolerances, and a tiny
//! safetensors writer for crafting bad files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, DeviceKind, Tensor, TensorData};
use latent_engine::checkpoint::SafetensorsFile;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// A wgpu device of the test's own on lavapipe (the shared one's memory pool also counts the
/// tensors of tests running beside it): for tests that measure device memory.
pub fn private_wgpu() -> Device {
    let lavapipe = latent_engine::adapters::enumerate()
        .into_iter()
        .find(|a| a.kind == latent_engine::adapters::AdapterKind::Software)
        .expect("lavapipe (mesa-vulkan-drivers) for the wgpu tests");
    let whole = latent_engine::limits::DeviceLimits {
        max_buffer_bytes: u64::MAX,
        max_binding_bytes: u64::MAX,
    };
    latent_engine::device::open_limited(&lavapipe, whole).expect("a device of the test's own")
}

/// The two backends every model test runs on. wgpu is lavapipe in CI: it must really run there.
pub fn devices() -> Vec<(&'static str, Device)> {
    vec![
        ("cpu", Device::flex()),
        ("wgpu", Device::wgpu(DeviceKind::DefaultDevice)),
    ]
}

/// Whether `case` runs on `backend`: every case on the CPU; on wgpu (lavapipe in CI, where a
/// seeded run of the tiny model costs seconds of kernels) only `on_wgpu`, a subset chosen to
/// cover every sampler, schedule and size class once. The samplers' arithmetic is the same code
/// on both backends; what the wgpu run checks is the kernels under it.
pub fn runs_on(backend: &str, case: &str, on_wgpu: &[&str]) -> bool {
    backend != "wgpu" || on_wgpu.contains(&case)
}

pub struct Expected(SafetensorsFile);

impl Expected {
    /// tests/fixtures/tiny-sd-expected.safetensors, written by make_model_fixtures.py.
    pub fn load() -> Self {
        Self::open("tiny-sd-expected.safetensors")
    }

    /// Another fixture script's expectations, by file name under tests/fixtures/.
    pub fn open(name: &str) -> Self {
        Self(SafetensorsFile::open(&fixtures().join(name)).expect("expected tensors"))
    }

    /// A uint8 image's bytes.
    pub fn bytes(&self, name: &str) -> Vec<u8> {
        let entry = self
            .0
            .entry(name)
            .unwrap_or_else(|| panic!("no fixture tensor {name}"));
        self.0.bytes(entry).to_vec()
    }

    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.0
            .entry(name)
            .unwrap_or_else(|| panic!("no fixture tensor {name}"))
            .shape
            .clone()
    }

    pub fn values(&self, name: &str) -> Vec<f32> {
        self.0
            .read_f32(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    pub fn tensor<const D: usize>(&self, name: &str, device: &Device, dtype: DType) -> Tensor<D> {
        let shape: [usize; D] = self.shape(name).try_into().expect("rank");
        Tensor::from_data(TensorData::new(self.values(name), shape), (device, dtype))
    }

    pub fn ids(&self, name: &str) -> Vec<Vec<u32>> {
        let entry = self.0.entry(name).expect("ids");
        let n = entry.shape[1];
        let vals: Vec<u32> = self
            .0
            .bytes(entry)
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
            .collect();
        vals.chunks(n).map(<[u32]>::to_vec).collect()
    }
}

pub fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.cast(DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

/// (max absolute error, relative L2 error).
pub fn errors(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "length");
    let mut max_abs = 0f32;
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output");
        max_abs = max_abs.max((g - w).abs());
        num += ((g - w) as f64).powi(2);
        den += (*w as f64).powi(2);
    }
    (max_abs, (num / den.max(1e-30)).sqrt() as f32)
}

/// Each recorded step's latents against a fixture's stack of them (`want`, the steps one after
/// another): the largest difference of each step within `tol` of that step's expected values.
pub fn assert_steps_match(what: &str, got: &[Vec<f32>], want: &[f32], tol: impl Fn(&[f32]) -> f32) {
    assert!(!got.is_empty(), "{what}: no steps");
    let per_step = want.len() / got.len();
    assert_eq!(per_step * got.len(), want.len(), "{what}: steps");
    for (i, (got, want)) in got.iter().zip(want.chunks(per_step)).enumerate() {
        let max = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let allowed = tol(want);
        assert!(
            max <= allowed,
            "{what}: step {i} latents differ by {max:e} (allowed {allowed:e})"
        );
    }
}

/// 1e-4 of the largest expected magnitude (at least 1e-4): the latents' own size, from σ ≈ 15
/// at txt2img's start to ~1 at its end.
pub fn relative_1e4(want: &[f32]) -> f32 {
    1e-4 * want.iter().fold(1f32, |m, v| m.max(v.abs()))
}

/// A fixture's uint8 image `<case>.image` against `got`: the same size, every byte within ±1.
pub fn assert_image_matches(what: &str, expected: &SafetensorsFile, case: &str, got: &[u8]) {
    let entry = expected.entry(&format!("{case}.image")).expect("image");
    let want = expected.bytes(entry);
    assert_eq!(got.len(), want.len(), "{what}: image size");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    assert!(worst <= 1, "{what}: pixels differ by up to {worst}");
}

/// f32: within 1e-4 absolute and relative; f16: within 1e-2 relative.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], dtype: DType) {
    let (abs, rel) = errors(got, want);
    match dtype {
        DType::F32 => assert!(
            abs <= 1e-4 && rel <= 1e-4,
            "{what}: max abs {abs:e}, rel {rel:e}"
        ),
        _ => assert!(rel <= 1e-2, "{what}: rel {rel:e} (max abs {abs:e})"),
    }
    eprintln!("{what}: max abs {abs:.2e}, rel {rel:.2e}");
}

/// Writes a safetensors file from (name, dtype, shape, bytes).
pub fn write_safetensors(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes.len()]}),
        );
        offset += bytes.len();
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out).expect("write test file");
}

pub fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
        .collect()
}

pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-tests-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// One seeded txt2img case of a fixture script's `*_cases.json` (the fields every pipeline
/// fixture shares).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PipelineCase {
    pub name: String,
    pub sampler: String,
    pub schedule: String,
    pub prompt: String,
    pub negative: String,
    pub seed: u64,
    pub steps: usize,
    pub cfg: f32,
    pub width: usize,
    pub height: usize,
}

impl PipelineCase {
    /// The request diffusers ran for this case (no init image, defaults elsewhere).
    pub fn request(&self) -> latent_engine::pipeline::Txt2ImgRequest {
        latent_engine::pipeline::Txt2ImgRequest {
            prompt: self.prompt.clone(),
            negative_prompt: self.negative.clone(),
            seed: self.seed,
            steps: self.steps,
            cfg_scale: self.cfg,
            sampler: self.sampler.parse().expect("sampler"),
            schedule: self.schedule.parse().expect("schedule"),
            width: self.width,
            height: self.height,
            ..Default::default()
        }
    }

    /// The cases of `tests/fixtures/<file>`.
    pub fn load(file: &str) -> Vec<Self> {
        let text = std::fs::read_to_string(fixtures().join(file)).expect("cases file");
        serde_json::from_str(&text).expect("cases")
    }
}

/// A tensor of a safetensors file as the tests write one: dtype name, shape, bytes.
pub type RawTensor = (String, Vec<usize>, Vec<u8>);

/// Copies the tiny single file (and its sidecar) into the scratch folder `name`, each tensor as
/// `edit` returns it (`None` drops it).
pub fn altered_single_file(
    name: &str,
    edit: impl Fn(&str, &str, &[usize], &[u8]) -> Option<RawTensor>,
) -> std::path::PathBuf {
    let src =
        latent_engine::checkpoint::SafetensorsFile::open(&fixtures().join("tiny-sd.safetensors"))
            .unwrap();
    let mut owned: Vec<(String, String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (key, entry) in src.entries() {
        let dtype = format!("{:?}", entry.dtype);
        if let Some((dtype, shape, bytes)) = edit(key, &dtype, &entry.shape, src.bytes(entry)) {
            owned.push((key.clone(), dtype, shape, bytes));
        }
    }
    let dir = scratch_dir(name);
    let path = dir.join("tiny-sd.safetensors");
    std::fs::copy(fixtures().join("tiny-sd.json"), dir.join("tiny-sd.json")).unwrap();
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = owned
        .iter()
        .map(|(k, d, s, b)| (k.as_str(), d.as_str(), s.clone(), b.clone()))
        .collect();
    write_safetensors(&path, &refs);
    path
}

/// A fixture case that starts from a picture (`img2img-init.png`; masked by `img2img-mask.png`
/// where `mask`) at a denoising strength, and the steps that strength runs.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct InitCase {
    #[serde(flatten)]
    pub base: PipelineCase,
    pub strength: f64,
    pub runs: usize,
    pub mask: bool,
}

impl std::ops::Deref for InitCase {
    type Target = PipelineCase;
    fn deref(&self) -> &PipelineCase {
        &self.base
    }
}
