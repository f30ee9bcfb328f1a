#!/usr/bin/env python3
"""The code one call runs, in 64-byte cache lines, from two callgrind profiles of the same
binary and workload that differ only in the number of calls.

    scripts/footprint.py SHORT_OUT LONG_OUT CALLS [--by-function N]

Both profiles must come from `valgrind --tool=callgrind --dump-instr=yes`, LONG_OUT with CALLS
more calls than SHORT_OUT. A line counts when the instructions in it ran at least once per two
calls more in the long run than in the short one: the steady-state path of a call, without
start-up, warm-up and reporting, and without what runs only now and then (every 64th call, say).
Prints the number of such lines; with --by-function, also the N functions with the most.

Why count lines, not only instructions: a 32 B call runs almost every one of its instructions
once, in no loop, so the code it runs is about as large as its instruction count and does not
stay in a 32 KiB instruction cache (L1i) from one call to the next, the less so with a second
process and the kernel's network stack taking turns on the same core. Each line then comes from
L2 or further, a few cycles to tens of cycles, at each call. On the machines of BENCHMARKS.md a
call's wall time followed its lines more closely than its instructions.
"""

import collections
import sys

from callgrind import instruction_costs

LINE = 64


def per_address(profile):
    costs = collections.Counter()
    for obj, function, addr, cost in instruction_costs(profile):
        costs[(obj, function, addr)] += cost
    return costs


def footprint(short, long, calls):
    """The set of (object, line) the steady-state call runs, and Counter function -> lines."""
    a, b = per_address(short), per_address(long)
    lines, by_function = set(), collections.defaultdict(set)
    for (obj, function, addr), cost in b.items():
        if 2 * (cost - a.get((obj, function, addr), 0)) >= calls:
            lines.add((obj, addr // LINE))
            by_function[function].add((obj, addr // LINE))
    return lines, collections.Counter({f: len(ls) for f, ls in by_function.items()})


def main():
    args = sys.argv[1:]
    if len(args) not in (3, 5) or (len(args) == 5 and args[3] != "--by-function"):
        sys.exit(__doc__)
    lines, by_function = footprint(args[0], args[1], int(args[2]))
    print(len(lines))
    if len(args) == 5:
        for function, n in by_function.most_common(int(args[4])):
            print(f"{n:8} {function}")


if __name__ == "__main__":
    main()
