#!/usr/bin/env python3
"""deformconv.torch on channels_last (NHWC) tensors against the same layer on NCHW tensors, in
one process, alternating: forward, and forward + every gradient through autograd, float32.

    python3 benches/torch_layouts.py [--threads 2] [--rounds 7] [--repeats 5]

In the channels_last case every 4-D operand is channels_last (input, offset, mask, weight and
the incoming gradient), as in a model moved with ``model.to(memory_format=torch.channels_last)``
whose offset branch is a convolution; the outputs come back channels_last. Each round times
every case (the median of ``--repeats`` calls); the table gives the median of the rounds and
the NHWC / NCHW ratio.
"""

import argparse
import statistics

import torch

import deformconv.torch as dct
from torch_bench import median_ms  # this folder's shared timer

# (name, n, c_in, c_out, h, w, offset_groups, mask): deformconv::workloads' W2 and W4.
LAYERS = [
    ("W2", 16, 512, 512, 7, 7, 4, False),
    ("W4", 2, 256, 256, 64, 64, 1, True),
]


def operands(n, c_in, c_out, h, w, og, mask, channels_last):
    g = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def r(*s, scale=1.0):
        t = (torch.rand(*s, generator=g) * 2 - 1) * scale
        return t.contiguous(memory_format=fmt) if t.dim() == 4 else t

    return dict(
        input=r(n, c_in, h, w).requires_grad_(),
        offset=r(n, 2 * og * 9, h, w, scale=2.0).requires_grad_(),
        weight=r(c_out, c_in, 3, 3, scale=0.05).requires_grad_(),
        bias=r(c_out).requires_grad_(),
        mask=r(n, og * 9, h, w).requires_grad_() if mask else None,
        grad=r(n, c_out, h, w),
    )


def case(t, backward):
    def forward():
        return dct.deform_conv2d(t["input"], t["offset"], t["weight"], t["bias"], padding=1, mask=t["mask"])

    if not backward:
        return lambda: forward()

    def both():
        out = forward()
        out.backward(t["grad"])

    return both


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cases = {}
    for name, *shape in LAYERS:
        for layout in ("NCHW", "NHWC"):
            t = operands(*shape, channels_last=layout == "NHWC")
            out = case(t, False)()
            assert out.is_contiguous(memory_format=torch.channels_last) == (layout == "NHWC")
            for part in ("forward", "fwd+bwd"):
                cases[(name, part, layout)] = (case(t, part == "fwd+bwd"), [])
    for _ in range(a.rounds):
        for f, times in cases.values():
            times.append(median_ms(f, a.repeats, warmup=1))
    print(f"{a.threads} threads, median of {a.rounds} alternating rounds, each the median of {a.repeats} calls, ms")
    print("| layer | part | NCHW | channels_last | NHWC / NCHW |")
    print("|---|---|---|---|---|")
    for name, *_ in LAYERS:
        for part in ("forward", "fwd+bwd"):
            nchw = statistics.median(cases[(name, part, "NCHW")][1])
            nhwc = statistics.median(cases[(name, part, "NHWC")][1])
            print(f"| {name} | {part} | {nchw:.2f} | {nhwc:.2f} | {nhwc / nchw:.3f} |")


if __name__ == "__main__":
    main()
