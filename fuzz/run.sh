#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 60) starting from the committed seed corpus
# (fuzz/corpus/TARGET). New inputs go to a scratch directory, so the tree stays clean.
# A finding makes libFuzzer exit non-zero and leaves the input under fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# cargo-fuzz needs nightly-only sanitizer flags; the stable toolchain accepts them with this.
export RUSTC_BOOTSTRAP=1
# -O: optimised, -a: with debug assertions (the kernels' index invariants are checked).
cargo fuzz build -O -a
for target in shapes values files; do
  scratch=$(mktemp -d)
  mkdir -p "corpus/$target"
  echo "fuzz: $target for ${secs}s"
  log="$scratch.log"
  status=0
  # The file reader's seeds are whole npz files (golden cases up to 48 KiB).
  max_len=4096
  [ "$target" = files ] && max_len=65536
  cargo fuzz run -O -a "$target" "$scratch" "corpus/$target" -- \
    -max_total_time="$secs" -rss_limit_mb=4096 -max_len="$max_len" -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|Done|INFO: seed corpus|#[0-9]+ *DONE)' "$log" || true
  if [ "$status" -ne 0 ]; then tail -n 60 "$log"; fi
  rm -f "$log"
  rm -rf "$scratch"
  if [ "$status" -ne 0 ]; then
    echo "fuzz: $target found a failure (exit $status); see fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
echo "fuzz: no findings"
