#!/usr/bin/env bash
# Instructions per small call over real verbs, per process: the user-space work (ours, libibverbs and
# the provider's) that one 32 B echo round trip costs the client and the server on DEV. Runs INSIDE
# the VM (e.g. `scripts/vm/run.sh -- scripts/vm/verbs-instructions.sh target/release/rpc-bench rxe0`;
# the rdma suite runs it per device, on its release build).
#
#   scripts/vm/verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM] [--keep DIR]
#   scripts/vm/verbs-instructions.sh --report DIR
#
# SYSTEM: rpc-bench's --system (default rpc-core; raw-transport counts the transport alone).
# With --keep DIR it only measures: the callgrind runs' profiles go to DIR and the python scripts
# that read them are left to `--report DIR`, run where python is fast. Under TCG they took longer
# than the runs themselves (243 of 535 s on rxe0, session 56; ~3 s on the host, 80-90x less), so
# the rdma suite keeps the profiles in its directory and its summary, on the host, reports them.
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
# their profiles, the split run and the script on its parts took; with --keep, the scripts' are
# the report's, and `copied=K` the seconds the copy to DIR took). Without valgrind it says so
# loudly and exits 0; a run (or a script) that fails exits non-zero. With --keep it prints
# `VERBS-INSTRUCTIONS-KEPT dev=DEV client=N server=N dir=DIR` instead.
set -euo pipefail

SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# profile DIR N ROLE: the profile of ROLE (client: the process that ran `run`; server: its child,
# which runs `server`) in DIR's run of N calls.
profile() {
    local f role
    for f in "$1/$2"-*.out; do
        role=client
        grep -q '^cmd: .* server ' "$f" && role=server
        if [[ "$role" == "$3" ]]; then
            echo "$f"
            return 0
        fi
    done
    echo "verbs-instructions.sh: no $3 profile from the run of $2 calls in $1" >&2
    return 1
}

total() { sed -n 's/^summary: //p' "$1"; }

# counts DIR N1 N2: " client=N server=N", each process's instructions per call from DIR's two runs.
counts() {
    local role a b out=""
    for role in client server; do
        a="$(profile "$1" "$2" "$role")" || return 1
        b="$(profile "$1" "$3" "$role")" || return 1
        out+=" $role=$(( ($(total "$b") - $(total "$a")) / ($3 - $2) ))"
    done
    echo "$out"
}

# report DIR: the VERBS-INSTRUCTIONS line from the profiles in DIR (its `meta`: dev, n1, n2, the
# runs' seconds and, if they were kept, the copy's; `N-PID.out` per run; the split run's parts in
# `cp/`, if it ran). Needs python3 for all but the counts.
report() {
    local dir="$1" dev n1 n2 runs1 runs2 split copied="" t0 t1 t2 role value out stretches p path key
    # shellcheck source=/dev/null
    source "$dir/meta" # dev= n1= n2= runs1= runs2= split= [copied=]
    out="VERBS-INSTRUCTIONS dev=$dev$(counts "$dir" "$n1" "$n2")"
    t0=$SECONDS
    # " client_FIELD=C server_FIELD=S", C and S what scripts/SCRIPT prints for that process's two
    # profiles (n/a without python3). Not in a command substitution: a failing script stops this one.
    for script in footprint.py:lines layers.py:layers; do
        for role in client server; do
            value=n/a
            if command -v python3 >/dev/null 2>&1; then
                value="$(python3 "$SCRIPTS/${script%:*}" "$(profile "$dir" "$n1" "$role")" \
                    "$(profile "$dir" "$n2" "$role")" $((n2 - n1)))"
            fi
            out+=" ${role}_${script#*:}=$value"
        done
    done
    t1=$SECONDS
    local paths=()
    if command -v python3 >/dev/null 2>&1 && [[ -d "$dir/cp" ]]; then
        # "  client  <what>  N   then -> the next arrival  M   (K round trips)   by layer L" (read from
        # a here-string: the VM's init has no /dev/fd for a process substitution)
        stretches="$(python3 "$SCRIPTS/critical_path.py" "$dir/cp" --send write --by-layer)"
        while read -r role rest; do
            paths+=("${role}_path=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "then") { print $(i - 1); exit } }' <<<"$rest")")
            paths+=("${role}_path_layers=$(awk '{ print $NF }' <<<"$rest")")
        done <<<"$stretches"
    fi
    t2=$SECONDS
    for key in client_path server_path client_path_layers server_path_layers; do
        path="$key=n/a"
        for p in "${paths[@]}"; do [[ "$p" == "$key="* ]] && path="$p"; done
        out+=" $path"
    done
    out+=" secs=$runs1,$runs2,$((t1 - t0)),$split,$((t2 - t1))"
    [[ -n "$copied" ]] && out+=" copied=$copied"
    echo "$out"
}

if [[ "${1:-}" == "--report" ]]; then
    [[ -f "${2:?usage: verbs-instructions.sh --report DIR}/meta" ]] || { echo "verbs-instructions.sh: no $2/meta" >&2; exit 2; }
    report "$2"
    exit 0
fi

keep=""
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --keep) keep="${2:?--keep takes a directory}"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
BIN="${args[0]:?usage: verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM] [--keep DIR]}"
DEV="${args[1]:?usage: verbs-instructions.sh BIN DEV [N1,N2] [SYSTEM] [--keep DIR]}"
calls="${args[2]:-1000,3000}"
SYSTEM="${args[3]:-rpc-core}"
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

if ! command -v valgrind >/dev/null 2>&1; then
    printf '\n!!! VERBS INSTRUCTION COUNTS DID NOT RUN: valgrind is missing (apt-get install valgrind). !!!\n'
    exit 0
fi
[[ -x "$BIN" ]] || { echo "verbs-instructions.sh: no executable $BIN" >&2; exit 2; }

# The runs write to local storage (the VM's tmpfs), not to DIR: the split run writes a profile at
# every cut.
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

# How long each part took (the line's secs): the count's time doubled between two CI runs of
# nearly the same code, and the suite's step only showed the total.
t0=$SECONDS
run "$n1"
t1=$SECONDS
run "$n2"
t2=$SECONDS
# The split run: only if its parts will be read (python3 here, or the profiles kept).
if [[ -n "$keep" ]] || command -v python3 >/dev/null 2>&1; then
    mkdir -p "$work/cp"
    if ! RPC_RDMA_DEVICE="$DEV" valgrind --tool=callgrind --dump-instr=yes --trace-children=yes --dump-after=epoll_wait \
        --dump-before=write --callgrind-out-file="$work/cp/cp-%p.out" "$BIN" run --system "$SYSTEM" --listen "rdma://$SERVER_IP:0" \
        --workload echo --sizes 32 --iters 300 --warmup 100 --no-plots --setup-timeout "$SETUP_SECS" --out "$work/bench-cp" \
        >"$work/log-cp" 2>&1; then
        cat "$work/log-cp" >&2
        echo "verbs-instructions.sh: the split callgrind run on $DEV failed" >&2
        exit 1
    fi
fi
t3=$SECONDS
meta="dev=$DEV n1=$n1 n2=$n2 runs1=$((t1 - t0)) runs2=$((t2 - t1)) split=$((t3 - t2))"
if [[ -z "$keep" ]]; then
    echo "$meta" >"$work/meta"
    report "$work"
    exit 0
fi
mkdir -p "$keep"
cp "$work/$n1"-*.out "$work/$n2"-*.out "$keep/"
[[ -d "$work/cp" ]] && cp -r "$work/cp" "$keep/"
echo "$meta copied=$((SECONDS - t3))" >"$keep/meta"
echo "VERBS-INSTRUCTIONS-KEPT dev=$DEV$(counts "$keep" "$n1" "$n2") dir=$keep"
