"""Calibration of `deformconv compare` on a correct float32 kernel that is not ours:
torchvision's CPU deform_conv2d, forward and every gradient, on random problems (shapes,
groups, offset groups, masks, strides, paddings, dilations, and offsets from tiny to far
outside). Every case must pass (no false alarm); the script prints the largest err/bound and
statistic seen per tensor, the figures docs/oracle-guide.md quotes.

    python3 benches/calibrate_torchvision.py [--cases 600] [--deformconv target/release/deformconv]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torchvision
from torchvision.ops import deform_conv2d

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
from oracle_example import dump_case, dump_results  # noqa: E402  (the guide's tested helpers)

RESULTS = ["out", "grad_input", "grad_offset", "grad_mask", "grad_weight", "grad_bias"]


def random_case(rng):
    groups = int(rng.choice([1, 1, 2]))
    og = int(rng.choice([1, 1, 2]))
    c_in = groups * og * int(rng.integers(1, 5))
    c_out = groups * int(rng.integers(1, 5))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    s, p, d = int(rng.integers(1, 3)), int(rng.integers(0, 3)), int(rng.integers(1, 3))
    h, w = int(rng.integers(kh * d, 14)), int(rng.integers(kw * d, 14))
    n = int(rng.integers(1, 4))
    h_out = (h + 2 * p - d * (kh - 1) - 1) // s + 1
    w_out = (w + 2 * p - d * (kw - 1) - 1) // s + 1
    scale = float(rng.choice([0.0, 1e-7, 1e-4, 0.5, 2.0, 8.0]))
    offset = rng.standard_normal((n, 2 * og * kh * kw, h_out, w_out)) * scale
    if rng.random() < 0.3:       # some exactly integer and half-integer offsets
        offset = np.round(offset * 2) / 2
    t = lambda a: torch.tensor(a, dtype=torch.float32)
    return dict(
        input=t(rng.standard_normal((n, c_in, h, w))),
        offset=t(offset),
        weight=t(rng.standard_normal((c_out, c_in // groups, kh, kw)) * 0.3),
        bias=t(rng.standard_normal(c_out)) if rng.random() < 0.7 else None,
        mask=t(rng.random((n, og * kh * kw, h_out, w_out)) * 1.5 - 0.25) if rng.random() < 0.7 else None,
        grad_out=t(rng.standard_normal((n, c_out, h_out, w_out))),
        stride=s, padding=p, dilation=d,
    )


def tiny_offset_case(rng, s):
    """Issue 17's family: a DCN layer just out of its zero initialisation, offsets s * randn."""
    t = lambda a: torch.tensor(a, dtype=torch.float32)
    return dict(
        input=t(rng.standard_normal((2, 8, 12, 12))),
        offset=t(rng.standard_normal((2, 18, 12, 12)) * s),
        weight=t(rng.standard_normal((16, 8, 3, 3)) * 0.3),
        bias=t(rng.standard_normal(16)), mask=None,
        grad_out=t(rng.standard_normal((2, 16, 12, 12))),
        stride=1, padding=1, dilation=1,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--deformconv", default="target/release/deformconv")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    worst = {r: [0.0, 0.0] for r in RESULTS}
    failures, ambiguous = [], 0
    with tempfile.TemporaryDirectory() as d:
        tiny = [0.0, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2]
        for i in range(args.cases + len(tiny)):
            c = tiny_offset_case(rng, tiny[i]) if i < len(tiny) else random_case(rng)
            case, mine, exact, report = (os.path.join(d, x) for x in ("case", "mine", "exact", "r.json"))
            dump_case(case, c["input"], c["offset"], c["weight"], bias=c["bias"], mask=c["mask"],
                      grad_out=c["grad_out"], stride=c["stride"], padding=c["padding"],
                      dilation=c["dilation"])
            leaves = {k: c[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")
                      if c[k] is not None}
            out = deform_conv2d(leaves["input"], leaves["offset"], leaves["weight"], leaves.get("bias"),
                                stride=c["stride"], padding=c["padding"], dilation=c["dilation"],
                                mask=leaves.get("mask"))
            out.backward(c["grad_out"])
            dump_results(mine, out, **leaves)
            subprocess.run([args.deformconv, "run", case + ".npz", "-o", exact + ".npz", "--exact"],
                           check=True, stdout=subprocess.DEVNULL)
            r = subprocess.run([args.deformconv, "compare", exact + ".npz", mine + ".npz", "--json", report],
                               stdout=subprocess.PIPE, text=True)
            v = json.load(open(report))
            ambiguous += v["ambiguous_samples"]
            if r.returncode != 0:
                failures.append((i, r.stdout))
            for t in v["tensors"]:
                ratio = t["err_over_bound"] if isinstance(t["err_over_bound"], float) else 0.0
                stat = t["statistic"] if isinstance(t["statistic"], float) and t["elements"] >= 64 else 0.0
                w = worst[t["name"]]
                w[0], w[1] = max(w[0], ratio), max(w[1], stat)
    print(f"torchvision {torchvision.__version__} (torch {torch.__version__}) float32 CPU, {args.cases} random cases and the tiny-offset family (s = 0, 1e-9 ... 1e-2), seed {args.seed}: "
          f"{len(failures)} false alarm(s), {ambiguous} ambiguous samples in all")
    print("tensor        max err/bound   max rms stat (64+ elements)")
    for r in RESULTS:
        print(f"{r:12}  {worst[r][0]:13.3e}   {worst[r][1]:10.3e}")
    for i, text in failures[:3]:
        print(f"--- case {i}:\n{text}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
