#!/usr/bin/env python3
"""Writes this host's section of docs/performance.md from the bench commands' own output, so
the performance tables are generated, not typed: `deformconv bench` (every workload, forward and
full backward, GFLOP/s and share of the measured multiply-add peak, against our dense conv) and
`benches/peers.py` (ONNX Runtime and OpenVINO on the deployed layers and W2/W4). With
`--readme`, the peers table also becomes README.md's headline (the block between its
`<!-- performance:begin -->` and `<!-- performance:end -->` markers).

    cargo build --release && pip install target/python-wheels/deformconv-*.whl   # after python/ci.sh
    python3 benches/performance_doc.py [--no-peers] [--readme] [--threads 2]

The section is headed by the CPU (model name, family, model, vector flags) and replaced when
the script runs again on the same kind of CPU; other hosts' sections stay as they are.
"""

import argparse
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "performance.md"
README = REPO / "README.md"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
INTRO = """# Performance

Each section below is one kind of host, written by `python3 benches/performance_doc.py` on it
from the output of `deformconv bench` and `benches/peers.py` (run it again on a host to replace
its section). Every ratio in a section comes from one sitting on that host: compare ratios
across hosts, not absolute times. "% peak" is the share of the host's multiply-add peak measured
by `deformconv bench --peak` with the same backend and threads.
"""


def cpu():
    """(heading, facts) of this CPU from /proc/cpuinfo."""
    info = Path("/proc/cpuinfo").read_text()

    def field(name):
        m = re.search(rf"^{name}\s*:\s*(.*)$", info, re.M)
        return m.group(1).strip() if m else "?"

    flags = set(field("flags").split())
    has = [f for f in FLAGS if f in flags]
    heading = f"{field('model name')}, cpu family {field('cpu family')}, model {field('model')}"
    return heading, f"flags: {', '.join(has) or 'none of ' + ', '.join(FLAGS)}; {os.cpu_count()} logical CPUs"


def run(cmd, env=None):
    print("+", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def peers_markdown(out: str) -> str:
    """peers.py's output as markdown: its notes in a text block, its table as a table."""
    lines = out.strip().splitlines()
    first = next((i for i, l in enumerate(lines) if l.startswith("|")), len(lines))
    notes, table = lines[:first], lines[first:]
    return "```text\n" + "\n".join(notes).strip() + "\n```\n\n" + "\n".join(table) + "\n"


def peak(env):
    """This host's measured f32 multiply-add peak, GFLOP/s, from `deformconv bench --peak`."""
    out = run([str(REPO / "target" / "release" / "deformconv"), "bench", "--peak"], env)
    return float(re.search(r"f32 multiply-add peak: ([0-9.]+) GFLOP/s", out).group(1))


def readme_block(threads, table):
    """README's headline: the host, the command, and the peers table."""
    heading, _ = cpu()
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    commit = run(["git", "rev-parse", "--short", "HEAD"]).strip()
    rows = [l for l in table.strip().splitlines() if l.startswith("|")]
    return (
        f"{BEGIN}\nOn {heading} ({threads} threads, measured f32 multiply-add peak "
        f"{peak(env):.0f} GFLOP/s; commit {commit}), float32 forward against the CPU peers "
        f"(`python3 benches/peers.py --threads {threads}`; ms as median / minimum over rounds "
        "that alternate the systems in one process; ratios above 1: we are faster):\n\n"
        + "\n".join(rows)
        + f"\n{END}"
    )


def section(threads, peers):
    heading, facts = cpu()
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    bench = run([str(REPO / "target" / "release" / "deformconv"), "bench"], env)
    parts = [
        f"## {heading}\n",
        f"{facts}. Written {datetime.date.today().isoformat()} at commit "
        f"{run(['git', 'rev-parse', '--short', 'HEAD']).strip()}, {threads} threads.\n",
        f"`RAYON_NUM_THREADS={threads} deformconv bench` (float32):\n",
        "```text\n" + bench.strip() + "\n```\n",
    ]
    table = None
    if peers:
        table = run([sys.executable, str(REPO / "benches" / "peers.py"), "--threads", str(threads)])
        parts += [f"`python3 benches/peers.py --threads {threads}` (float32 forward):\n", peers_markdown(table)]
    return heading, "\n".join(parts), table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--readme", action="store_true", help="also write README.md's headline table")
    a = ap.parse_args()
    if a.readme and a.no_peers:
        sys.exit("--readme writes the peers table: drop --no-peers")
    heading, text, table = section(a.threads, not a.no_peers)
    doc = DOC.read_text() if DOC.exists() else INTRO
    # Sections start at "## "; this host's is replaced, the others kept in order.
    head, *sections = re.split(r"(?m)^(?=## )", doc)
    sections = [s for s in sections if not s.startswith(f"## {heading}\n")]
    DOC.write_text(head.rstrip() + "\n\n" + text.rstrip() + "\n\n" + "".join(sections).rstrip() + "\n")
    print(f"wrote the section '{heading}' of {DOC.relative_to(REPO)}", file=sys.stderr)
    if a.readme:
        readme = README.read_text()
        if BEGIN not in readme or END not in readme:
            sys.exit(f"README.md has no {BEGIN} ... {END} block")
        start, end = readme.index(BEGIN), readme.index(END) + len(END)
        README.write_text(readme[:start] + readme_block(a.threads, table) + readme[end:])
        print("wrote README.md's headline table", file=sys.stderr)


if __name__ == "__main__":
    main()
