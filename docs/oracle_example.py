"""The oracle guide's example, as one script that runs on a CPU-only machine (and on a GPU when
there is one): dump a case, let torchvision's deform_conv2d play "your kernel", compute the
exact answer with `deformconv run --exact`, and judge the kernel with `deformconv compare`.

    python3 docs/oracle_example.py [--deformconv PATH] [--dir DIR]

docs/oracle-guide.md shows this file's parts; CI runs it whole (the guide's snippets are tested).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import deform_conv2d


def pair(v):
    return [v, v] if isinstance(v, int) else list(v)


def dump_case(name, input, offset, weight, bias=None, mask=None, grad_out=None,
              stride=1, padding=0, dilation=1, convention="torchvision"):
    """Writes NAME.npz (operands) and NAME.json (parameters) in deformconv's case format.

    padding: n, (h, w) or (top, bottom, left, right); convention: "torchvision", "mmcv" or
    "dcn_v1" (the border rule of the kernel under test)."""
    arrays = {"input": input, "offset": offset, "weight": weight,
              "mask": mask, "bias": bias, "grad_out": grad_out}
    np.savez(name + ".npz", **{k: v.detach().cpu().contiguous().numpy()
                               for k, v in arrays.items() if v is not None})
    kh, kw = weight.shape[2:]
    if not isinstance(padding, int) and len(padding) == 4:
        top, bottom, left, right = padding
        pad = {"top": top, "bottom": bottom, "left": left, "right": right}
    else:
        pad = pair(padding)
    params = {
        "stride": pair(stride), "padding": pad, "dilation": pair(dilation),
        "groups": input.shape[1] // weight.shape[1],
        "offset_groups": offset.shape[1] // (2 * kh * kw),
        "has_mask": mask is not None, "has_bias": bias is not None,
        "convention": convention,
    }
    with open(name + ".json", "w") as f:
        json.dump(params, f)


def dump_results(name, out, **leaves):
    """Writes NAME.npz with your kernel's results: `out`, and grad_<name> for each leaf tensor
    passed (input=..., offset=..., mask=..., weight=..., bias=...). A leaf without a .grad is
    an error here, not a silently missing result (compare would fail on it anyway)."""
    results = {"out": out.detach()}
    for k, v in leaves.items():
        if v.grad is None:
            raise ValueError(f"{k} has no .grad: did backward reach it?")
        results["grad_" + k] = v.grad
    np.savez(name + ".npz", **{k: v.cpu().contiguous().numpy() for k, v in results.items()})


def example(workdir, deformconv):
    """A DCN v2 layer in float32 with asymmetric padding (top 1, bottom 0, left 2, right 1):
    torchvision has only symmetric padding, so the kernel under test pads the input itself."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    pad = (1, 0, 2, 1)                                      # top, bottom, left, right
    x = torch.randn(2, 8, 12, 12)
    w = torch.randn(16, 8, 3, 3) * 0.1
    b = torch.randn(16)
    h_out, w_out = 12 + 1 + 0 - 2, 12 + 2 + 1 - 2           # 11 x 13
    off = torch.randn(2, 2 * 9, h_out, w_out)
    m = torch.rand(2, 9, h_out, w_out)
    g = torch.randn(2, 16, h_out, w_out)
    case, mine, exact = (os.path.join(workdir, n) for n in ("case", "mine", "exact"))
    dump_case(case, x, off, w, bias=b, mask=m, grad_out=g, padding=pad)

    # The kernel under test: torchvision's deform_conv2d on the explicitly padded input.
    leaves = {k: t.to(device).requires_grad_()
              for k, t in dict(input=x, offset=off, weight=w, bias=b, mask=m).items()}
    padded = F.pad(leaves["input"], (pad[2], pad[3], pad[0], pad[1]))
    out = deform_conv2d(padded, leaves["offset"], leaves["weight"], leaves["bias"],
                        mask=leaves["mask"])
    out.backward(g.to(device))
    dump_results(mine, out, **leaves)

    subprocess.run([*deformconv, "run", case + ".npz", "-o", exact + ".npz", "--exact"],
                   check=True)
    verdict = subprocess.run([*deformconv, "compare", exact + ".npz", mine + ".npz"])
    return verdict.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deformconv", default=shutil.which("deformconv"),
                    help="the deformconv binary (default: on PATH, else `cargo run --release`)")
    ap.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    args = ap.parse_args()
    deformconv = [args.deformconv] if args.deformconv else \
        ["cargo", "run", "--release", "--quiet", "--"]
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        code = example(args.dir, deformconv)
    else:
        with tempfile.TemporaryDirectory() as d:
            code = example(d, deformconv)
    print("exit code of compare:", code)
    sys.exit(code)


if __name__ == "__main__":
    main()
