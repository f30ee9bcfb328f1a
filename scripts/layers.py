#!/usr/bin/env python3
"""The instructions one call costs a process, split by layer, from two callgrind profiles of the
same binary and workload that differ only in the number of calls.

    scripts/layers.py SHORT_OUT LONG_OUT CALLS [--by-function LAYER N]

Both profiles must come from `valgrind --tool=callgrind --dump-instr=yes`, LONG_OUT with CALLS
more calls than SHORT_OUT. Prints one line, `layer:N` pairs separated by commas, N the
instructions per call ((long - short) / CALLS), in this order:

    rpc        the RPC layers: rpc-core (protocol, drivers, call slots, handlers, codec), or tarpc
               in its rows, and the crates they run a call through (bincode, serde, metrics,
               tokio-util)
    transport  rpc-transport and what it drives the device with (sideway, rdma-mummy-sys,
               crossbeam's queue of the buffer pool)
    tokio      the runtime: scheduling, wake-ups, the I/O and time drivers (and mio)
    provider   libibverbs and the verbs provider's library (librxe, libsiw): a NIC's driver in
               user space; perftest pays it too
    libc       the C library (system-call wrappers, memcpy, clock_gettime)
    harness    rpc-bench's own work per call (timing, recording, checking the answer)
    other      the rest: std, bytes, tracing, parking_lot, futures, other libraries

With --by-function, also the N functions of LAYER that cost the most per call.

A function is put in the layer of the first crate of ours or a dependency named in its symbol
(`core::ptr::drop_in_place<rpc_core::...>` is the RPC layers'; `<benches::X as rpc_core::Service>`
the harness's), code outside the executable by its object file. Inlined code counts for the
function it was inlined into: std's `Vec` code inside a function of rpc-core is rpc-core's work.
raw-transport's ping-pong and the raw TCP ping-pong are rpc-bench's own code: harness.
Why: a total says how much a call costs, not which layer to cut; these say what each layer
weighs, next to what perftest's loop runs per message (~1.7k instructions per side on the
project's VM, the provider's ~0.6k of them).
"""

import collections
import os
import re
import sys

from callgrind import instruction_costs

LAYERS = ("rpc", "transport", "tokio", "provider", "libc", "harness", "other")

CRATES = {
    "rpc_core": "rpc",
    "tarpc": "rpc",
    "tokio_serde": "rpc",
    "bincode": "rpc",
    "serde": "rpc",
    "serde_core": "rpc",
    "metrics": "rpc",
    "tokio_util": "rpc",
    "rpc_transport": "transport",
    "sideway": "transport",
    "rdma_mummy_sys": "transport",
    "crossbeam_queue": "transport",
    "tokio": "tokio",
    "mio": "tokio",
    "benches": "harness",
    "rpc_bench": "harness",
    "hdrhistogram": "harness",
}
CRATE = re.compile(r"\b([a-z_][a-z0-9_]*)::")


def layer(obj, function, executable):
    """The layer of code in `function` of object file `obj`."""
    obj = obj or ""
    # callgrind names the object by its full path and the command as it was typed (a relative
    # path, say): the executable is the object of the same file name.
    if os.path.basename(obj) != os.path.basename(executable or ""):
        name = obj.rsplit("/", 1)[-1]
        if "ibverbs" in obj or "rdmav" in name:
            return "provider"
        if name.startswith(("libc.", "libc-", "ld-linux", "libm.", "libpthread")):
            return "libc"
        return "other"
    for m in CRATE.finditer(function or ""):
        found = CRATES.get(m.group(1))
        if found:
            return found
    return "other"


def executable_of(profile):
    """The profiled command's executable (callgrind's `cmd:` line)."""
    with open(profile) as f:
        for line in f:
            if line.startswith("cmd:"):
                return line.split()[1]
    return None


def per_function(profile):
    exe = executable_of(profile)
    costs = collections.Counter()
    for obj, function, _addr, cost in instruction_costs(profile):
        costs[(layer(obj, function, exe), function)] += cost
    return costs


def by_layer(by_function):
    """Costs per (layer, function) added up per layer."""
    total = collections.Counter()
    for (lay, _function), cost in by_function.items():
        total[lay] += cost
    return total


def split(short, long, calls):
    """Per layer and per (layer, function): instructions per call."""
    a, b = per_function(short), per_function(long)
    by_function = collections.Counter({k: (b[k] - a.get(k, 0)) / calls for k in b})
    return by_layer(by_function), by_function


def main():
    args = sys.argv[1:]
    if len(args) not in (3, 6) or (len(args) == 6 and args[3] != "--by-function"):
        sys.exit(__doc__)
    by_layer, by_function = split(args[0], args[1], int(args[2]))
    print(",".join(f"{lay}:{round(by_layer[lay])}" for lay in LAYERS))
    if len(args) == 6:
        wanted, n = args[4], int(args[5])
        rows = sorted(((c, f) for (lay, f), c in by_function.items() if lay == wanted), reverse=True)
        for cost, function in rows[:n]:
            print(f"{cost:10.1f} {function}")


if __name__ == "__main__":
    main()
