#!/usr/bin/env bash
# Where an event-driven 32 B round trip goes, ours against `ib_send_lat -e`, in one VM boot: both
# run under `perf record` (scheduler and system-call tracepoints), and timeline.py prints per
# process the user-space stretch from a wake-up to the answer's doorbell `write`, the `write`
# itself, and from a doorbell to the peer's wake-up.
#   scripts/vm/probes/timeline.sh RPC_BENCH [DEV]     (DEV: rxe0, the default, or siw0)
# RPC_BENCH: an rpc-bench built with `--features benches/rdma`. Needs scripts/vm/setup.sh done
# and the host's `perf` built for the VM's kernel (Debian's linux-perf of the same release).
# Tracing slows both sides (every traced event costs microseconds under TCG): compare the two
# runs with each other, not with untraced figures. Output: /tmp/rpc-probes/timeline-DEV/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: timeline.sh RPC_BENCH [DEV]}")"
dev="${2:-rxe0}"
out="${RPC_PROBE_OUT:-/tmp/rpc-probes}/timeline-$dev"
mkdir -p "$out"
command -v perf >/dev/null || { echo "timeline.sh: no perf on this host" >&2; exit 1; }
"$here/../run.sh" --timeout 900 --rw "$out" -- bash -c '
set -eu
bin="$1" dev="$2" out="$3" here="$4"
events=sched:sched_switch,sched:sched_wakeup,raw_syscalls:sys_enter,raw_syscalls:sys_exit
conn=(-x 1)
if [ "$dev" = siw0 ]; then
    # rdma_cm binds the address to the first device that carries it.
    rdma link delete rxe0
    conn=(-R)
fi
# perf writes to the VM'"'"'s tmpfs, not the shared directory (its writes would be traced too).
perf record -q -a -m 512 -e "$events" -o /tmp/ours.data -- env RPC_RDMA_DEVICE="$dev" "$bin" run \
    --listen rdma://10.0.2.15:0 --workload echo --sizes 32 --duration 2 --no-plots --out /tmp/bench \
    >"$out/ours.log" 2>&1
ib_send_lat -d "$dev" "${conn[@]}" -F -p 18515 -C -e -n 3000 >"$out/perftest.server" 2>&1 &
sleep 2
perf record -q -a -m 512 -e "$events" -o /tmp/perftest.data -- ib_send_lat -d "$dev" "${conn[@]}" \
    -F -p 18515 -C -e -n 3000 10.0.2.15 >"$out/perftest.client" 2>&1
wait
comm="$(basename "$bin" | cut -c1-15)"
perf script -i /tmp/ours.data -F comm,pid,tid,cpu,time,event,trace >/tmp/ours.txt 2>/dev/null
perf script -i /tmp/perftest.data -F comm,pid,tid,cpu,time,event,trace >/tmp/perftest.txt 2>/dev/null
{
    echo "# $dev, event-driven 32 B echo under perf (rpc-bench p50 under tracing: $(awk "\$1 == \"32\" { print \$3 }" "$out/ours.log") us)"
    python3 "$here/timeline.py" /tmp/ours.txt "$comm" 232
    python3 "$here/timeline.py" /tmp/perftest.txt ib_send_lat 0
} | tee "$out/timeline.txt"
' _ "$bin" "$dev" "$out" "$here"
