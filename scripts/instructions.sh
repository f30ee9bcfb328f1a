#!/usr/bin/env bash
# Instructions per call on the small-call path, counted by callgrind: repeatable for the same
# binary and inputs whatever else the machine is doing, unlike wall-clock figures on these shared
# 2-vCPU machines. Each row runs rpc-bench's in-process 32 B echo (client, server and harness in one
# process, current-thread runtime) twice under callgrind, with N1 and N2 measured calls after the
# same warm-up, and prints (I(N2) - I(N1)) / (N2 - N1): the instructions one more call costs, with
# start-up, warm-up and reporting cancelled out. Both sides and the harness's own timing count.
# Then the same difference for the atomic read-modify-write instructions among them (see
# scripts/atomics.py), and last the 64-byte lines of code one call runs (scripts/footprint.py: at
# one call in flight a call runs almost all of its code once, so its code does not stay in the
# 32 KiB instruction cache between calls and every line costs a fetch from further out). After the
# table, each row's instructions by layer (scripts/layers.py: the RPC layers, transport, tokio,
# harness, ...).
#
#   scripts/instructions.sh [--bin PATH] [--calls N1,N2]
#
# --bin: the rpc-bench to count (default: builds `cargo build --release -p benches --bin rpc-bench`,
# the workspace's release profile, fat LTO). --calls: default 5000,20000 (about 30 s in all; the
# figures move by well under 1% with larger counts). Needs valgrind: without it the script says so
# loudly and exits 0. CI runs it after the VM suite, on the suite's release build; the figures are
# recorded in BENCHMARKS.md ("Instructions per call").
set -euo pipefail
cd "$(dirname "$0")/.."

bin=""
calls="5000,20000"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) bin="${2:?--bin takes a path}"; shift 2 ;;
        --calls) calls="${2:?--calls takes N1,N2}"; shift 2 ;;
        *) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2 ;;
    esac
done
n1="${calls%,*}"
n2="${calls#*,}"
if ! [[ "$n1" =~ ^[0-9]+$ && "$n2" =~ ^[0-9]+$ ]] || (( n2 <= n1 )); then
    echo "instructions.sh: --calls takes N1,N2 with N2 > N1" >&2
    exit 2
fi

if ! command -v valgrind >/dev/null 2>&1; then
    printf '\n!!! INSTRUCTION COUNTS DID NOT RUN: valgrind is missing (apt-get install valgrind). !!!\n'
    exit 0
fi
if [[ -z "$bin" ]]; then
    cargo build --locked --release -p benches --bin rpc-bench
    bin=target/release/rpc-bench
fi
[[ -x "$bin" ]] || { echo "instructions.sh: no executable $bin" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Atomic read-modify-write instructions are counted too (scripts/atomics.py: callgrind's
# per-instruction counts at the addresses objdump shows with a `lock` prefix or a memory `xchg`):
# each costs about 20 cycles even uncontended, so two builds with the same instruction count can
# differ in time by their atomics. Without python3 or objdump that column says n/a; without
# python3 the lines say n/a too.
python=yes
command -v python3 >/dev/null 2>&1 || python=no
atomics="$python"
command -v objdump >/dev/null 2>&1 || atomics=no

# The end-of-run report (`benches::report::Point::new`: the percentiles, read from the latency
# histogram) is not counted: its cost follows the spread of the latencies recorded, so it does not
# cancel out between the two runs, and over verbs it moved a client's count by up to ~150 per call.
# (--collect-atstart=yes after --toggle-collect: that option alone starts with collection off.)
NOT_COUNTED=(--toggle-collect='benches::report::Point::new' --collect-atstart=yes)

# count SYSTEM LISTEN OUTSTANDING CALLS OUT: the instructions callgrind counted for one run (its
# profile written to OUT), and the atomic instructions among them (or n/a).
count() {
    local out="$5"
    valgrind --tool=callgrind --dump-instr=yes "${NOT_COUNTED[@]}" --callgrind-out-file="$out" "$bin" run --system "$1" \
        --listen "$2" --in-process --workload echo --sizes 32 --outstanding "$3" --iters "$4" \
        --warmup 1000 --no-plots --out "$work/bench" >"$work/log" 2>&1 || { cat "$work/log" >&2; return 1; }
    local a=n/a
    [[ "$atomics" == yes ]] && a="$(python3 scripts/atomics.py "$out")"
    echo "$(sed -n 's/^summary: //p' "$out") $a"
}

echo "instructions per 32 B echo call, user space only (callgrind; (I($n2 calls) - I($n1 calls)) / $((n2 - n1)); $bin)"
printf '%-13s %-10s %10s %14s %16s %16s %14s\n' system transport "in flight" "instr/call" "I($n2 calls)" \
    "atomics/call" "lines/call"
# tarpc and the raw tokio TCP ping-pong are `rpc-bench compare`'s peers, in the same binary (the
# raw ping-pong runs one call at a time); raw-transport is a ping-pong straight on rpc-transport's
# connections, rpc-core's floor on the same transport. Over tcp the kernel's share (system calls,
# loopback) is not counted: these rows compare what each system runs in user space.
by_layer=()
for row in "rpc-core mem://cg 1" "rpc-core tcp 1" "rpc-core tcp 64" "tarpc tcp 1" "tarpc tcp 64" \
    "raw-tcp tcp 1" "raw-transport mem://cg 1" "raw-transport tcp 1"; do
    read -r system listen outstanding <<<"$row"
    read -r i1 a1 <<<"$(count "$system" "$listen" "$outstanding" "$n1" "$work/short.out")"
    read -r i2 a2 <<<"$(count "$system" "$listen" "$outstanding" "$n2" "$work/long.out")"
    per=$(( (i2 - i1) / (n2 - n1) ))
    atomic_per=n/a
    [[ "$a1" != n/a ]] && atomic_per="$(awk -v a="$a1" -v b="$a2" -v n=$((n2 - n1)) 'BEGIN { printf "%.1f", (b - a) / n }')"
    lines=n/a
    layers=n/a
    if [[ "$python" == yes ]]; then
        lines="$(python3 scripts/footprint.py "$work/short.out" "$work/long.out" $((n2 - n1)))"
        layers="$(python3 scripts/layers.py "$work/short.out" "$work/long.out" $((n2 - n1)))"
    fi
    printf '%-13s %-10s %10s %14s %16s %16s %14s\n' "$system" "${listen%%:*}" "$outstanding" "$per" "$i2" \
        "$atomic_per" "$lines"
    by_layer+=("$(printf '  %-13s %-4s %3s  %s' "$system" "${listen%%:*}" "$outstanding" "${layers//,/, }")")
done

# The same instructions by layer (scripts/layers.py): client, server and harness together (one
# process), so that a change shows in the layer it changed.
echo
echo "the same by layer (instructions per call; client, server and harness in one process; scripts/layers.py)"
printf '%s\n' "${by_layer[@]}"

# The critical path of a round trip when each side has a CPU of its own: a 32 B echo over tcp with
# the server in a child process, each process's run cut by callgrind where it returns from
# `epoll_wait` (a message arrived) and where it calls `send` (its next message leaves); see
# scripts/critical_path.py. rpc-core, then its transport alone (raw-transport). 300 calls after 100
# of warm-up: the stretches repeat exactly from call to call, so their medians are the figures.
# Each side's stretch from an arrival to its send is split by layer too (as layers.py splits a
# whole call): the RPC layers' share of a round trip when each side has a CPU of its own. For
# rpc-core, also the 12 functions of each side's stretch that cost the most: where a leaner
# small-call path would cut.
echo
echo "instructions from a message's arrival to the next message out, per side (tcp, server in a child process; scripts/critical_path.py)"
for system in rpc-core raw-transport; do
    if [[ "$python" != yes ]]; then
        echo "  n/a (python3 is missing)"
        break
    fi
    rm -rf "$work/cp" && mkdir -p "$work/cp"
    valgrind --tool=callgrind --dump-instr=yes --trace-children=yes --dump-after=epoll_wait --dump-before=send \
        --callgrind-out-file="$work/cp/cp-%p.out" "$bin" run --system "$system" --listen tcp --workload echo \
        --sizes 32 --iters 300 --warmup 100 --no-plots --out "$work/bench" >"$work/log" 2>&1 ||
        { cat "$work/log" >&2; exit 1; }
    echo " $system:"
    functions=()
    [[ "$system" == rpc-core ]] && functions=(--by-function 12)
    python3 scripts/critical_path.py "$work/cp" --by-layer "${functions[@]}"
done
