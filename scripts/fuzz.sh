#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a bounded time each.
#
#   scripts/fuzz.sh                      every target, FUZZ_SECS (default 30) seconds each
#   scripts/fuzz.sh client_proto         only the targets named
#   FUZZ_SECS=3600 scripts/fuzz.sh server_proto    a long run (an hour) of one target
#   FUZZ_SECS=28800 scripts/fuzz.sh      a long run of everything (8 h per target: start it at night)
#
# Targets: proto_decode client_proto server_proto tcp_reader tcp_wire rdma_hello (see fuzz/README.md).
# Each run starts from fuzz/corpus/<target> (kept between local runs, not checked in) and the
# checked-in seeds in fuzz/seeds/<target>. A crash leaves its input in fuzz/artifacts/<target>/;
# replay it with `cargo +nightly fuzz run <target> <file>` or, from fuzz/, print it with
# `cargo run --example show -- <target> <file>`. Any crash fails the script (exit 1).
#
# Needs a nightly toolchain under rustup (cargo-fuzz builds with sanitizers); cargo-fuzz itself is
# installed from crates.io when missing. Without nightly the script says loudly that fuzzing did
# not run and exits 0. The fuzz crate's own tests (harness, seed encoder, kept regressions) run
# on the default toolchain either way, so that the crate keeps building outside the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${FUZZ_SECS:-30}"
tc="${FUZZ_TOOLCHAIN:-nightly}" # a dated nightly (nightly-2026-05-01) pins the fuzz build
all=(proto_decode client_proto server_proto tcp_reader tcp_wire rdma_hello)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

banner() {
    printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
    printf '!!! FUZZING DID NOT RUN: %s\n' "$1"
    printf '!!! Only the fuzz crate'"'"'s tests (harness, seeds, kept regressions) ran.\n'
    printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
}

echo "fuzz crate tests (default toolchain; the workspace's target/ so that its build is reused)"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" cargo test --manifest-path fuzz/Cargo.toml --lib

if ! command -v rustup >/dev/null 2>&1 || ! RUSTUP_AUTO_INSTALL=0 rustup run "$tc" rustc --version >/dev/null 2>&1; then
    banner "no $tc toolchain (rustup toolchain install $tc)"
    exit 0
fi
if ! cargo "+$tc" fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz from crates.io"
    cargo "+$tc" install cargo-fuzz --locked
fi

echo "building the fuzz targets (nightly, release, address sanitizer)"
cargo "+$tc" fuzz build -O

failed=()
summary=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    log="fuzz/artifacts/$t.log"
    mkdir -p fuzz/artifacts
    echo "fuzzing $t for ${secs}s"
    status=0
    # -timeout: an input that runs 10 s is a hang, reported like a crash. The outer timeout only
    # guards against libFuzzer itself not stopping.
    timeout "$((secs + 120))" cargo "+$tc" fuzz run -O "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 runs in \2 s/p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [ "$status" -ne 0 ]; then
        failed+=("$t")
        summary+=("$(printf '%-14s FAILED (exit %s), log %s' "$t" "$status" "$log")")
        grep -E "panicked at|^(thread|SUMMARY|ERROR|==[0-9]+==)|Test unit written|^Base64" -A1 "$log" | head -20 || true
    else
        summary+=("$(printf '%-14s ok: %s, %s exec/s' "$t" "${runs:-?}" "${rate:-?}")")
    fi
done

printf '\nfuzz summary (%ss per target):\n' "$secs"
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz targets that crashed: ${failed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
    exit 1
fi
