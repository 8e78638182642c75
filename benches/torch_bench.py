#!/usr/bin/env python3
"""deformconv from PyTorch, timed in one process: seed 001's training step and the layers of
deformconv::workloads (W1, W2, W4 and the batch-1 layers of deployed DCN models), through our
torch op and torchvision's CPU op, float32.

    bash python/ci.sh                  # or any install of the package (python/README.md)
    python3 benches/torch_bench.py [--threads 2] [--steps 80] [--repeats 20] [--skip-torchvision-layers]
        [--layers W4,CenterNet-16] [--skip-seed001]

Part 1, seed 001's network (conv 1->8 3x3 pad 1, max-pool 2, BN, ReLU, offset conv 8->18 3x3 +
deformable conv 8->16 3x3, max-pool 2, BN, ReLU, linear 576->10), one SGD training step on a
batch of 64 28x28 images, median over --steps steps (rounded down to rounds of 8) taken in
alternating rounds, 8 steps of each network per round (torchvision's: 1):
  (a) dense conv 8->16 in place of the deformable layer, no offset branch;
  (b) torchvision.ops.DeformConv2d;
  (c) deformconv.torch.DeformConv2d (our kernels on PyTorch's OpenMP threads, the default);
  (c') (c) after deformconv.torch.use_openmp(False): our kernels on deformconv's rayon pool;
  (d) torchvision.ops.DeformConv2d after deformconv.torch.use_for_torchvision();
  (e) the floor: the deformable conv swapped for a dense conv, the offset conv kept (its output
      enters the loss with weight 0, so its forward and backward run).
Part 2, the layers (the workloads of the Rust benches and of `cargo run --release -- bench`): forward,
and forward + every gradient (autograd, inputs requiring grad), through our torch op and
torchvision's; and the numpy API's forward and full backward, to set beside
`cargo run --release -- bench` (the Python boundary's cost).

Threads: torch.set_num_threads(N) for PyTorch's layers and our torch op (on PyTorch's OpenMP
threads), deformconv.set_num_threads(N) for (c') and the numpy API.
"""

import argparse
import statistics
import time

import torch
import torchvision

import deformconv
import deformconv.torch as dct


def median_ms(f, repeats, warmup=2):
    for _ in range(warmup):
        f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


# ---------------------------------------------------------------------------------------------
# Part 1: seed 001's network
# ---------------------------------------------------------------------------------------------


class Net(torch.nn.Module):
    """Seed 001's network; ``kind`` picks the layer after the first block."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        if kind != "dense":
            self.offset = torch.nn.Conv2d(8, 18, 3)
        if kind in ("dense", "floor"):
            self.layer = torch.nn.Conv2d(8, 16, 3)
        elif kind == "ours":
            self.layer = dct.DeformConv2d(8, 16, 3)
        else:  # torchvision, torchvision+ours
            self.layer = torchvision.ops.DeformConv2d(8, 16, 3)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(576, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(torch.max_pool2d(self.conv1(x), 2)))
        extra = None
        if self.kind == "dense":
            x = self.layer(x)
        elif self.kind == "floor":
            off = self.offset(x)
            extra = off.sum() * 0.0
            x = self.layer(x)
        else:
            x = self.layer(x, self.offset(x))
        x = torch.relu(self.bn2(torch.max_pool2d(x, 2)))
        return self.fc(x.flatten(1)), extra


def seed001(steps):
    """Each network's step timed in rounds that take turns (8 steps of each network per round,
    1 of torchvision's), so that a machine whose speed drifts moves them all alike."""
    torch.manual_seed(0)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    labels = {
        "dense": "(a) dense conv",
        "torchvision": "(b) torchvision DeformConv2d",
        "ours": "(c) deformconv.torch.DeformConv2d",
        "ours-pool": "(c') (c) on deformconv's own pool",
        "torchvision+ours": "(d) torchvision after use_for_torchvision()",
        "floor": "(e) floor: dense conv + offset conv kept",
    }
    kinds = ("dense", "floor", "ours", "ours-pool", "torchvision+ours", "torchvision")
    steppers = {}
    for kind in kinds:
        model = Net({"ours-pool": "ours"}.get(kind, kind))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(model=model, opt=opt):
            opt.zero_grad()
            logits, extra = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if extra is not None:
                loss = loss + extra
            loss.backward()
            opt.step()

        steppers[kind] = step

    def timed(kind, n):
        """`n` steps of `kind` after 2 untimed ones, in `kind`'s setting."""
        override = dct.use_for_torchvision() if kind == "torchvision+ours" else None
        dct.use_openmp(kind != "ours-pool")
        try:
            times = []
            for i in range(n + 2):
                t = time.perf_counter()
                steppers[kind]()
                if i >= 2:
                    times.append(time.perf_counter() - t)
            return times
        finally:
            dct.use_openmp(True)
            if override is not None:
                override.undo()

    times = {kind: [] for kind in kinds}
    rounds = max(1, steps // 8)
    for _ in range(rounds):
        for kind in kinds:
            times[kind] += timed(kind, 1 if kind == "torchvision" else 8)
    results = {kind: statistics.median(t) * 1e3 for kind, t in times.items()}
    dense = results["dense"]
    print(f"seed 001 training step, batch 64 of 28x28, SGD, median of {8 * rounds} steps in {rounds} alternating rounds (torchvision: {rounds})")
    print(f"{'network':48} {'ms/step':>8} {'x dense':>8}")
    for kind in ("dense", "torchvision", "ours", "ours-pool", "torchvision+ours", "floor"):
        print(f"{labels[kind]:48} {results[kind]:8.2f} {results[kind] / dense:8.2f}")
    return results


# ---------------------------------------------------------------------------------------------
# Part 2: the layers (W1, W2, W4 and the deployed models' batch-1 layers)
# ---------------------------------------------------------------------------------------------

# name, N, C_in, C_out, H, W, k, stride, pad, offset_groups, mask, bias (the Rust benches' workloads,
# deformconv::workloads: W1-W4 of the users' reports, then the batch-1 layers of deployed models)
WORKLOADS = [
    ("W1", 64, 8, 16, 14, 14, 3, 1, 0, 1, False, True),
    ("W2", 16, 512, 512, 7, 7, 3, 1, 1, 4, False, False),
    ("W4", 2, 256, 256, 64, 64, 3, 1, 1, 1, True, True),
    ("BasicVSRpp-align", 1, 128, 64, 180, 320, 3, 1, 1, 16, True, True),
    ("EDVR-PCD", 1, 64, 64, 180, 320, 3, 1, 1, 8, True, True),
    ("CenterNet-16", 1, 512, 256, 16, 16, 3, 1, 1, 1, True, True),
    ("CenterNet-64", 1, 128, 64, 64, 64, 3, 1, 1, 1, True, True),
    ("R50-DCN-c3", 1, 128, 128, 100, 168, 3, 1, 1, 1, True, False),
    ("R50-DCN-c5", 1, 512, 512, 25, 42, 3, 1, 1, 1, True, False),
]


def operands(n, c_in, c_out, h, w, k, stride, pad, og, has_mask, has_bias):
    g = torch.Generator().manual_seed(0)
    ho = (h + 2 * pad - k) // stride + 1
    wo = (w + 2 * pad - k) // stride + 1

    def u(*s, lo=0.0, hi=1.0):
        return torch.rand(*s, generator=g) * (hi - lo) + lo

    return dict(
        input=u(n, c_in, h, w, lo=-0.5, hi=0.5),
        offset=u(n, 2 * og * k * k, ho, wo, lo=-2, hi=2),
        weight=u(c_out, c_in, k, k, lo=-0.05, hi=0.05),
        mask=u(n, og * k * k, ho, wo) if has_mask else None,
        bias=u(c_out) if has_bias else None,
        grad_out=u(n, c_out, ho, wo, lo=-1, hi=1),
    )


def layer_times(fn, t, stride, pad, repeats):
    kw = dict(stride=stride, padding=pad)

    def fwd():
        with torch.no_grad():
            fn(t["input"], t["offset"], t["weight"], t["bias"], mask=t["mask"], **kw)

    leaves = {k: v.clone().requires_grad_(True) for k, v in t.items() if v is not None and k != "grad_out"}

    def fwd_bwd():
        for v in leaves.values():
            v.grad = None
        out = fn(leaves["input"], leaves["offset"], leaves["weight"], leaves.get("bias"), mask=leaves.get("mask"), **kw)
        out.backward(t["grad_out"])

    return median_ms(fwd, repeats), median_ms(fwd_bwd, repeats)


def numpy_times(t, stride, pad, repeats):
    a = {k: None if v is None else v.numpy() for k, v in t.items()}
    needs = ("input", "offset", "weight") + (("mask",) if a["mask"] is not None else ()) + (("bias",) if a["bias"] is not None else ())

    def fwd():
        deformconv.deform_conv2d(a["input"], a["offset"], a["weight"], a["bias"], stride, pad, 1, a["mask"])

    def bwd():
        deformconv.deform_conv2d_backward(a["grad_out"], a["input"], a["offset"], a["weight"], a["mask"], stride, pad, 1, needs=needs)

    return median_ms(fwd, repeats), median_ms(bwd, repeats)


def layers(repeats, skip_torchvision, names):
    print(f"\nlayers, float32, median of {repeats} runs (torchvision: fewer past W1)")
    print(f"{'workload':16} {'ours fwd':>9} {'ours f+b':>9} {'tv fwd':>9} {'tv f+b':>9} {'f+b speed-up':>12} {'numpy fwd':>10} {'numpy bwd':>10}")
    rows = {}
    for name, *shape in WORKLOADS:
        if names and name not in names:
            continue
        stride, pad = shape[6], shape[7]
        t = operands(*shape)
        of, ofb = layer_times(dct.deform_conv2d, t, stride, pad, repeats)
        nf, nb = numpy_times(t, stride, pad, repeats)
        if skip_torchvision:
            tf = tfb = float("nan")
        else:
            tv_reps = repeats if name == "W1" else 3
            tf, tfb = layer_times(torchvision.ops.deform_conv2d, t, stride, pad, tv_reps)
        rows[name] = (of, ofb, tf, tfb, nf, nb)
        print(f"{name:16} {of:9.3f} {ofb:9.3f} {tf:9.2f} {tfb:9.2f} {tfb / ofb:11.1f}x {nf:10.3f} {nb:10.3f}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--skip-torchvision-layers", action="store_true")
    ap.add_argument("--layers", default="", help="comma-separated workload names (default: all)")
    ap.add_argument("--skip-seed001", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    deformconv.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, torchvision {torchvision.__version__}, deformconv {deformconv.__version__}; "
        f"{torch.get_num_threads()} torch thread(s), {deformconv.get_num_threads()} deformconv thread(s)"
    )
    if not args.skip_seed001:
        seed001(args.steps)
    layers(args.repeats, args.skip_torchvision_layers, [n for n in args.layers.split(",") if n])


if __name__ == "__main__":
    main()
