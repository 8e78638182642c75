#!/usr/bin/env python3
"""Times ONNX Runtime's CPU DeformConv (opset 19) on workloads W2, W2s and W4 of issue 3, float32,
so that our ratio to it comes from one run on the same machine.

    pip install onnxruntime numpy onnx
    python3 benches/peers.py [--threads 2] [--repeats 30]

Prints one line per workload: median and best time in ms, and GFLOP/s at the median
(FLOPs = 2 * N * C_out * C_in * k * k * H_out * W_out, as in benches/forward.rs).
"""
import argparse
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# name, N, C_in, C_out, H, W, k, stride, pad, offset_groups, mask, bias (see benches/workloads/mod.rs)
WORKLOADS = [
    ("W2", 16, 512, 512, 7, 7, 3, 1, 1, 4, False, False),
    ("W2s", 16, 512, 512, 14, 14, 3, 2, 1, 4, False, False),
    ("W4", 2, 256, 256, 64, 64, 3, 1, 1, 1, True, True),
]


def model(n, c_in, c_out, h, w, k, stride, pad, og, has_mask, has_bias, h_out, w_out):
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("X", f, [n, c_in, h, w]),
        helper.make_tensor_value_info("W", f, [c_out, c_in, k, k]),
        helper.make_tensor_value_info("offset", f, [n, 2 * og * k * k, h_out, w_out]),
    ]
    names = ["X", "W", "offset"]
    if has_bias:
        inputs.append(helper.make_tensor_value_info("B", f, [c_out]))
    names.append("B" if has_bias else "")
    if has_mask:
        inputs.append(helper.make_tensor_value_info("mask", f, [n, og * k * k, h_out, w_out]))
        names.append("mask")
    node = helper.make_node(
        "DeformConv",
        names,
        ["Y"],
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
        dilations=[1, 1],
        group=1,
        offset_group=og,
    )
    out = helper.make_tensor_value_info("Y", f, [n, c_out, h_out, w_out])
    graph = helper.make_graph([node], "deform", inputs, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, intra_op_num_threads={args.threads}")
    for name, n, c_in, c_out, h, w, k, stride, pad, og, has_mask, has_bias in WORKLOADS:
        h_out = (h + 2 * pad - k) // stride + 1
        w_out = (w + 2 * pad - k) // stride + 1
        m = model(n, c_in, c_out, h, w, k, stride, pad, og, has_mask, has_bias, h_out, w_out)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        feed = {
            "X": rng.uniform(-0.5, 0.5, (n, c_in, h, w)).astype(np.float32),
            "W": rng.uniform(-0.05, 0.05, (c_out, c_in, k, k)).astype(np.float32),
            "offset": rng.uniform(-2, 2, (n, 2 * og * k * k, h_out, w_out)).astype(np.float32),
        }
        if has_bias:
            feed["B"] = rng.uniform(0, 1, (c_out,)).astype(np.float32)
        if has_mask:
            feed["mask"] = rng.uniform(0, 1, (n, og * k * k, h_out, w_out)).astype(np.float32)
        for _ in range(3):
            sess.run(None, feed)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        flops = 2.0 * n * c_out * c_in * k * k * h_out * w_out
        print(f"{name:5s} ORT DeformConv  median {med * 1e3:8.2f} ms  best {min(times) * 1e3:8.2f} ms  {flops / med / 1e9:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
