#!/usr/bin/env python3
"""Old against new, per backend and element type: times `examples/isa_probe.rs` built from a
baseline revision and from the working tree, alternating the two binaries in one sitting.

    python3 benches/isa_table.py --baseline b890826 [--rounds 5] [--workloads W1,W2,W4]
        [--caps avx512,avx2,portable,scalar] [--dtypes f32,f64] [--threads 2]
        [--old-cap portable=scalar]

The baseline is checked out in a temporary git worktree and built in its own target
directory; if it predates `isa_probe`, today's probe is copied in (it uses only the public API
and `deformconv::workloads`). Caps the CPU lacks are skipped (`/proc/cpuinfo`). Each run of a
binary prints, per part, the best of `ITERS` calls (W1 30, others 3-5); a cell of the table is
the median over the rounds of those, in ms, with `new / old` (below 1 is faster). Run it on an
otherwise idle machine: the rounds alternate so that drift hits both binaries alike.

`--old-cap NEW=OLD` runs the baseline under another cap where it lacks one: a baseline older
than the portable backend ignores `DEFORMCONV_ISA=portable` and runs its best path, so compare
that row against its scalar path with `--old-cap portable=scalar`.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS = {"W1": 30, "W2": 5, "W2s": 5, "W3": 5, "W4": 3}
LINE = re.compile(r"^(\S+) (f32|f64): forward ([\d.]+) ms .* full backward ([\d.]+) ms")


def cpu_caps():
    """The `DEFORMCONV_ISA` caps this CPU can run, best first."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        flags = ""
    caps = []
    if re.search(r"\bavx512f\b", flags):
        caps.append("avx512")
    if re.search(r"\bavx2\b", flags) and re.search(r"\bfma\b", flags):
        caps.append("avx2")
    return caps + ["portable", "scalar"]


def build(tree, target_dir):
    """Builds `isa_probe` in `tree`, returns the binary's path."""
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir)
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--example", "isa_probe"],
        cwd=tree,
        env=env,
        check=True,
    )
    return os.path.join(target_dir, "release", "examples", "isa_probe")


def run(binary, cap, dtype, workload, threads):
    env = dict(
        os.environ,
        DEFORMCONV_ISA=cap,
        RAYON_NUM_THREADS=str(threads),
        DTYPE=dtype,
        ITERS=str(ITERS.get(workload, 3)),
        PARTS="fwd,bwd",
    )
    out = subprocess.run(
        [binary, workload], env=env, check=True, capture_output=True, text=True
    ).stdout
    m = LINE.search(out)
    if not m:
        sys.exit(f"unexpected isa_probe output: {out!r}")
    return float(m.group(3)), float(m.group(4))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default="W1,W2,W4")
    ap.add_argument("--caps", default=",".join(cpu_caps()))
    ap.add_argument("--dtypes", default="f32,f64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--old-cap", action="append", default=[], metavar="NEW=OLD")
    args = ap.parse_args()
    caps = [c for c in args.caps.split(",") if c in cpu_caps()]
    old_cap = dict(m.split("=", 1) for m in args.old_cap)
    work = tempfile.mkdtemp(prefix="isa_table_")
    tree = os.path.join(work, "baseline")
    try:
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", tree, args.baseline],
            cwd=ROOT,
            check=True,
        )
        probe = os.path.join(tree, "examples", "isa_probe.rs")
        if not os.path.exists(probe):
            shutil.copy(os.path.join(ROOT, "examples", "isa_probe.rs"), probe)
        print(f"building {args.baseline} and the working tree ...", file=sys.stderr)
        old = build(tree, os.path.join(work, "target"))
        new = build(ROOT, os.path.join(ROOT, "target"))
        times = defaultdict(list)
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
            for cap in caps:
                for dtype in args.dtypes.split(","):
                    for wl in args.workloads.split(","):
                        for name, binary, as_cap in (
                            ("old", old, old_cap.get(cap, cap)),
                            ("new", new, cap),
                        ):
                            fwd, bwd = run(binary, as_cap, dtype, wl, args.threads)
                            times[(cap, dtype, wl, "forward", name)].append(fwd)
                            times[(cap, dtype, wl, "full backward", name)].append(bwd)
        print(
            f"\n{args.baseline} (old) against the working tree (new): ms, median of "
            f"{args.rounds} alternating rounds, {args.threads} threads\n"
        )
        for new_cap, as_cap in old_cap.items():
            print(f"The old column of `{new_cap}` ran under `DEFORMCONV_ISA={as_cap}`.\n")
        print("| backend | type | workload | part | old | new | new / old |")
        print("|---|---|---|---|---|---|---|")
        for cap in caps:
            for dtype in args.dtypes.split(","):
                for wl in args.workloads.split(","):
                    for part in ("forward", "full backward"):
                        o = statistics.median(times[(cap, dtype, wl, part, "old")])
                        n = statistics.median(times[(cap, dtype, wl, part, "new")])
                        row = f"| {cap} | {dtype} | {wl} | {part} | {o:.3g} | {n:.3g} |"
                        print(f"{row} {n / o:.2f} |")
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=False
        )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
