//! A device-to-device copy into an existing buffer, launched straight on the stream. A captured
//! graph reads its inputs from the buffers it was recorded with, so fresh inputs are written into
//! those buffers (and its output copied out of its buffer) in stream order around each replay;
//! burn has no op that writes into a given buffer.

use burn::backend::wgpu::CubeTensor;
use burn::cubecl;
use burn::cubecl::prelude::*;

use super::{Element, buffer_arg, grid};

const LANES: usize = 256;

#[cube(launch)]
fn copy_values<F: Float>(src: &[F], dst: &mut [F], len: usize) {
    let cube = CUBE_POS_X as usize + CUBE_POS_Y as usize * CUBE_COUNT_X as usize;
    let i = cube * LANES + UNIT_POS as usize;
    if i < len {
        dst[i] = src[i];
    }
}

/// Copies every element of `src` into `dst` (both contiguous, as [`super::resolve`] gives them,
/// of one dtype and length). `None`, having launched nothing, where they differ or the dtype has
/// no kernel.
pub(crate) fn copy_into(src: &CubeTensor, dst: &CubeTensor) -> Option<()> {
    let len = src.meta.num_elements();
    if src.dtype != dst.dtype || dst.meta.num_elements() != len || len == 0 {
        return None;
    }
    let element = Element::of(src.dtype)?;
    let (gx, gy) = grid(len.div_ceil(LANES))?;
    let count = CubeCount::Static(gx, gy, 1);
    let cube = CubeDim::new_1d(LANES as u32);
    let client = &dst.client;
    match element {
        Element::F32 => {
            copy_values::launch::<f32>(client, count, cube, buffer_arg(src), buffer_arg(dst), len)
        }
        Element::F16 => copy_values::launch::<half::f16>(
            client,
            count,
            cube,
            buffer_arg(src),
            buffer_arg(dst),
            len,
        ),
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::super::resolve;
    use super::super::testing::{read, tensor, values, wgpu};
    use super::*;
    use burn::tensor::DType;

    /// The copy lands in the destination's own buffer (every element, an odd length past one
    /// cube), and a mismatched pair launches nothing.
    #[test]
    fn copies_into_the_given_buffer() {
        let device = wgpu();
        for dtype in [DType::F32, DType::F16] {
            let n = 3 * LANES + 5;
            let src = tensor(values(n, 0.5), [n], &device, dtype);
            let dst = tensor(vec![0.0; n], [n], &device, dtype);
            let (s, d) = (resolve(src.clone()).unwrap(), resolve(dst.clone()).unwrap());
            assert!(copy_into(&s, &d).is_some());
            assert_eq!(read(dst), read(src));
            let short = resolve(tensor(vec![0.0; n - 1], [n - 1], &device, dtype)).unwrap();
            assert!(copy_into(&s, &short).is_none());
        }
    }
}
