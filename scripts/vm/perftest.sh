#!/usr/bin/env bash
# The harness's RDMA yardstick: perftest over loopback through eth0 (to 10.0.2.15) for one device.
# Runs INSIDE the VM (e.g. `scripts/vm/run.sh -- scripts/vm/perftest.sh rxe0`).
#
#   scripts/vm/perftest.sh DEV        (DEV = rxe0 or siw0)
#
# Measures ib_send_lat (2-byte sends: t_typical and t_avg in usec) and ib_read_bw at 1 MiB and 16 MiB
# (average MB/sec as perftest reports it, plus a wall-clock MiB/s lower bound). RoCE devices use GID index 1 (the IPv4-mapped one, `-x 1`);
# iWARP devices connect through rdma_cm (`-R`), which iWARP requires.
# Prints one line per test, then a summary line that benchmarks can quote or grep:
#   PERFTEST dev=rxe0 send_lat_typical_us=... send_lat_avg_us=... read_bw_1MiB_MBps=... read_bw_16MiB_MBps=...
#            read_bw_1MiB_wall_MiBps=... read_bw_16MiB_wall_MiBps=... (took N s in the VM)
# Exits non-zero if any test fails (the failing tool's output is shown).
#
# The raw perftest outputs are kept in $RPC_VM_OUT/perftest-DEV/ (on the host too) when run via run.sh.
#
# Environment (iteration counts; under TCG rxe0 reads ~25-40 MB/s and siw0 ~20 MB/s, so these keep one
# device's run near a minute): RPC_PERFTEST_LAT_ITERS (1000), RPC_PERFTEST_BW_1MIB_ITERS (300),
# RPC_PERFTEST_BW_16MIB_ITERS (30); RPC_PERFTEST_TIMEOUT seconds per tool run (300).
set -euo pipefail

DEV="${1:?usage: perftest.sh DEV}"
SERVER_IP=10.0.2.15
LAT_ITERS="${RPC_PERFTEST_LAT_ITERS:-1000}"
BW_1MIB_ITERS="${RPC_PERFTEST_BW_1MIB_ITERS:-300}"
BW_16MIB_ITERS="${RPC_PERFTEST_BW_16MIB_ITERS:-30}"
TOOL_TIMEOUT="${RPC_PERFTEST_TIMEOUT:-300}"
# Each server run gets its own TCP port (no clash with an earlier one in TIME_WAIT): PORT_BASE + n.
PORT_BASE=18515
if [[ -n "${RPC_VM_OUT:-}" ]]; then
    LOG_DIR="$RPC_VM_OUT/perftest-$DEV"
    mkdir -p "$LOG_DIR"
else
    LOG_DIR="$(mktemp -d)"
    trap 'rm -rf "$LOG_DIR"' EXIT
fi

# Connection arguments for the device's transport.
connection_args() {
    if ibv_devinfo -d "$DEV" | grep -q 'transport:.*iWARP'; then
        CONN_ARGS=(-R)
        CONN_DESC="iWARP, rdma_cm"
    else
        CONN_ARGS=(-x 1)
        CONN_DESC="RoCE v2, GID index 1"
    fi
}

# Waits (up to ~5 s) for a server to listen on TCP port $1: perftest's own TCP exchange on RoCE, the
# iWARP connection manager's socket on siw. The client also retries below in case this was too early.
wait_for_listener() {
    local i
    for ((i = 0; i < 25; i++)); do
        [[ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]] && return 0
        sleep 0.2
    done
}

# run_pair NAME PORT TOOL ARGS...: starts TOOL as server on PORT, then as client to $SERVER_IP; the
# client's output is left in $LOG_DIR/NAME.client, its wall-clock seconds in NAME.wall. Returns non-zero (after showing both outputs) on failure.
run_pair() {
    local name="$1" port="$2" tool="$3" attempt
    shift 3
    local args=("$tool" -d "$DEV" "${CONN_ARGS[@]}" -F -p "$port" "$@")
    timeout "$TOOL_TIMEOUT" "${args[@]}" >"$LOG_DIR/$name.server" 2>&1 &
    local server_pid=$!
    wait_for_listener "$port"
    local t0
    for attempt in 1 2 3; do
        t0="$(date +%s.%N)"
        if timeout "$TOOL_TIMEOUT" "${args[@]}" "$SERVER_IP" >"$LOG_DIR/$name.client" 2>&1; then
            awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { print t1 - t0 }' >"$LOG_DIR/$name.wall"
            wait "$server_pid" && return 0
            break
        fi
        # A client that could not connect at all leaves the server waiting: try again.
        grep -qiE "couldn't connect|unable to|connection refused|failed to connect" "$LOG_DIR/$name.client" ||
            break
        sleep 1
    done
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    {
        echo "perftest.sh: $name on $DEV FAILED (${args[*]})"
        echo "--- client:"
        cat "$LOG_DIR/$name.client"
        echo "--- server:"
        cat "$LOG_DIR/$name.server"
    } >&2
    return 1
}

# The data line under perftest's column header (the header line contains $2); prints field $3.
result_field() {
    awk -v header="$2" -v field="$3" '
        index($0, header) { found = 1; next }
        found && $1 ~ /^[0-9]+$/ { print $field; exit }' "$LOG_DIR/$1.client"
}

# The TSC frequency the kernel calibrated: the rate of the cycle counter perftest reads.
cpu_mhz() { awk -F: '/^cpu MHz/ { print $2 + 0; exit }' /proc/cpuinfo; }

# Sets LAT_TYP_US and LAT_AVG_US. perftest converts cycles to usec with a CPU frequency it samples
# itself; under TCG's jittery clock that sampling often fails and it then prints "inf". So ask for
# cycles (-C) and divide by the kernel's calibrated TSC frequency instead.
measure_send_lat() {
    run_pair lat "$PORT_BASE" ib_send_lat -C -n "$LAT_ITERS" || return 1
    local mhz typ avg
    mhz="$(cpu_mhz)"
    typ="$(result_field lat t_typical 5)"
    avg="$(result_field lat t_typical 6)"
    [[ -n "$mhz" && -n "$typ" && -n "$avg" ]] || return 1
    LAT_TYP_US="$(awk -v c="$typ" -v m="$mhz" 'BEGIN { printf "%.2f", c / m }')"
    LAT_AVG_US="$(awk -v c="$avg" -v m="$mhz" 'BEGIN { printf "%.2f", c / m }')"
    echo "$DEV ib_send_lat 2 B x $LAT_ITERS: t_typical $LAT_TYP_US usec, t_avg $LAT_AVG_US usec" \
        "(perftest cycles / $mhz MHz)"
}

# The same, event-driven (`-e`: sleep on the completion channel, as our default does): sets
# LAT_EV_TYP_US.
measure_send_lat_events() {
    run_pair late $((PORT_BASE + 7)) ib_send_lat -C -e -n "$LAT_ITERS" || return 1
    local mhz typ
    mhz="$(cpu_mhz)"
    typ="$(result_field late t_typical 5)"
    [[ -n "$mhz" && -n "$typ" ]] || return 1
    LAT_EV_TYP_US="$(awk -v c="$typ" -v m="$mhz" 'BEGIN { printf "%.2f", c / m }')"
    echo "$DEV ib_send_lat -e 2 B x $LAT_ITERS: t_typical $LAT_EV_TYP_US usec (perftest cycles / $mhz MHz)"
}

# measure_read_bw NAME PORT BYTES ITERS: sets BW (perftest's "BW average", MB/sec) and BW_WALL (MiB/s
# over the client's whole run, connection setup included: a lower bound that needs no clock sampling).
# perftest's BW also depends on its sampled CPU frequency; when the sampling fails it reports 0.00,
# and such a run is measured again (up to 3 times).
measure_read_bw() {
    local name="$1" port="$2" bytes="$3" iters="$4" attempt
    for attempt in 1 2 3; do
        run_pair "$name" $((port + attempt * 10)) ib_read_bw -s "$bytes" -n "$iters" || return 1
        BW="$(result_field "$name" 'BW average' 4)"
        [[ -n "$BW" && "$BW" != "0.00" ]] && break
        echo "perftest.sh: $name on $DEV: perftest reported '${BW:-nothing}' MB/sec (attempt $attempt)" >&2
    done
    [[ -n "$BW" && "$BW" != "0.00" ]] || return 1
    BW_WALL="$(awk -v b="$bytes" -v n="$iters" -v t="$(<"$LOG_DIR/$name.wall")" \
        'BEGIN { printf "%.2f", b * n / t / 1048576 }')"
    echo "$DEV ib_read_bw $((bytes >> 20)) MiB x $iters: $BW MB/sec (perftest average);" \
        "$BW_WALL MiB/s wall-clock incl. connection setup"
}

main() {
    if [[ ! -e "/sys/class/infiniband/$DEV" ]]; then
        local have=(/sys/class/infiniband/*)
        echo "perftest.sh: no RDMA device $DEV (have: ${have[*]##*/})" >&2
        exit 1
    fi
    connection_args
    local started=$SECONDS
    echo "== perftest on $DEV ($CONN_DESC), loopback to $SERVER_IP"

    measure_send_lat || fail "ib_send_lat gave no usable figures"
    measure_send_lat_events || fail "ib_send_lat -e gave no usable figures"
    measure_read_bw bw1m $((PORT_BASE + 1)) 1048576 "$BW_1MIB_ITERS" || fail "ib_read_bw 1 MiB failed"
    local bw1m="$BW" bw1m_wall="$BW_WALL"
    measure_read_bw bw16m $((PORT_BASE + 2)) 16777216 "$BW_16MIB_ITERS" || fail "ib_read_bw 16 MiB failed"

    echo "PERFTEST dev=$DEV send_lat_typical_us=$LAT_TYP_US send_lat_avg_us=$LAT_AVG_US" \
        "send_lat_event_typical_us=$LAT_EV_TYP_US" \
        "read_bw_1MiB_MBps=$bw1m read_bw_16MiB_MBps=$BW" \
        "read_bw_1MiB_wall_MiBps=$bw1m_wall read_bw_16MiB_wall_MiBps=$BW_WALL" \
        "(took $((SECONDS - started)) s in the VM)"
}

fail() {
    echo "perftest.sh: $DEV: $*; raw outputs in $LOG_DIR" >&2
    exit 1
}

main
