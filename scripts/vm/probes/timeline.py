#!/usr/bin/env python3
"""Where an event-driven round trip goes, from a `perf script` text of a ping-pong between two
processes (sched_switch, sched_wakeup, raw_syscalls sys_enter and sys_exit tracepoints).

    scripts/vm/probes/timeline.py PERF_SCRIPT_TXT COMM WAIT_NR

COMM: the processes' command name (both sides have it: rpc-bench's server is a child of the same
binary, perftest runs one binary twice). WAIT_NR: the system call each side sleeps in between
messages (232 epoll_wait for a tokio runtime, 0 read for `ib_send_lat -e`). The doorbell is the
`write` (1) that posts a SEND on rxe and siw.

Per process it prints the medians of:
- wake -> doorbell: from the return of a wait that slept to the next `write`, the user-space work
  between a message's arrival and the answer's post (no system call in it on our side);
- doorbell: the `write` itself, the provider's kernel path (the packet is built, looped back and
  delivered within it, or in the softirq at its end);
and over both, doorbell -> peer wake: from one side's `write` to the other's return from its
wait, with the share of such pairs on the same CPU.
"""

import collections
import re
import statistics
import sys

LINE = re.compile(r"^\s*(\S+)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)$")
WRITE = 1
# A wait that returned after this long slept (a shorter one found its event ready).
SLEPT_US = 30.0


def events(path, comm):
    """(time_us, tid, cpu, kind, nr) of the system calls of processes named `comm`."""
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m or m.group(1) != comm:
            continue
        _, _, tid, cpu, t, ev, rest = m.groups()
        if ev.endswith("sys_enter") or ev.endswith("sys_exit"):
            nr = int(rest.split()[1])
            yield float(t) * 1e6, tid, cpu, "enter" if ev.endswith("sys_enter") else "exit", nr


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    path, comm, wait_nr = sys.argv[1], sys.argv[2], int(sys.argv[3])
    entered = {}
    woke = {}
    segment = collections.defaultdict(list)
    doorbell = collections.defaultdict(list)
    transit, same_cpu = [], 0
    last_doorbell = None
    for t, tid, cpu, kind, nr in events(path, comm):
        if kind == "enter":
            entered[(tid, nr)] = t
            if nr == WRITE:
                if tid in woke:
                    segment[tid].append(t - woke.pop(tid))
                last_doorbell = (t, tid, cpu)
            continue
        start = entered.pop((tid, nr), None)
        if start is None:
            continue
        if nr == WRITE:
            doorbell[tid].append(t - start)
        elif nr == wait_nr and t - start > SLEPT_US:
            woke[tid] = t
            if last_doorbell and last_doorbell[1] != tid:
                transit.append(t - last_doorbell[0])
                same_cpu += last_doorbell[2] == cpu
                last_doorbell = None
    most = max((len(v) for v in doorbell.values()), default=0)
    for tid in sorted(doorbell, key=lambda k: -len(doorbell[k])):
        if len(doorbell[tid]) < most // 10:
            continue  # a thread that posted during setup only
        seg = segment.get(tid, [])
        print(
            f"{comm} {tid}: wake -> doorbell {statistics.median(seg) if seg else float('nan'):7.1f} us"
            f" (n={len(seg)}), doorbell write {statistics.median(doorbell[tid]):7.1f} us"
            f" (n={len(doorbell[tid])})"
        )
    if transit:
        print(
            f"{comm}: doorbell -> peer wake {statistics.median(transit):7.1f} us (n={len(transit)}),"
            f" same CPU in {100 * same_cpu / len(transit):.0f}%"
        )


if __name__ == "__main__":
    main()
