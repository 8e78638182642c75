#!/usr/bin/env python3
"""Times float32 deformable-convolution FORWARD of this crate against its CPU peers, in one
process, so every ratio in the table comes from the same run on the same machine:

  ours       deformconv.deform_conv2d (numpy API, after deformconv.set_num_threads(threads))
  our dense  deformconv.conv2d on the same shape: the sampling-free baseline
  ORT        ONNX Runtime, a one-node ONNX DeformConv (opset 19) model, CPUExecutionProvider,
             intra_op_num_threads=threads, inter_op_num_threads=1, sequential execution
  OpenVINO   a model built with openvino.opset8.deformable_convolution (bilinear_interpolation_pad
             =True, torchvision's border rule) plus a bias Add, compiled on "CPU" with
             INFERENCE_NUM_THREADS=threads, INFERENCE_PRECISION_HINT=f32, PERFORMANCE_HINT=LATENCY,
             run through one reused infer request (request.infer, zero-copy inputs and outputs)
             (OpenVINO's ONNX frontend has no conversion rule for DeformConv-19, hence the
             opset API.)

In both peer models the weights and the bias are constants (ONNX initializers, OpenVINO
Constants), as in a deployed model; input, offsets and mask are fed on every call. We are
handed the weights on every call.

Before timing, the script checks on every layer that ORT's and OpenVINO's outputs match ours
(max |difference| / max |our output|, printed; it aborts above 1e-3) and that OpenVINO's
compiled DeformableConvolution node really runs in f32 (this CPU may default to bf16).

Timing: --rounds rounds; each round times every system on every layer once, as the median
of --repeats calls (the order of the systems rotates from round to round). The table gives
the median over rounds and the minimum over rounds, in ms; GFLOP/s is ours at the median,
with FLOPs = 2 * N * C_out * C_in * k * k * H_out * W_out (as benches/forward.rs counts
them); the ratios are peer median / our median (above 1: we are faster).

    pip install numpy onnx onnxruntime openvino
    cd /tmp && PYTHONPATH=/work/main/python python3 /work/main/benches/peers.py \\
        [--threads 2] [--rounds 7] [--repeats 3] [--layers EDVR-PCD,W4] [--no-ort] [--no-openvino]

On a shared machine, wrap it in `flock /work/deformconv.lock ...`.
"""
import argparse
import statistics
import sys
import time
from importlib import metadata

import numpy as np

import deformconv

# Mirrors `deformconv::workloads` (src/workloads.rs): all 3x3, DCN v2 (with a mask) unless
# `mask` is False.
# name, N, C_in, C_out, H, W, k, stride, pad, offset_groups, mask, bias
LAYERS = [
    ("BasicVSRpp-align", 1, 128, 64, 180, 320, 3, 1, 1, 16, True, True),  # BasicVSR++ second-order alignment
    ("EDVR-PCD", 1, 64, 64, 180, 320, 3, 1, 1, 8, True, True),  # EDVR PCD alignment
    ("CenterNet-16", 1, 512, 256, 16, 16, 3, 1, 1, 1, True, True),  # CenterNet DCN head, 16x16
    ("CenterNet-64", 1, 128, 64, 64, 64, 3, 1, 1, 1, True, True),  # CenterNet DCN head, 64x64
    ("R50-DCN-c3", 1, 128, 128, 100, 168, 3, 1, 1, 1, True, False),  # ResNet-50-DCN stage 3
    ("R50-DCN-c5", 1, 512, 512, 25, 42, 3, 1, 1, 1, True, False),  # ResNet-50-DCN stage 5
    ("W2", 16, 512, 512, 7, 7, 3, 1, 1, 4, False, False),
    ("W4", 2, 256, 256, 64, 64, 3, 1, 1, 1, True, True),
]

TOLERANCE = 1e-3


class Layer:
    """One layer: its shape, random tensors (fixed seed) and FLOP count."""

    def __init__(self, row, rng):
        (self.name, self.n, self.c_in, self.c_out, self.h, self.w, self.k,
         self.stride, self.pad, self.og, self.has_mask, self.has_bias) = row
        k = self.k
        self.h_out = (self.h + 2 * self.pad - k) // self.stride + 1
        self.w_out = (self.w + 2 * self.pad - k) // self.stride + 1
        out_hw = (self.h_out, self.w_out)

        def uniform(lo, hi, shape):
            return rng.uniform(lo, hi, shape).astype(np.float32)

        self.x = uniform(-0.5, 0.5, (self.n, self.c_in, self.h, self.w))
        self.weight = uniform(-0.05, 0.05, (self.c_out, self.c_in, k, k))
        self.offset = uniform(-2.0, 2.0, (self.n, 2 * self.og * k * k, *out_hw))
        self.bias = uniform(0.0, 1.0, (self.c_out,)) if self.has_bias else None
        self.mask = uniform(0.0, 1.0, (self.n, self.og * k * k, *out_hw)) if self.has_mask else None
        self.flops = 2.0 * self.n * self.c_out * self.c_in * k * k * self.h_out * self.w_out

    def feed(self):
        """The per-call tensors, by the names the peer models give them."""
        feed = {"X": self.x, "offset": self.offset}
        if self.has_mask:
            feed["mask"] = self.mask
        return feed


# ---- the systems: each returns a zero-argument callable that computes the layer's output ----


def ours(layer):
    return lambda: deformconv.deform_conv2d(
        layer.x, layer.offset, layer.weight, layer.bias,
        stride=layer.stride, padding=layer.pad, dilation=1, mask=layer.mask)


def our_dense(layer):
    return lambda: deformconv.conv2d(
        layer.x, layer.weight, layer.bias, stride=layer.stride, padding=layer.pad, dilation=1)


def ort_runner(layer, threads):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("X", f, list(layer.x.shape)),
        helper.make_tensor_value_info("offset", f, list(layer.offset.shape)),
    ]
    initializers = [numpy_helper.from_array(layer.weight, "W")]
    node_inputs = ["X", "W", "offset", ""]  # X, W, offset, B, mask
    if layer.has_bias:
        initializers.append(numpy_helper.from_array(layer.bias, "B"))
        node_inputs[3] = "B"
    if layer.has_mask:
        inputs.append(helper.make_tensor_value_info("mask", f, list(layer.mask.shape)))
        node_inputs.append("mask")
    while node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node(
        "DeformConv", node_inputs, ["Y"],
        kernel_shape=[layer.k, layer.k],
        strides=[layer.stride] * 2,
        pads=[layer.pad] * 4,
        dilations=[1, 1],
        group=1,
        offset_group=layer.og,
    )
    output = helper.make_tensor_value_info("Y", f, [layer.n, layer.c_out, layer.h_out, layer.w_out])
    graph = helper.make_graph([node], "deform_conv", inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = layer.feed()
    return lambda: session.run(None, feed)[0]


def openvino_runner(layer, threads):
    import openvino as ov
    import openvino.opset8 as ops

    x = ops.parameter(layer.x.shape, np.float32, name="X")
    offset = ops.parameter(layer.offset.shape, np.float32, name="offset")
    params = [x, offset]
    mask = None
    if layer.has_mask:
        mask = ops.parameter(layer.mask.shape, np.float32, name="mask")
        params.append(mask)
    y = ops.deformable_convolution(
        x, offset, ops.constant(layer.weight),
        strides=[layer.stride] * 2,
        pads_begin=[layer.pad] * 2,
        pads_end=[layer.pad] * 2,
        dilations=[1, 1],
        mask=mask,
        auto_pad="explicit",
        group=1,
        deformable_group=layer.og,
        bilinear_interpolation_pad=True,
    )
    if layer.has_bias:
        y = ops.add(y, ops.constant(layer.bias.reshape(1, layer.c_out, 1, 1)))
    model = ov.Model([y], params, "deform_conv")
    config = {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY",
    }
    compiled = ov.Core().compile_model(model, "CPU", config)
    check_openvino_f32(compiled, layer.name)
    request = compiled.create_infer_request()
    feed = layer.feed()
    # Zero-copy in and out (the output is a view of the request's tensor, valid until the
    # next call), so OpenVINO pays no numpy copies that ours and ORT do not pay either.
    return lambda: request.infer(feed, share_inputs=True, share_outputs=True)[0]


def check_openvino_f32(compiled, name):
    """Abort unless the compiled model's precision hint is f32 and its deformable
    convolution node really executes in f32."""
    hint = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    precisions = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if info["layerType"].astype(str) == "DeformableConvolution":
            precisions.append(info["runtimePrecision"].astype(str))
    if "float32" not in hint.lower() or precisions != ["f32"]:
        sys.exit(f"{name}: OpenVINO is not computing in f32 "
                 f"(precision hint {hint}, DeformableConvolution runtime precision {precisions})")


# ---- measurement and report ----


def relative_error(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def time_calls(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_facts():
    facts = {}
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key in ("model name", "cpu family") and key not in facts:
                facts[key] = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    present = [flag for flag in ("avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    absent = [flag for flag in ("avx512f", "avx512_bf16", "amx_bf16") if flag not in flags]
    return facts, present, absent


def version(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3, help="calls per system per layer per round")
    ap.add_argument("--layers", help="comma-separated subset of: " + ",".join(r[0] for r in LAYERS))
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    ap.add_argument("--no-openvino", action="store_true", help="skip OpenVINO")
    args = ap.parse_args()
    rows = LAYERS
    if args.layers:
        wanted = [name.strip() for name in args.layers.split(",") if name.strip()]
        known = {r[0]: r for r in LAYERS}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            ap.error(f"unknown layers {unknown}; known: {list(known)}")
        rows = [known[name] for name in wanted]
    return args, rows


def peer_available(module, skip, label):
    if skip:
        print(f"note: {label} skipped (--no-{label.lower().replace(' ', '')})")
        return False
    try:
        __import__(module)
        return True
    except ImportError as err:
        print(f"note: {label} skipped, import failed: {err}")
        return False


def main():
    args, rows = parse_args()
    deformconv.set_num_threads(args.threads)

    facts, present, absent = cpu_facts()
    print(f"CPU: {facts.get('model name', '?')}, cpu family {facts.get('cpu family', '?')}; "
          f"flags present: {', '.join(present) or 'none'}; absent: {', '.join(absent) or 'none'}")
    print(f"onnxruntime {version('onnxruntime')}, openvino {version('openvino')}, "
          f"numpy {np.__version__}; threads {args.threads}, rounds {args.rounds}, "
          f"repeats {args.repeats} (median per round)")

    use_ort = peer_available("onnxruntime", args.no_ort, "ORT")
    use_openvino = peer_available("openvino", args.no_openvino, "OpenVINO")
    systems = ["ours", "dense"] + (["ort"] if use_ort else []) + (["openvino"] if use_openvino else [])

    # Build every runner and check the peers against us; the first call of each is a warm-up.
    rng = np.random.default_rng(0)
    layers, runners = [], {}
    for row in rows:
        layer = Layer(row, rng)
        layers.append(layer)
        runners[layer.name, "ours"] = ours(layer)
        runners[layer.name, "dense"] = our_dense(layer)
        if use_ort:
            runners[layer.name, "ort"] = ort_runner(layer, args.threads)
        if use_openvino:
            runners[layer.name, "openvino"] = openvino_runner(layer, args.threads)
        want = runners[layer.name, "ours"]()
        runners[layer.name, "dense"]()
        checks = []
        for system in systems[2:]:
            err = relative_error(runners[layer.name, system](), want)
            checks.append(f"{system} {err:.1e}")
            if not err <= TOLERANCE:
                sys.exit(f"{layer.name}: {system} disagrees with ours: "
                         f"max|diff|/max|out| = {err:.3e} > {TOLERANCE}")
        print(f"check {layer.name:17s} max|diff|/max|ours|: {', '.join(checks) or '(no peers)'}")

    times = {key: [] for key in runners}
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for layer in layers:
            for system in order:
                times[layer.name, system].append(time_calls(runners[layer.name, system], args.repeats))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    def cell(layer, system):
        if (layer.name, system) not in times:
            return "-"
        t = times[layer.name, system]
        return f"{statistics.median(t) * 1e3:.2f} / {min(t) * 1e3:.2f}"

    def ratio(layer, system):
        if (layer.name, system) not in times:
            return "-"
        return f"{statistics.median(times[layer.name, system]) / statistics.median(times[layer.name, 'ours']):.2f}"

    print()
    print("times in ms, median over rounds / minimum over rounds; ratios: peer median / our median")
    print()
    print("| layer | ours ms | our dense ms | ONNX Runtime ms | OpenVINO ms | ours GFLOP/s | ORT/ours | OpenVINO/ours |")
    print("|---|---|---|---|---|---|---|---|")
    for layer in layers:
        gflops = layer.flops / statistics.median(times[layer.name, "ours"]) / 1e9
        print(f"| {layer.name} | {cell(layer, 'ours')} | {cell(layer, 'dense')} | {cell(layer, 'ort')} "
              f"| {cell(layer, 'openvino')} | {gflops:.1f} | {ratio(layer, 'ort')} | {ratio(layer, 'openvino')} |")


if __name__ == "__main__":
    main()
