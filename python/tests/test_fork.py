"""deformconv in fork children: a process that has computed, then forks, computes in the child
the same bits as in the parent, through the numpy API and the torch op, whatever the parent
computed on: the crate's default pool, the pool of `deformconv.set_num_threads`, or PyTorch's
OpenMP team (libgomp's, which a fork child cannot use: there the op computes on deformconv's
pool).

The threads of a thread pool do not survive ``fork()``: a child queuing work for the pool its
parent used would wait forever for threads that exist only in the parent (multiprocessing's
default start method on Linux, ``DataLoader`` workers, gunicorn and celery workers). Each case
therefore computes in the parent first (so that every pool involved has been started), then in
children: a bare ``os.fork()``, ``DataLoader`` workers and a ``multiprocessing`` pool. Before
the pools were made per process, every case here hung in the child except where no pool of the
parent's was involved.

Every child is bounded, so that a hang fails its test within about `TIMEOUT_S` seconds instead of
blocking the suite: a bare child is killed by ``SIGALRM`` (the parent also stops waiting for it),
``DataLoader`` has ``timeout=``, and the ``multiprocessing`` pool's results are awaited with one.
"""

import contextlib
import multiprocessing
import os
import pickle
import select
import signal
import time
import traceback

import numpy as np
import pytest

import deformconv

# The longest a child may take; a call here takes milliseconds.
TIMEOUT_S = 20


def problem(seed=0, dtype=np.float32):
    """A small deformable problem with a mask and a bias, and its output gradient."""
    rng = np.random.default_rng(seed)
    return dict(
        input=rng.standard_normal((2, 4, 7, 6)).astype(dtype),
        offset=(2 * rng.standard_normal((2, 18, 5, 4))).astype(dtype),
        weight=rng.standard_normal((3, 4, 3, 3)).astype(dtype),
        bias=rng.standard_normal(3).astype(dtype),
        mask=rng.uniform(-0.5, 1.5, (2, 9, 5, 4)).astype(dtype),
        grad_out=rng.standard_normal((2, 3, 5, 4)).astype(dtype),
    )


def numpy_api(seed=0):
    """The numpy API's forward and every gradient on `problem` ``seed``."""
    p = problem(seed)
    out = deformconv.deform_conv2d(p["input"], p["offset"], p["weight"], p["bias"], mask=p["mask"])
    grads = deformconv.deform_conv2d_backward(p["grad_out"], p["input"], p["offset"], p["weight"], mask=p["mask"])
    return [out, *grads]


def torch_op(seed=0):
    """The torch op's forward and every gradient (autograd) on `problem` ``seed``, as numpy."""
    import torch

    import deformconv.torch as dct

    p = {k: torch.from_numpy(v) for k, v in problem(seed).items()}
    leaves = [p[k].requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")]
    x, off, w, b, m = leaves
    out = dct.deform_conv2d(x, off, w, b, mask=m)
    grads = torch.autograd.grad(out, leaves, p["grad_out"])
    return [t.detach().numpy() for t in (out, *grads)]


def assert_bitwise(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        if b is None:
            assert a is None, i
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert a.tobytes() == b.tobytes(), f"result {i} differs from the parent's"


def in_fork_child(work):
    """``work()`` run in an ``os.fork()`` child, its result pickled back through a pipe; fails
    (and kills the child) when the child raises, dies or takes longer than `TIMEOUT_S`."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang in native code still ends
            signal.alarm(TIMEOUT_S)
            try:
                payload, code = pickle.dumps(("ok", work())), 0
            except BaseException:
                payload = pickle.dumps(("error", traceback.format_exc()))
            with os.fdopen(w, "wb") as f:
                f.write(payload)
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + TIMEOUT_S + 5
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"the fork child did not finish within {TIMEOUT_S + 5} s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        with contextlib.suppress(ProcessLookupError):
            if not chunks:
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        hint = f" (a hang: the {TIMEOUT_S} s alarm)" if sig == "SIGALRM" else ""
        pytest.fail(f"the fork child was killed by {sig}{hint}")
    kind, value = pickle.loads(b"".join(chunks))
    assert kind == "ok", f"the fork child raised:\n{value}"
    return value


@pytest.fixture(params=[0, 2], ids=["default-pool", "set_num_threads(2)"])
def pool_threads(request):
    """The numpy API on deformconv's default pool (``set_num_threads(0)``) and on a pool of two
    chosen by `deformconv.set_num_threads`; the suite's two threads restored after."""
    deformconv.set_num_threads(request.param)
    try:
        yield request.param
    finally:
        deformconv.set_num_threads(2)


@pytest.fixture(params=[2, 1], ids=["omp2", "omp1"])
def torch_threads(request):
    """The torch op on PyTorch's OpenMP team of two, and of one (a pool of one thread of
    deformconv's); PyTorch's thread count restored after."""
    torch = pytest.importorskip("torch")
    import deformconv.torch as dct

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    try:
        assert dct.use_openmp(True), "libgomp is loaded with torch"
        yield request.param
    finally:
        torch.set_num_threads(before)


def test_numpy_api_in_a_fork_child(pool_threads):
    want = numpy_api()
    got = in_fork_child(numpy_api)
    assert_bitwise(got, want)
    # The parent's pool still works after the fork.
    assert_bitwise(numpy_api(), want)


def test_torch_op_in_a_fork_child(torch_threads, pool_threads):
    """The parent's OpenMP team (libgomp's) does not survive the fork either: the child
    computes on deformconv's pool instead, with the same bits."""
    want = torch_op()
    got = in_fork_child(torch_op)
    assert_bitwise(got, want)
    assert_bitwise(torch_op(), want)


def test_numpy_api_in_fork_children_of_fork_children(pool_threads):
    """A child's pool is its own, rebuilt again in its children."""
    want = numpy_api()
    got = in_fork_child(lambda: (numpy_api(), in_fork_child(numpy_api)))
    assert_bitwise(got[0], want)
    assert_bitwise(got[1], want)


class NumpyDataset:
    """Sample ``i``: the numpy API's results on `problem` ``i``."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return numpy_api(i)


class TorchDataset(NumpyDataset):
    """Sample ``i``: the torch op's results (forward and backward) on `problem` ``i``."""

    def __getitem__(self, i):
        return torch_op(i)


def load_in_workers(dataset):
    """Every sample of ``dataset`` through a ``DataLoader`` of two fork workers."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=TIMEOUT_S,
    )
    return [[t.numpy() for t in sample] for sample in loader]


def test_dataloader_fork_workers_call_the_numpy_api(pool_threads):
    pytest.importorskip("torch")
    dataset = NumpyDataset()
    want = [dataset[i] for i in range(len(dataset))]
    got = load_in_workers(dataset)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_bitwise(g, w)


def test_dataloader_fork_workers_call_the_torch_op(torch_threads):
    """The workers run PyTorch on one thread (``DataLoader`` sets it), so the op's team of one:
    deformconv's one-thread pool, rebuilt in each worker."""
    dataset = TorchDataset()
    want = [dataset[i] for i in range(len(dataset))]
    got = load_in_workers(dataset)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_bitwise(g, w)


def test_multiprocessing_fork_pool_calls_the_numpy_api(pool_threads):
    seeds = range(6)
    want = [numpy_api(s) for s in seeds]
    with multiprocessing.get_context("fork").Pool(2) as workers:
        try:
            got = workers.map_async(numpy_api, seeds).get(timeout=TIMEOUT_S)
        except multiprocessing.TimeoutError:
            workers.terminate()
            pytest.fail(f"the fork pool's workers did not finish within {TIMEOUT_S} s")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_bitwise(g, w)
