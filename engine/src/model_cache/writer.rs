//! Writing a cache entry while a model loads from its checkpoint, and loading through the cache.

use super::disk::{dtype_tag, io, temp_name};
use super::*;

/// Streams the tensors of one load into a new cache entry.
struct EntryWriter {
    data_path: PathBuf,
    data: Option<BufWriter<File>>,
    tensors: BTreeMap<String, (String, Vec<usize>, u64, u64)>,
    offset: u64,
    error: Option<String>,
}

impl EntryWriter {
    fn new(cache: &DiskCache, stem: &str) -> Result<Self> {
        cache.ensure_dir()?;
        let data_path = temp_name(&cache.dir.join(format!("{stem}.data")));
        let file = File::create(&data_path).map_err(io("cache file", &data_path))?;
        Ok(Self {
            data_path,
            data: Some(BufWriter::new(file)),
            tensors: BTreeMap::new(),
            offset: 0,
            error: None,
        })
    }

    fn push(&mut self, name: &str, shape: &[usize], dtype: DType, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        let Some(data) = self.data.as_mut() else {
            return;
        };
        if let Err(e) = data.write_all(bytes) {
            self.error = Some(e.to_string());
            return;
        }
        let start = self.offset;
        self.offset += bytes.len() as u64;
        self.tensors.insert(
            name.to_string(),
            (
                dtype_tag(dtype).to_string(),
                shape.to_vec(),
                start,
                self.offset,
            ),
        );
    }

    /// Assembles `<stem>.safetensors` (header, then the data), then its sidecar.
    fn finish(mut self, cache: &DiskCache, stem: &str, mut meta: EntryMeta) -> Result<u64> {
        let (final_path, meta_path) = cache.paths(stem);
        let result = (|| -> std::result::Result<u64, String> {
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            let data = self.data.take().ok_or("no data")?;
            data.into_inner()
                .map_err(|e| e.to_string())?
                .sync_all()
                .map_err(|e| e.to_string())?;
            let mut header = serde_json::Map::new();
            header.insert(
                "__metadata__".into(),
                serde_json::json!({ "format": FORMAT_TAG }),
            );
            for (name, (dtype, shape, start, end)) in &self.tensors {
                header.insert(
                    name.clone(),
                    serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [start, end] }),
                );
            }
            let mut header = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
            while header.len() % 8 != 0 {
                header.push(b' ');
            }
            let total = 8 + header.len() as u64 + self.offset;
            if total > cache.limit {
                return Err(format!(
                    "the entry ({total} bytes) is larger than the cache limit ({} bytes)",
                    cache.limit
                ));
            }
            let tmp = temp_name(&final_path);
            let written = (|| -> std::io::Result<u32> {
                let mut out = BufWriter::new(File::create(&tmp)?);
                let mut crc = crc32fast::Hasher::new();
                let len = (header.len() as u64).to_le_bytes();
                for part in [&len[..], &header[..]] {
                    crc.update(part);
                    out.write_all(part)?;
                }
                let mut src = File::open(&self.data_path)?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = src.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    crc.update(&buf[..n]);
                    out.write_all(&buf[..n])?;
                }
                let file = out.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                fs::rename(&tmp, &final_path)?;
                Ok(crc.finalize())
            })();
            let crc = written.map_err(|e| {
                let _ = fs::remove_file(&tmp);
                e.to_string()
            })?;
            meta.bytes = total;
            meta.crc32 = crc;
            let json = serde_json::to_vec_pretty(&meta).map_err(|e| e.to_string())?;
            crate::image_io::save_atomic(&meta_path, &json, true).map_err(|e| e.to_string())?;
            Ok(total)
        })();
        let _ = fs::remove_file(&self.data_path);
        match result {
            Ok(total) => {
                cache.enforce_limit(stem);
                Ok(total)
            }
            Err(reason) => {
                cache.discard(stem);
                Err(Error::write(
                    "disk cache entry",
                    final_path,
                    std::io::Error::other(reason),
                ))
            }
        }
    }
}

impl Drop for EntryWriter {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.data_path);
    }
}

/// Loads a model through the disk cache: its verified entry when there is one, otherwise the
/// checkpoint, writing a new entry on the way. A cache problem is logged and never fails a load
/// the checkpoint alone would have served.
pub fn load_through_disk(
    cache: &DiskCache,
    checkpoint: &Checkpoint,
    device: &Device,
    options: LoadOptions,
) -> Result<(StableDiffusion, LoadSource)> {
    let dtype = options.precision.dtype();
    let source = match cache.checkpoint_hash(checkpoint) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("disk cache skipped: {e}");
            return Ok((
                StableDiffusion::load(checkpoint, device, options)?,
                LoadSource::Checkpoint,
            ));
        }
    };
    let stem = DiskCache::stem(&source, dtype, options.vae_encoder);
    let expect = EntryMeta {
        format: FORMAT_TAG.into(),
        version: CACHE_FORMAT,
        source,
        dtype: dtype_tag(dtype).into(),
        encoder: options.vae_encoder,
        bytes: 0,
        crc32: 0,
    };
    if let Some(file) = cache.lookup(&stem, &expect) {
        let t = Instant::now();
        // Parked text encoders are built in host memory ([`crate::TextEncoders`]).
        let te_device = options.text_encoders.device_for(&checkpoint.config, device);
        let weights = CACHE_PREFIXES.map(|prefix| {
            let map: KeyMap = Arc::new(move |n: &str| format!("{prefix}{n}"));
            let on = if prefix == CACHE_PREFIXES[0] {
                &te_device
            } else {
                device
            };
            Weights::from_file("cached weights", file.clone(), map, on, dtype)
        });
        let second = checkpoint.config.text_encoder_2.as_ref().map(|_| {
            let map: KeyMap = Arc::new(|n: &str| format!("{CACHE_PREFIX_TE2}{n}"));
            let w = Weights::from_file("cached weights", file.clone(), map, &te_device, dtype);
            (w, CACHE_PREFIX_TE2)
        });
        match StableDiffusion::from_weights(
            weights,
            CACHE_PREFIXES,
            second,
            &checkpoint.config,
            device,
            options,
        ) {
            Ok(model) => {
                tracing::info!(entry = %stem, secs = t.elapsed().as_secs_f64(), "loaded from the disk cache");
                return Ok((model, LoadSource::DiskCache));
            }
            Err(e) => {
                tracing::warn!("disk cache entry {stem} unusable ({e}); rebuilding");
                cache.discard(&stem);
            }
        }
    }
    let writer = match EntryWriter::new(cache, &stem) {
        Ok(w) => Some(Rc::new(RefCell::new(w))),
        Err(e) => {
            tracing::warn!("disk cache not written: {e}");
            None
        }
    };
    let model = match &writer {
        Some(w) => {
            let w = w.clone();
            let recorder: Recorder = Rc::new(RefCell::new(
                move |name: &str, shape: &[usize], dtype: DType, bytes: &[u8]| {
                    w.borrow_mut().push(name, shape, dtype, bytes)
                },
            ));
            StableDiffusion::load_recorded(checkpoint, device, options, recorder)?
        }
        None => StableDiffusion::load(checkpoint, device, options)?,
    };
    if let Some(w) = writer.and_then(|w| Rc::try_unwrap(w).ok()) {
        match w.into_inner().finish(cache, &stem, expect) {
            Ok(bytes) => tracing::info!(entry = %stem, bytes, "disk cache entry written"),
            Err(e) => tracing::warn!("disk cache entry not kept: {e}"),
        }
    }
    Ok((model, LoadSource::Checkpoint))
}
