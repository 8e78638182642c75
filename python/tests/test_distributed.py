"""deformconv.torch under torch.nn.parallel.DistributedDataParallel: seed 001's network trained
for a few SGD steps by 2 processes (gloo, CPU) ends with the parameters of one process trained on
the same global batch.

Seed 001's network has BatchNorm2d layers, which in training mode normalise with the statistics
of the batch they see: under DDP each process sees only its half, so plain BN under DDP is *not*
the single-process network on the global batch (the ``local_bn`` control below shows by how
much). ``torch.nn.SyncBatchNorm`` would fix that, but it refuses CPU tensors (torch 2.15 raises
"SyncBatchNorm expected input tensor to be on GPU ..." once a process group is initialised).
The DDP processes therefore use `GlobalBatchNorm2d`: BatchNorm2d (affine=False, as in seed 001)
whose training-mode mean and variance are all-reduced over the processes, with a differentiable
all-reduce, so the gradient through the statistics sums every process's loss as SyncBatchNorm
does. That *is* BatchNorm on the global batch, and the single-process reference uses torch's own
``nn.BatchNorm2d``: the comparison also checks the stand-in (its running statistics included).

Each process runs PyTorch, and so deformconv's torch op, on one thread (2 processes, 2 cores).
Everything is bounded: gloo's collectives time out after 60 s, and the test kills the workers
and fails if they have not finished within `DEADLINE_S`.

Two controls show that the test can fail: the same DDP run with its gradient all-reduce switched
off (``no_sync``), and DDP with plain per-process BatchNorm, must both end far (>= 1000x the
absolute tolerance) from the reference.

Run a worker by hand: ``python3 test_distributed.py --worker RANK WORLD STORE_FILE WORKDIR``.
"""

import os
import subprocess
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import deformconv  # noqa: E402
import deformconv.torch as dct  # noqa: E402

WORLD = 2
GLOBAL_BATCH = 16  # 8 per process
STEPS = 5
LR, MOMENTUM = 0.05, 0.9
DEADLINE_S = 180  # the whole distributed part; it takes about 5 s on 2 idle cores
VARIANTS = ("ddp", "no_allreduce", "local_bn")

# f32 rounding: the DDP run sums each gradient in another order than the single process (two
# halves of 8 samples, then gloo's sum of the two, then / 2; against one sum of 16), and so do
# the BatchNorm statistics (two-pass sums per process, all-reduced, against torch's kernel).
# Each such sum differs by a few ulps (float32 eps = 1.2e-7, relative), and SGD with momentum
# 0.9 carries the differences through the 5 steps. Seen: at most 2.2e-7 absolute (conv1.weight,
# whose elements are up to 0.42; most tensors 1e-8 to 1e-7), on parameters that the training
# moved by 0.07-0.28. ATOL is 10x that largest difference, RTOL float32's default: still 3e-5 of
# how far the parameters moved, and 5e4 times below what the controls move (0.1 and 0.2).
# (deform.bias moves by ~1e-8 only: bn2 cancels any per-channel constant, so its gradient is
# zero up to rounding.)
RTOL, ATOL = 1.3e-6, 2e-6


class _AllReduceSum(torch.autograd.Function):
    """Sum over the processes, differentiable: the backward sums the incoming gradients over the
    processes too (every process's loss depends on the sum)."""

    @staticmethod
    def forward(ctx, t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class GlobalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training-mode statistics are those of the global batch (all processes'
    samples), computed by all-reduced sums; running statistics updated as torch updates them
    (unbiased variance). Each process must hold the same number of samples."""

    def forward(self, x):
        if not self.training or not (dist.is_available() and dist.is_initialized()):
            return super().forward(x)
        assert self.momentum is not None and self.track_running_stats
        count = x.shape[0] * x.shape[2] * x.shape[3] * dist.get_world_size()
        mean = _AllReduceSum.apply(x.sum((0, 2, 3))) / count
        d = x - mean[None, :, None, None]
        var = _AllReduceSum.apply((d * d).sum((0, 2, 3))) / count
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
            self.running_var.mul_(1 - self.momentum).add_(var * (count / (count - 1)), alpha=self.momentum)
        out = d * torch.rsqrt(var + self.eps)[None, :, None, None]
        if self.affine:
            out = out * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return out


class Net(nn.Module):
    """Seed 001's network, with deformconv.torch.DeformConv2d as its deformable layer."""

    def __init__(self, norm=nn.BatchNorm2d):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = norm(8, affine=False)
        self.offset = nn.Conv2d(8, 18, 3, bias=False)
        self.deform = dct.DeformConv2d(8, 16, 3, padding=0)
        self.bn2 = norm(16, affine=False)
        self.fc = nn.Linear(576, 10)

    def forward(self, x):
        x = F.relu(self.bn1(F.max_pool2d(self.conv1(x), 2)))
        x = self.deform(x, self.offset(x))
        x = F.relu(self.bn2(F.max_pool2d(x, 2)))
        return self.fc(x.flatten(1))


def batches():
    """``STEPS`` global batches of random 28x28 images and labels (the same in every process)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, GLOBAL_BATCH, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (STEPS, GLOBAL_BATCH), generator=g)
    return x, y


def train(model, step_model, xs, ys, sync=lambda: nullcontext()):
    """``STEPS`` SGD steps of ``model``'s parameters; ``step_model`` is what the batches go
    through (the model or its DDP wrapper), ``sync()`` the context of each forward + backward."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        with sync():
            F.cross_entropy(step_model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def worker(rank, world, store, workdir):
    """One DDP process: every variant's training from ``init.pt``, results to ``WORKDIR``."""
    torch.set_num_threads(1)  # deformconv.torch runs on PyTorch's threads
    deformconv.set_num_threads(1)  # and the numpy API / use_openmp(False) on its own pool
    workdir = Path(workdir)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        init = torch.load(workdir / "init.pt")
        xs, ys = batches()
        per = GLOBAL_BATCH // world
        xs, ys = xs[:, rank * per : (rank + 1) * per], ys[:, rank * per : (rank + 1) * per]
        for variant in VARIANTS:
            model = Net(nn.BatchNorm2d if variant == "local_bn" else GlobalBatchNorm2d)
            model.load_state_dict(init)
            ddp = nn.parallel.DistributedDataParallel(model)
            sync = ddp.no_sync if variant == "no_allreduce" else nullcontext
            state = train(model, ddp, xs, ys, sync)
            torch.save(state, workdir / f"{variant}-{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_workers(tmp_path):
    """Starts the ``WORLD`` worker processes and waits for them, at most until `DEADLINE_S`."""
    pkg_root = str(Path(deformconv.__file__).resolve().parents[1])  # the deformconv we test
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RAYON_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # this machine only
    store = tmp_path / "store"  # gloo's rendezvous: a FileStore, no port to pick
    procs, logs = [], []
    try:
        for rank in range(WORLD):
            log = open(tmp_path / f"worker-{rank}.log", "w+")
            logs.append(log)
            cmd = [sys.executable, __file__, "--worker", str(rank), str(WORLD), str(store), str(tmp_path)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + DEADLINE_S
        timed_out = False
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break  # one failed: the other would wait for it until gloo's timeout
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = []
    for rank, log in enumerate(logs):
        log.seek(0)
        outputs.append(f"--- worker {rank} (exit {procs[rank].returncode}) ---\n{log.read()[-4000:]}")
        log.close()
    report = "\n".join(outputs)
    assert not timed_out, f"the workers were still running after {DEADLINE_S} s: killed\n{report}"
    assert all(p.returncode == 0 for p in procs), report


def max_diff(a, b):
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_ddp_training_matches_a_single_process(tmp_path):
    """5 SGD steps (momentum 0.9) of seed 001's network on 16 random 28x28 images a step: DDP over
    2 gloo processes, 8 images each, against one process on all 16, with BatchNorm on the global
    batch in both (see the module's docstring); every parameter and BN buffer must agree within
    f32 rounding, both ranks must hold the same bits, and the two controls must not agree."""
    torch.manual_seed(0)
    init = Net().state_dict()
    torch.save(init, tmp_path / "init.pt")
    model = Net()
    model.load_state_dict(init)
    xs, ys = batches()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker: the reference's rounding as theirs
    try:
        reference = train(model, model, xs, ys)
    finally:
        torch.set_num_threads(threads)
    assert max_diff(reference, init) > 1e-3, "the training moves the parameters"

    run_workers(tmp_path)
    got = {(v, r): torch.load(tmp_path / f"{v}-{r}.pt") for v in VARIANTS for r in range(WORLD)}

    ddp = got["ddp", 0]
    for k in ddp:
        assert torch.equal(ddp[k], got["ddp", 1][k]), f"{k}: the ranks disagree"
    print(f"max |DDP - single process| over parameters and buffers: {max_diff(ddp, reference):.3g}")
    for k in reference:
        torch.testing.assert_close(ddp[k], reference[k], rtol=RTOL, atol=ATOL, msg=lambda m, k=k: f"{k}: {m}")

    for variant in ("no_allreduce", "local_bn"):
        d = max_diff(got[variant, 0], reference)
        print(f"control {variant}: max |difference| {d:.3g}")
        assert d > 1000 * ATOL, f"{variant}: the test cannot tell it from DDP ({d:.3g})"


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    rank, world, store, workdir = sys.argv[2:]
    worker(int(rank), int(world), store, workdir)
