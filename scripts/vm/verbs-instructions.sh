#!/usr/bin/env bash
# Instructions per small call over real verbs, per process: the user-space work (ours, libibverbs and
# the provider's) that one 32 B echo round trip costs the client and the server on DEV. Runs INSIDE
# the VM (e.g. `scripts/vm/run.sh -- scripts/vm/verbs-instructions.sh target/release/rpc-bench rxe0`;
# the rdma suite runs it per device, on its release build).
#
#   scripts/vm/verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM]
#
# SYSTEM: rpc-bench's --system (default rpc-core; raw-transport counts the transport alone).
#
# Wall-clock figures under TCG move by up to 4x between runs (the suite's rounds); these move by
# ~1.5% (how many wake-ups find the next completion already there): callgrind counts the
# instructions each process runs, whatever the machine is doing. Under TCG a guest instruction
# costs several nanoseconds, so on the VM the verbs path's round trip against perftest's is mostly
# these instructions (perftest's `ib_send_lat -e` runs ~1.7k per message and side, the provider's
# and its end-of-run sorting of the samples included; ours ~8-9k). Like scripts/instructions.sh on the host: BIN's `run` of the 32 B echo (event-driven,
# one call in flight, its server a child process) twice under callgrind (--trace-children), with N1
# and N2 measured calls after the same warm-up (default 1000,3000: about 3.5 min under TCG), and per
# process (I(N2) - I(N1)) / (N2 - N1): start-up, connection set-up, warm-up and reporting cancel out.
# Both processes' counts include the harness (the client's timing and recording of each call) and
# tokio's wake-ups on the completion channel.
#
# Then a third, shorter run (300 calls after 100 of warm-up) is cut by callgrind wherever a process
# returns from `epoll_wait` (a completion event woke it) and before each `write` (the provider's
# doorbell; on rxe the CQ's arming too), and scripts/critical_path.py takes each process's median
# stretch from a message's arrival to its next doorbell: the instructions on the way of a round trip
# when the two processes run on CPUs of their own (the server's from a request to its answer, the
# client's from an answer to the next request), and that stretch split by layer.
#
# Prints one line:
#   VERBS-INSTRUCTIONS dev=DEV client=N server=N client_lines=N server_lines=N client_layers=L server_layers=L client_path=N server_path=N client_path_layers=L server_path_layers=L secs=A,B,C,D,E
# (lines: the 64-byte lines of code run at least once per two calls, scripts/footprint.py; layers:
# the same instructions split by layer, `rpc:N,transport:N,tokio:N,provider:N,libc:N,harness:N,other:N`,
# scripts/layers.py; path, path_layers: the stretch above and its split by layer, the mean over
# its round trips; n/a without python3; secs: the seconds the N1 run, the N2 run, the scripts on
# their profiles, the split run and the script on its parts took). Without valgrind it says so loudly and exits 0; a run that fails exits non-zero.
set -euo pipefail

BIN="${1:?usage: verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM]}"
DEV="${2:?usage: verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM]}"
calls="${3:-1000,3000}"
SYSTEM="${4:-rpc-core}"
n1="${calls%,*}"
n2="${calls#*,}"
if ! [[ "$n1" =~ ^[0-9]+$ && "$n2" =~ ^[0-9]+$ ]] || ((n2 <= n1)); then
    echo "verbs-instructions.sh: N1,N2 with N2 > N1" >&2
    exit 2
fi
SERVER_IP=10.0.2.15
# How long a connection's set-up may take under callgrind (rpc-bench --setup-timeout; the
# defaults are 10 s and 5 s). The split run dumps a profile at every `epoll_wait` and `write`,
# the set-up's too: on a slow boot its connect took over 10 s, twice in a row.
SETUP_SECS=120
SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v valgrind >/dev/null 2>&1; then
    printf '\n!!! VERBS INSTRUCTION COUNTS DID NOT RUN: valgrind is missing (apt-get install valgrind). !!!\n'
    exit 0
fi
[[ -x "$BIN" ]] || { echo "verbs-instructions.sh: no executable $BIN" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# run N: one callgrind run of N measured calls; its profiles are $work/N-<pid>.out, one per process.
# The client's end-of-run report is not counted (see NOT_COUNTED in scripts/instructions.sh: its
# cost follows the latencies' spread and moved the client's count by up to ~150 per call).
run() {
    if ! RPC_RDMA_DEVICE="$DEV" valgrind --tool=callgrind --dump-instr=yes --trace-children=yes \
        --toggle-collect='benches::report::Point::new' --collect-atstart=yes \
        --callgrind-out-file="$work/$1-%p.out" "$BIN" run --system "$SYSTEM" --listen "rdma://$SERVER_IP:0" --workload echo \
        --sizes 32 --iters "$1" --warmup 500 --no-plots --setup-timeout "$SETUP_SECS" --out "$work/bench-$1" >"$work/log-$1" 2>&1; then
        cat "$work/log-$1" >&2
        echo "verbs-instructions.sh: the callgrind run of $1 calls on $DEV failed" >&2
        return 1
    fi
}

# profile N ROLE: the profile of ROLE (client: the process that ran `run`; server: its child, which
# runs `server`) in run N.
profile() {
    local f role
    for f in "$work/$1"-*.out; do
        role=client
        grep -q '^cmd: .* server ' "$f" && role=server
        if [[ "$role" == "$2" ]]; then
            echo "$f"
            return 0
        fi
    done
    echo "verbs-instructions.sh: no $2 profile from the run of $1 calls" >&2
    return 1
}

total() { sed -n 's/^summary: //p' "$1"; }

# How long each part took (the line's last field): the count's time doubled between two CI runs
# of nearly the same code, and the suite's step only showed the total.
t0=$SECONDS
run "$n1"
t1=$SECONDS
run "$n2"
t2=$SECONDS
out="VERBS-INSTRUCTIONS dev=$DEV"
for role in client server; do
    a="$(profile "$n1" "$role")"
    b="$(profile "$n2" "$role")"
    out+=" $role=$(( ($(total "$b") - $(total "$a")) / (n2 - n1) ))"
done
# each_role SCRIPT FIELD: appends " client_FIELD=C server_FIELD=S" to $out, C and S what
# scripts/SCRIPT prints for that process's two profiles (n/a without python3). It runs in this
# shell, not in a command substitution, so that a failing script stops this one (set -e).
each_role() {
    local role value
    for role in client server; do
        value=n/a
        if command -v python3 >/dev/null 2>&1; then
            value="$(python3 "$SCRIPTS/$1" "$(profile "$n1" "$role")" "$(profile "$n2" "$role")" $((n2 - n1)))"
        fi
        out+=" ${role}_$2=$value"
    done
}
each_role footprint.py lines
each_role layers.py layers
t3=$SECONDS
t4=$t3
paths=()
if command -v python3 >/dev/null 2>&1; then
    mkdir -p "$work/cp"
    if ! RPC_RDMA_DEVICE="$DEV" valgrind --tool=callgrind --dump-instr=yes --trace-children=yes --dump-after=epoll_wait \
        --dump-before=write --callgrind-out-file="$work/cp/cp-%p.out" "$BIN" run --system "$SYSTEM" --listen "rdma://$SERVER_IP:0" \
        --workload echo --sizes 32 --iters 300 --warmup 100 --no-plots --setup-timeout "$SETUP_SECS" --out "$work/bench-cp" \
        >"$work/log-cp" 2>&1; then
        cat "$work/log-cp" >&2
        echo "verbs-instructions.sh: the split callgrind run on $DEV failed" >&2
        exit 1
    fi
    t4=$SECONDS
    # "  client  <what>  N   then -> the next arrival  M   (K round trips)   by layer L" (read from
    # a here-string: the VM's init has no /dev/fd for a process substitution)
    stretches="$(python3 "$SCRIPTS/critical_path.py" "$work/cp" --send write --by-layer)"
    while read -r role rest; do
        paths+=("${role}_path=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "then") { print $(i - 1); exit } }' <<<"$rest")")
        paths+=("${role}_path_layers=$(awk '{ print $NF }' <<<"$rest")")
    done <<<"$stretches"
fi
for key in client_path server_path client_path_layers server_path_layers; do
    path="$key=n/a"
    for p in "${paths[@]}"; do [[ "$p" == "$key="* ]] && path="$p"; done
    out+=" $path"
done
echo "$out secs=$((t1 - t0)),$((t2 - t1)),$((t3 - t2)),$((t4 - t3)),$((SECONDS - t4))"
