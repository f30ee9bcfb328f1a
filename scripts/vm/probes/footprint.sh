#!/usr/bin/env bash
# Builds footprint.c on the host and runs it in the VM on rxe0 (and siw0 with --siw):
# what a round trip's code and data footprint costs under TCG, next to the verbs path itself.
#   scripts/vm/probes/footprint.sh [ITERS]
# Needs scripts/vm/setup.sh done (libibverbs-dev, the VM). Output: one line per footprint.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${RPC_PROBE_OUT:-/tmp/rpc-probes}"
mkdir -p "$out"
# 4096 distinct small functions (a call to each is a fresh piece of code for the emulator).
python3 - "$out/gen.h" <<'PY'
import sys
n = 4096
with open(sys.argv[1], "w") as f:
    for i in range(n):
        f.write(f"__attribute__((noinline)) static long g{i}(long x) {{ x ^= {i * 2654435761 % 100000}L; x += x >> {i % 13 + 1}; return x * {i % 7 + 3}; }}\n")
    f.write("static long (*const gfn_table[%d])(long) = {%s};\n" % (n, ",".join(f"g{i}" for i in range(n))))
PY
gcc -O2 -I"$out" -o "$out/footprint" "$here/footprint.c" -libverbs
iters="${1:-2000}"
"$here/../run.sh" --timeout 600 --rw "$out" -- bash -c "$out/footprint rxe0 pages $iters; $out/footprint rxe0 code $iters"
