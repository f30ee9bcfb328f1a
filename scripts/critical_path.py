#!/usr/bin/env python3
"""The instructions each side of a round trip runs from a message's arrival to the message it
sends next, from callgrind profiles split at the system calls that mark the two.

    scripts/critical_path.py DIR [--arrival FN] [--send FN] [--by-layer] [--by-function N]

DIR holds the profiles of one `rpc-bench run` (its server a child process) run under
`valgrind --tool=callgrind --trace-children=yes --dump-after=FN_A --dump-before=FN_S
--callgrind-out-file=DIR/cp-%p.out`, where FN_A is the libc call a process returns from when a
message has arrived for it (`epoll_wait`, the default: the runtime waking up) and FN_S the one
that hands a message over (`send` over tcp, the default; `write` over verbs, where the provider's
doorbell is a `write`). Each process's run is then a sequence of parts, each ended by one of
those. For every send, the parts since the last arrival up to that send are one stretch from an
arrival to the next message out: on the server, from a request's arrival to its answer's
doorbell; on the client, from an answer's arrival to the next request's (the caller's result,
the harness's timing and the next call). The parts after it, up to the next arrival, are the
system call, the work a side does once its message is out, and its wait.

Why it matters: when client and server run on CPUs of their own (two hosts; two cores, as when
busy-polling), a round trip is the two stretches plus the network and the kernels, and work
after a send overlaps the peer's. On one shared CPU both count alike (see `instr/call`).

Prints per side the medians of the two over the run's second half (start-up and warm-up are in
the first) and how many round trips that was. With --by-layer (the profiles must then come from
callgrind with --dump-instr=yes too), also each side's stretch from an arrival to its send split
by layer, as scripts/layers.py splits a whole call (rpc, transport, tokio, provider, libc,
harness, other): the mean over the last 64 of the same round trips, which repeat to within a few
instructions, so the layers add up to about the median. This is the split that decides a round
trip when each side has a CPU of its own: the RPC layers' share of it is what a leaner
small-call path cuts. With --by-function N (also from profiles made with --dump-instr=yes), the N
functions of each side's stretch that cost the most, over the same round trips, each with its
layer: where in the stretch the instructions go (inlined code counts for the function it was
inlined into, as in scripts/layers.py).
"""

import argparse
import collections
import os
import re
import statistics

import layers


def parts(directory):
    """{pid: (role, [(part number, trigger, instructions, file)])}, in part order."""
    found = collections.defaultdict(list)
    roles = {}
    for name in os.listdir(directory):
        m = re.match(r"cp-(\d+)\.out(?:\.(\d+))?$", name)
        if not m:
            continue
        pid, number = m.group(1), int(m.group(2) or 0)
        trigger, total = None, None
        with open(os.path.join(directory, name), errors="replace") as f:
            for line in f:
                if line.startswith("cmd:"):
                    roles[pid] = "server" if " server " in line else "client"
                elif line.startswith("desc: Trigger:"):
                    trigger = line.split(":", 2)[2].strip()
                elif line.startswith("summary:"):
                    total = int(line.split()[1])
                    break
        if trigger is not None and total is not None:
            found[pid].append((number, trigger, total, os.path.join(directory, name)))
    return {pid: (roles.get(pid, "?"), sorted(p)) for pid, p in found.items()}


# How many round trips the split by layer reads.
LAYER_SAMPLE = 64


def stretches(seq, arrival, send):
    """(arrival -> first send, first send -> next arrival, the first one's part files) per round
    trip of `seq`."""
    out = []
    to_send, after, sent, files = 0, 0, False, []
    for _, trigger, n, path in seq:
        if not sent:
            to_send += n
            files.append(path)
            if trigger == f"--dump-before={send}":
                sent = True
        else:
            after += n
            if trigger == f"--dump-after={arrival}":
                out.append((to_send, after, files))
                to_send, after, sent, files = 0, 0, False, []
        if not sent and trigger == f"--dump-after={arrival}":
            # Another arrival before anything was sent (a wake-up that found nothing, say):
            # the stretch starts again from the latest one.
            to_send, files = 0, []
    return out


def per_function(found):
    """The mean instructions per (layer, function) of the stretches' arrival -> send parts, over
    the last `LAYER_SAMPLE` of them (they repeat to within a few instructions; reading every
    part's profile takes minutes under TCG)."""
    found = found[-LAYER_SAMPLE:]
    total = collections.Counter()
    for _, _, files in found:
        for path in files:
            total.update(layers.per_function(path))
    return collections.Counter({key: cost / len(found) for key, cost in total.items()})


def by_layer(costs):
    """`per_function`'s costs added up per layer, as `layer:N` pairs."""
    total = layers.by_layer(costs)
    return ",".join(f"{lay}:{round(total[lay])}" for lay in layers.LAYERS)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--arrival", default="epoll_wait")
    ap.add_argument("--send", default="send")
    ap.add_argument("--by-layer", action="store_true")
    ap.add_argument("--by-function", type=int, default=0, metavar="N")
    args = ap.parse_args()
    rows = []
    for role, seq in parts(args.dir).values():
        found = stretches(seq[len(seq) // 2 :], args.arrival, args.send)[1:-1]
        if found:
            costs = per_function(found) if args.by_layer or args.by_function else None
            rows.append(
                (
                    role,
                    statistics.median(s for s, _, _ in found),
                    statistics.median(a for _, a, _ in found),
                    len(found),
                    costs,
                )
            )
    if not rows:
        raise SystemExit(f"critical_path.py: no round trips found (was the run split at {args.arrival} and {args.send}?)")
    what = {"client": "an answer's arrival -> the next request out", "server": "a request's arrival -> its answer out"}
    for role, to_send, after, n, costs in sorted(rows, key=lambda row: row[:4]):
        print(
            f"  {role:<7} {what.get(role, '?'):<46} {to_send:>7.0f}"
            f"   then -> the next arrival {after:>6.0f}   ({n} round trips)"
            + (f"   by layer {by_layer(costs)}" if args.by_layer else "")
        )
    for role, _, _, _, costs in sorted(rows, key=lambda row: row[:4]):
        if args.by_function:
            print(f"  {role}: the {args.by_function} functions of its stretch that cost the most")
            for (lay, function), cost in costs.most_common(args.by_function):
                print(f"    {cost:8.1f}  {lay:<9}  {function}")


if __name__ == "__main__":
    main()
