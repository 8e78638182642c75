//! The benchmark workloads of issue 3, from the users' reports, shared by the benches
//! (and mirrored by `benches/peers.py`). All float32.
#![allow(dead_code)]

use deformconv::{ConvParams, Geometry};
use ndarray::{Array1, Array4};

/// One convolution problem.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub name: &'static str,
    pub n: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub dilation: usize,
    pub offset_groups: usize,
    pub mask: bool,
    pub bias: bool,
}

/// W1 small MNIST net; W2 ResNet-101 res5 deformable 3x3 (and W2s, stride 2); W3 dilated
/// (dense 5x5, dense 3x3, dilated 3x3); W4 DCN v2 detection layer.
pub const WORKLOADS: [Workload; 7] = [
    Workload {
        name: "W1",
        n: 64,
        c_in: 8,
        c_out: 16,
        h: 14,
        w: 14,
        k: 3,
        stride: 1,
        pad: 0,
        dilation: 1,
        offset_groups: 1,
        mask: false,
        bias: true,
    },
    Workload {
        name: "W2",
        n: 16,
        c_in: 512,
        c_out: 512,
        h: 7,
        w: 7,
        k: 3,
        stride: 1,
        pad: 1,
        dilation: 1,
        offset_groups: 4,
        mask: false,
        bias: false,
    },
    Workload {
        name: "W2s",
        n: 16,
        c_in: 512,
        c_out: 512,
        h: 14,
        w: 14,
        k: 3,
        stride: 2,
        pad: 1,
        dilation: 1,
        offset_groups: 4,
        mask: false,
        bias: false,
    },
    Workload {
        name: "W3-5x5",
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        k: 5,
        stride: 1,
        pad: 2,
        dilation: 1,
        offset_groups: 1,
        mask: false,
        bias: false,
    },
    Workload {
        name: "W3-3x3",
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        k: 3,
        stride: 1,
        pad: 1,
        dilation: 1,
        offset_groups: 1,
        mask: false,
        bias: false,
    },
    Workload {
        name: "W3-3x3d2",
        n: 32,
        c_in: 30,
        c_out: 64,
        h: 64,
        w: 64,
        k: 3,
        stride: 1,
        pad: 2,
        dilation: 2,
        offset_groups: 1,
        mask: false,
        bias: false,
    },
    Workload {
        name: "W4",
        n: 2,
        c_in: 256,
        c_out: 256,
        h: 64,
        w: 64,
        k: 3,
        stride: 1,
        pad: 1,
        dilation: 1,
        offset_groups: 1,
        mask: true,
        bias: true,
    },
];

/// Operands of a workload, with offsets of a few pixels (fractional) and a mask in (0, 1).
pub struct Operands {
    pub input: Array4<f32>,
    pub offset: Array4<f32>,
    pub mask: Option<Array4<f32>>,
    pub weight: Array4<f32>,
    pub bias: Option<Array1<f32>>,
}

impl Workload {
    pub fn params(&self) -> ConvParams {
        ConvParams::default()
            .stride(self.stride, self.stride)
            .padding(self.pad, self.pad)
            .dilation(self.dilation, self.dilation)
            .offset_groups(self.offset_groups)
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::new(
            [self.n, self.c_in, self.h, self.w],
            [self.c_out, self.c_in, self.k, self.k],
            &self.params(),
        )
        .unwrap()
    }

    /// `2 * N * C_out * C_in * k * k * H_out * W_out`.
    pub fn flops(&self) -> f64 {
        self.geometry().forward_flops()
    }

    pub fn operands(&self) -> Operands {
        let g = self.geometry();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32) / ((1u64 << 24) as f32)
        };
        Operands {
            input: Array4::from_shape_fn(g.input_shape(), |_| next() - 0.5),
            offset: Array4::from_shape_fn(g.offset_shape(), |_| 4.0 * next() - 2.0),
            mask: self
                .mask
                .then(|| Array4::from_shape_fn(g.mask_shape(), |_| next())),
            weight: Array4::from_shape_fn(g.weight_shape(), |_| (next() - 0.5) * 0.1),
            bias: self
                .bias
                .then(|| Array1::from_shape_fn(g.c_out, |_| next())),
        }
    }
}
