#!/usr/bin/env bash
# A profile-guided (PGO) build of rpc-bench, the benchmark harness: an instrumented build, training
# runs, then the optimised build. For measuring what PGO gives a service built on the framework;
# CI and the plain rows of BENCHMARKS.md use the release profile (fat LTO) alone.
#
#   scripts/pgo.sh [--vm]
#
# Training, on this host: `rpc-bench compare` (rpc-core, tarpc and the raw TCP ping-pong: every peer
# of the comparison is trained, so it stays fair) and rpc-core echo over mem and tcp (32 B to 1 MiB,
# 1 and 64 calls in flight). With --vm the binary has the rdma backend and is also trained in the
# project's VM (scripts/vm/setup.sh must have run): echo over rxe0 and then siw0, busy-polling and
# event-driven (scripts/vm/pgo-train.sh).
#
# Output: target/pgo/release/rpc-bench. Takes ~6 min on 2 cores, ~7 min with --vm. Needs the
# toolchain's llvm-profdata: installs rustup's llvm-tools component if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

vm=false
case "${1:-}" in
    --vm) vm=true ;;
    "") ;;
    *) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
esac

step() { printf '\n==== pgo: %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

sysroot="$(rustc --print sysroot)"
host="$(rustc -vV | sed -n 's/^host: //p')"
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
if [[ ! -x "$profdata" ]]; then
    step "installing rustup's llvm-tools (llvm-profdata)"
    rustup component add llvm-tools
fi

features=()
$vm && features=(--features benches/rdma)
data="$PWD/target/pgo-data"
rm -rf "$data"
mkdir -p "$data/build" "$data/train"

build() { # TARGET_DIR RUSTFLAGS
    CARGO_TARGET_DIR="$1" RUSTFLAGS="${RUSTFLAGS:-} $2" \
        cargo build --locked --release -p benches --bin rpc-bench "${features[@]}"
}

step "instrumented build (target/pgo-gen)"
# Build scripts and proc macros are instrumented too and write profiles as they run: not ours.
LLVM_PROFILE_FILE="$data/build/%p-%m.profraw" build target/pgo-gen "-Cprofile-generate=$data/build"
bin="$PWD/target/pgo-gen/release/rpc-bench"

step "training on this host: compare, then echo over mem and tcp"
export LLVM_PROFILE_FILE="$data/train/%p-%m.profraw"
"$bin" compare --out "$data/out" --no-plots
"$bin" run --listen tcp --listen mem --workload echo --sizes 32,4K,1M --outstanding 1,64 --duration 1 \
    --no-plots --out "$data/out"
unset LLVM_PROFILE_FILE
if $vm; then
    step "training in the VM: echo over rxe0 and siw0"
    scripts/vm/run.sh --timeout 900 --rw "$data" -- bash scripts/vm/pgo-train.sh "$bin" "$data/train"
fi

step "merging $(find "$data/train" -name '*.profraw' | wc -l) profiles"
"$profdata" merge -o "$data/merged.profdata" "$data/train"/*.profraw

step "optimised build (target/pgo)"
build target/pgo "-Cprofile-use=$data/merged.profdata"
echo "built target/pgo/release/rpc-bench (profile-guided; features: ${features[*]:-none})"
