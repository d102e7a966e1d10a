//! SDXL's refiner in a run: the base model denoises the high-noise steps, the refiner the rest
//! (diffusers' `denoising_end` / `denoising_start`, A1111's "Refiner switch at"). One sampler
//! walks the whole schedule and only the model changes, so a sampler that carries nothing between
//! steps (Euler, Euler a, whose noise keeps coming from the seed's one stream) gives exactly what
//! diffusers' two pipelines give with one generator; a multistep sampler (DPM++ 2M) keeps its
//! history across the switch, as A1111's does, where diffusers' second pipeline starts afresh.

use burn::tensor::Tensor;

use super::{Txt2ImgRequest, conditioning};
use crate::error::{Error, Result};
use crate::stable_diffusion::{
    AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE, Refiner, StableDiffusion,
};
use crate::tokenizer::ClipTokenizer;
use crate::unet::{Context, UNet2DConditionModel};

use super::SizeConditioning;

/// A request's refiner: when it takes over, and the name the parameters text records.
#[derive(Debug, Clone, PartialEq)]
pub struct RefinerSwitch {
    /// The fraction of the schedule's noise the base model removes (A1111's "Refiner switch at",
    /// diffusers' `denoising_end`): the refiner runs every step whose timestep is below
    /// `round(1000 · (1 − switch_at))`, as both compute it. 1 leaves it nothing.
    pub switch_at: f64,
    /// A1111's `Refiner` value: the refiner's name and short hash, `name [hash]`.
    pub name: String,
}

impl RefinerSwitch {
    /// A1111's default switch.
    pub const DEFAULT_SWITCH_AT: f64 = 0.8;

    /// The first timestep the refiner takes (those below it), on a schedule of
    /// `train_timesteps`.
    fn cutoff(&self, train_timesteps: usize) -> f32 {
        let n = train_timesteps as f64;
        (n - self.switch_at * n).round() as f32
    }

    /// The value's range: more than 0 (the refiner would be the whole run: load it as a model of
    /// its own instead) and at most 1.
    pub fn check(&self) -> Result<()> {
        if !(self.switch_at > 0.0 && self.switch_at <= 1.0) {
            return Err(Error::InvalidInput(format!(
                "the refiner switch must be in (0, 1] (the fraction of the steps the base model \
                 runs), not {}",
                self.switch_at
            )));
        }
        Ok(())
    }
}

/// What the refiner's steps need, prepared once per request.
pub(super) struct Stage<'a> {
    refiner: &'a Refiner,
    /// The refiner's UNet, its added conditioning and the prompt's keys and values projected
    /// for its layers, from its first step of an image on (a parked refiner brings its UNet to
    /// the device then).
    unet: Option<(UNet2DConditionModel, Tensor<2>, Vec<Tensor<3>>)>,
    context: Tensor<3>,
    pooled: Tensor<2>,
    time_ids: Vec<[f32; 5]>,
    cutoff: f32,
}

impl<'a> Stage<'a> {
    /// The refiner's conditioning for `req` (bigG's, with the aesthetic scores), after checking
    /// that it can take over from `model`.
    pub(super) fn prepare(
        model: &StableDiffusion,
        refiner: &'a Refiner,
        switch: &RefinerSwitch,
        tokenizer: &ClipTokenizer,
        req: &Txt2ImgRequest,
        guided: bool,
    ) -> Result<Self> {
        switch.check()?;
        check_pair(model, refiner, req)?;
        let c = conditioning::encode_refiner(refiner, tokenizer, req, guided)?;
        let pooled = c.pooled.ok_or_else(|| {
            Error::InvalidInput("the refiner's text encoder gave no pooled state".into())
        })?;
        let size = req
            .size_conditioning
            .unwrap_or_else(|| SizeConditioning::of_image(req.width, req.height));
        Ok(Self {
            refiner,
            unet: None,
            context: c.context,
            pooled,
            time_ids: time_ids(size, guided),
            cutoff: switch.cutoff(model.config.scheduler.num_train_timesteps),
        })
    }

    /// Whether the refiner takes the step at timestep `t`.
    pub(super) fn takes(&self, t: f32) -> bool {
        t < self.cutoff
    }

    /// Whether the two UNets take turns on the device (a parked refiner): the base model's
    /// leaves it before the refiner's first step of an image, the refiner's after its last.
    pub(super) fn swaps(&self) -> bool {
        self.refiner.parked()
    }

    /// The refiner's prediction for `x` (the guided batch, unconditional first) at `t`.
    pub(super) fn forward(&mut self, x: Tensor<4>, t: f32) -> Result<Tensor<4>> {
        let (unet, added, kv) = match &self.unet {
            Some(ready) => ready,
            None => {
                let unet = self.refiner.unet()?;
                let added = unet.added_conditioning(&self.pooled, &self.time_ids)?;
                let kv = unet.project_context(&self.context);
                self.unet.insert((unet, added, kv))
            }
        };
        let b = x.dims()[0];
        let context = Context::projected(&self.context, kv);
        Ok(unet.forward_context(x, &vec![t; b], context, Some(added)))
    }

    /// After an image's refiner steps: a parked refiner's UNet leaves the device (the decode,
    /// and the next image's base steps, need the room).
    pub(super) fn put_away(&mut self) -> Result<()> {
        self.unet = None;
        // Whether or not this stage holds it (a failed conditioning after the upload does not).
        match self.swaps() {
            true => self.refiner.evict_unet(),
            false => Ok(()),
        }
    }
}

/// diffusers' refiner time ids (`requires_aesthetics_score`): the prompt's original size, crop
/// and aesthetic score; the negative's original size, no crop (its
/// `negative_crops_coords_top_left` default) and the low score. Unconditional row first.
fn time_ids(size: SizeConditioning, guided: bool) -> Vec<[f32; 5]> {
    let [h, w] = size.original.map(|v| v as f32);
    let [top, left] = size.crop_top_left.map(|v| v as f32);
    let cond = [h, w, top, left, AESTHETIC_SCORE];
    match guided {
        true => vec![[h, w, 0.0, 0.0, NEGATIVE_AESTHETIC_SCORE], cond],
        false => vec![cond],
    }
}

/// Whether `refiner` can take over `model`'s run of `req`: an SDXL model (the refiner denoises
/// SDXL's latents), an ordinary UNet (an inpainting one's extra inputs mean nothing to the
/// refiner), no hires fix (its second pass would need its own switch), one device and dtype.
fn check_pair(model: &StableDiffusion, refiner: &Refiner, req: &Txt2ImgRequest) -> Result<()> {
    let refuse = |why: &str| Err(Error::InvalidInput(format!("the SDXL refiner {why}")));
    if model.text_encoder_2.is_none() {
        return refuse("takes over an SDXL model's run; the loaded model is not SDXL");
    }
    if model.config.unet.is_inpainting() {
        return refuse("cannot follow an inpainting model (it takes no mask)");
    }
    if req.hires.is_some() {
        return refuse("and the hires fix cannot be used together yet");
    }
    if model.config.vae.latent_channels != refiner.config.unet.in_channels {
        return refuse("takes another latent width than the loaded model's");
    }
    if refiner.device != model.device || refiner.precision != model.precision {
        return refuse("must be loaded on the model's device in its precision");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{RefinerSwitch, SizeConditioning, time_ids};

    /// diffusers' cutoff: 0.8 of 1000 leaves the refiner the timesteps below 200.
    #[test]
    fn the_switch_is_a_timestep_cutoff() {
        let s = |switch_at: f64| RefinerSwitch {
            switch_at,
            name: String::new(),
        };
        assert_eq!(s(0.8).cutoff(1000), 200.0);
        assert_eq!(s(0.75).cutoff(1000), 250.0);
        assert_eq!(s(1.0).cutoff(1000), 0.0);
        assert!(s(1.0).check().is_ok());
        for bad in [0.0, -0.1, 1.5, f64::NAN] {
            assert!(s(bad).check().is_err(), "{bad}");
        }
    }

    /// The negative row has no crop and the low score, as diffusers' defaults make it.
    #[test]
    fn time_ids_carry_the_aesthetic_scores() {
        let size = SizeConditioning {
            original: [768, 1024],
            crop_top_left: [16, 32],
            target: [512, 512],
        };
        assert_eq!(
            time_ids(size, true),
            vec![
                [768.0, 1024.0, 0.0, 0.0, 2.5],
                [768.0, 1024.0, 16.0, 32.0, 6.0]
            ]
        );
        assert_eq!(
            time_ids(size, false),
            vec![[768.0, 1024.0, 16.0, 32.0, 6.0]]
        );
    }
}

#[cfg(test)]
mod parameters_tests {
    use super::RefinerSwitch;
    use crate::parameters::Parameters;
    use crate::pipeline::Txt2ImgRequest;

    /// A1111's keys, read back to the same switch; a text without the switch gets A1111's
    /// default, a bad one an error.
    #[test]
    fn round_trips_through_the_parameters_text() {
        let refiner = RefinerSwitch {
            switch_at: 0.75,
            name: "sd_xl_refiner_1.0 [7440042bbd]".into(),
        };
        let req = Txt2ImgRequest {
            refiner: Some(refiner.clone()),
            ..Default::default()
        };
        let text = Parameters::for_request(&req, 1, None, None).to_a1111();
        assert!(
            text.contains("Refiner: sd_xl_refiner_1.0 [7440042bbd], Refiner switch at: 0.75"),
            "{text}"
        );
        let read = |t: &str| Parameters::parse_a1111(t).expect("parses").refiner();
        assert_eq!(read(&text).map(Result::ok), Some(Some(refiner)));
        let plain = Parameters::for_request(&Txt2ImgRequest::default(), 1, None, None).to_a1111();
        assert!(read(&plain).is_none());
        let default = read(&text.replace(", Refiner switch at: 0.75", ""));
        assert_eq!(
            default.map(|r| r.ok().map(|r| r.switch_at)),
            Some(Some(RefinerSwitch::DEFAULT_SWITCH_AT))
        );
        for bad in ["1.5", "x"] {
            let t = text.replace("0.75", bad);
            assert!(matches!(read(&t), Some(Err(_))), "{bad}");
        }
    }
}
