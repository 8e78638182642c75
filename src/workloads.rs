//! The benchmark workloads: real deformable layers from the users' reports, one definition for
//! the criterion benches, the `deformconv bench` command, the probes in `examples/` and the
//! Python benchmark (which mirrors this table).
//!
//! | name | layer | N | C_in → C_out | H x W | kernel | notes |
//! |---|---|---|---|---|---|---|
//! | W1 | small MNIST net | 64 | 8 → 16 | 14x14 | 3x3 | bias |
//! | W2 | ResNet-101 res5 | 16 | 512 → 512 | 7x7 | 3x3, pad 1 | 4 offset groups |
//! | W2s | res5, strided | 16 | 512 → 512 | 14x14 | 3x3, pad 1, stride 2 | 4 offset groups |
//! | W3-5x5 / W3-3x3 / W3-3x3d2 | dense vs dilated | 32 | 30 → 64 | 64x64 | 5x5 / 3x3 / 3x3 dil 2 | |
//! | W4 | DCN v2 detection layer | 2 | 256 → 256 | 64x64 | 3x3, pad 1 | mask, bias |
//!
//! [`DEPLOYED`]: the batch-1 layers of DCN models as they are deployed on CPUs (one image or
//! one video frame at a time), all 3x3, padding 1, DCN v2 (with mask):
//!
//! | name | layer | C_in → C_out | H x W | offset groups | bias |
//! |---|---|---|---|---|---|
//! | BasicVSRpp-align | BasicVSR++ second-order alignment | 128 → 64 | 180x320 | 16 | yes |
//! | EDVR-PCD | EDVR PCD alignment | 64 → 64 | 180x320 | 8 | yes |
//! | CenterNet-16 | CenterNet DCN head | 512 → 256 | 16x16 | 1 | yes |
//! | CenterNet-64 | CenterNet DCN head | 128 → 64 | 64x64 | 1 | yes |
//! | R50-DCN-c3 | ResNet-50-DCN stage 3 | 128 → 128 | 100x168 | 1 | no |
//! | R50-DCN-c5 | ResNet-50-DCN stage 5 | 512 → 512 | 25x42 | 1 | no |
//!
//! [`all`] yields both tables, in that order.

use ndarray::{Array1, Array4};

use crate::{ConvParams, Geometry};

/// One convolution problem: shapes and parameters (square kernel, stride, padding, dilation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Short name, `W1` … `W4`.
    pub name: &'static str,
    /// What layer it is, for tables.
    pub description: &'static str,
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel size (square).
    pub k: usize,
    /// Stride (both axes).
    pub stride: usize,
    /// Symmetric padding (both axes).
    pub pad: usize,
    /// Dilation (both axes).
    pub dilation: usize,
    /// Offset groups.
    pub offset_groups: usize,
    /// DCN v2 (a modulation mask).
    pub mask: bool,
    /// A bias.
    pub bias: bool,
}

const fn workload(name: &'static str, description: &'static str) -> Workload {
    Workload {
        name,
        description,
        n: 1,
        c_in: 1,
        c_out: 1,
        h: 1,
        w: 1,
        k: 3,
        stride: 1,
        pad: 0,
        dilation: 1,
        offset_groups: 1,
        mask: false,
        bias: false,
    }
}

/// Every workload, in the order of the tables.
pub const WORKLOADS: [Workload; 7] = [
    Workload {
        n: 64,
        c_in: 8,
        c_out: 16,
        h: 14,
        w: 14,
        bias: true,
        ..workload("W1", "MNIST net, 8->16, 14x14")
    },
    Workload {
        n: 16,
        c_in: 512,
        c_out: 512,
        h: 7,
        w: 7,
        pad: 1,
        offset_groups: 4,
        ..workload("W2", "ResNet-101 res5, 512->512, 7x7")
    },
    Workload {
        n: 16,
        c_in: 512,
        c_out: 512,
        h: 14,
        w: 14,
        pad: 1,
        stride: 2,
        offset_groups: 4,
        ..workload("W2s", "res5 stride 2, 512->512, 14x14")
    },
    Workload {
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        k: 5,
        pad: 2,
        ..workload("W3-5x5", "dense 5x5, 30->64, 64x64")
    },
    Workload {
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        pad: 1,
        ..workload("W3-3x3", "dense 3x3, 30->64, 64x64")
    },
    Workload {
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        pad: 2,
        dilation: 2,
        ..workload("W3-3x3d2", "dilated 3x3 (d=2), 30->64, 64x64")
    },
    Workload {
        n: 2,
        c_in: 256,
        c_out: 256,
        h: 64,
        w: 64,
        pad: 1,
        mask: true,
        bias: true,
        ..workload("W4", "DCN v2 detection, 256->256, 64x64")
    },
];

/// A batch-1 DCN v2 layer of a deployed model: 3x3, padding 1, with mask.
const fn deployed(
    name: &'static str,
    description: &'static str,
    [c_in, c_out, h, w, offset_groups]: [usize; 5],
    bias: bool,
) -> Workload {
    Workload {
        c_in,
        c_out,
        h,
        w,
        pad: 1,
        offset_groups,
        mask: true,
        bias,
        ..workload(name, description)
    }
}

/// The batch-1 layers of deployed DCN models (video restoration, detection heads, backbones),
/// where the CPU peers are ONNX Runtime and OpenVINO (`benches/peers.py`).
pub const DEPLOYED: [Workload; 6] = [
    deployed(
        "BasicVSRpp-align",
        "BasicVSR++ second-order alignment, 128->64, 180x320, 16 offset groups",
        [128, 64, 180, 320, 16],
        true,
    ),
    deployed(
        "EDVR-PCD",
        "EDVR PCD alignment, 64->64, 180x320, 8 offset groups",
        [64, 64, 180, 320, 8],
        true,
    ),
    deployed(
        "CenterNet-16",
        "CenterNet DCN head, 512->256, 16x16",
        [512, 256, 16, 16, 1],
        true,
    ),
    deployed(
        "CenterNet-64",
        "CenterNet DCN head, 128->64, 64x64",
        [128, 64, 64, 64, 1],
        true,
    ),
    deployed(
        "R50-DCN-c3",
        "ResNet-50-DCN stage 3, 128->128, 100x168",
        [128, 128, 100, 168, 1],
        false,
    ),
    deployed(
        "R50-DCN-c5",
        "ResNet-50-DCN stage 5, 512->512, 25x42",
        [512, 512, 25, 42, 1],
        false,
    ),
];

/// Every workload: [`WORKLOADS`] (the users' reports), then [`DEPLOYED`].
pub fn all() -> impl Iterator<Item = Workload> {
    WORKLOADS.into_iter().chain(DEPLOYED)
}

/// The operands of a workload, reproducible from its shape alone: input and `grad_out` in
/// [-0.5, 0.5), offsets of up to two pixels either way (as a trained layer has), a mask in
/// [0, 1), weights in [-0.05, 0.05), bias in [0, 1).
#[derive(Debug, Clone)]
pub struct Operands {
    /// `[N, C_in, H, W]`.
    pub input: Array4<f32>,
    /// `[N, 2 * G_off * k * k, H_out, W_out]`.
    pub offset: Array4<f32>,
    /// `[N, G_off * k * k, H_out, W_out]` when the workload has a mask.
    pub mask: Option<Array4<f32>>,
    /// `[C_out, C_in, k, k]`.
    pub weight: Array4<f32>,
    /// `[C_out]` when the workload has a bias.
    pub bias: Option<Array1<f32>>,
    /// `[N, C_out, H_out, W_out]`, for the backward.
    pub grad_out: Array4<f32>,
}

/// SplitMix64, mapped to `[0, 1)` with 24 bits.
struct SplitMix(u64);

impl SplitMix {
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    fn array(&mut self, shape: [usize; 4], lo: f32, hi: f32) -> Array4<f32> {
        Array4::from_shape_simple_fn(shape, || lo + (hi - lo) * self.unit())
    }
}

impl Workload {
    /// Looks a workload up by name.
    pub fn named(name: &str) -> Option<Workload> {
        all().find(|w| w.name == name)
    }

    /// The same layer with another batch size.
    pub fn with_batch(self, n: usize) -> Workload {
        Workload { n, ..self }
    }

    /// Its parameters.
    pub fn params(&self) -> ConvParams {
        ConvParams::default()
            .stride(self.stride, self.stride)
            .padding(self.pad, self.pad)
            .dilation(self.dilation, self.dilation)
            .offset_groups(self.offset_groups)
    }

    /// Its shapes.
    pub fn geometry(&self) -> Geometry {
        Geometry::new(
            [self.n, self.c_in, self.h, self.w],
            [self.c_out, self.c_in, self.k, self.k],
            &self.params(),
        )
        .expect("every workload of the table is a valid problem")
    }

    /// Forward multiply-adds times two: `2 * N * C_out * C_in * k * k * H_out * W_out`.
    pub fn flops(&self) -> f64 {
        self.geometry().forward_flops()
    }

    /// Reproducible operands (the same for the same shape on every run and machine).
    pub fn operands(&self) -> Operands {
        let g = self.geometry();
        let mut rng = SplitMix(0x5EED ^ g.forward_flops() as u64);
        Operands {
            input: rng.array(g.input_shape(), -0.5, 0.5),
            offset: rng.array(g.offset_shape(), -2.0, 2.0),
            mask: self.mask.then(|| rng.array(g.mask_shape(), 0.0, 1.0)),
            weight: rng.array(g.weight_shape(), -0.05, 0.05),
            bias: self
                .bias
                .then(|| Array1::from_shape_simple_fn(g.c_out, || rng.unit())),
            grad_out: rng.array(g.out_shape(), -0.5, 0.5),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_is_valid_and_reproducible() {
        for w in all() {
            let small = w.with_batch(1);
            let (a, b) = (small.operands(), small.operands());
            assert_eq!(a.input, b.input, "{}", w.name);
            assert_eq!(
                a.grad_out.shape(),
                small.geometry().out_shape(),
                "{}",
                w.name
            );
            assert_eq!(a.mask.is_some(), w.mask);
            assert!(a.offset.iter().all(|v| (-2.0..2.0).contains(v)));
            assert_eq!(Workload::named(w.name), Some(w));
        }
    }
}
