#!/usr/bin/env python3
"""Atomic read-modify-write instructions executed, from a callgrind profile.

    scripts/atomics.py CALLGRIND_OUT [--by-function N]

CALLGRIND_OUT must come from `valgrind --tool=callgrind --dump-instr=yes`. Prints the number of
x86-64 instructions with a `lock` prefix, and `xchg` with a memory operand (locked without the
prefix), that ran in every object of the profile (the program and its shared libraries, found
with `objdump -d`): each is an atomic update of a shared word (a reference count, a mutex, a
semaphore, an atomic counter), about 20 cycles even uncontended, several times an ordinary
instruction, which is why `scripts/instructions.sh` counts them beside instructions. With
--by-function, also the N functions that ran the most of them.
"""

import collections
import os
import re
import subprocess
import sys

from callgrind import instruction_costs

LOCKED = re.compile(r"\tlock |\txchg\s+\S*\(|\txchg\s+[^,]+,\s*\S*\(")
FUNCTION = re.compile(r"^([0-9a-f]+) <(.*)>:$")


def locked_instructions(path):
    """Address -> function of every atomic read-modify-write instruction in the object."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True, check=True)
    found, function = {}, "?"
    for line in out.stdout.splitlines():
        m = FUNCTION.match(line)
        if m:
            function = m.group(2)
        elif LOCKED.search(line):
            found[int(line.split(":", 1)[0], 16)] = function
    return found


def count(profile):
    """(total, Counter of function -> count) of atomic instructions executed in `profile`."""
    tables = {}
    by_function = collections.Counter()
    for obj, _, addr, cost in instruction_costs(profile):
        table = tables.get(obj)
        if table is None:
            table = tables[obj] = locked_instructions(obj) if obj and os.path.isfile(obj) else {}
        if addr in table:
            by_function[table[addr]] += cost
    return sum(by_function.values()), by_function


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    total, by_function = count(args[0])
    print(total)
    if len(args) == 3 and args[1] == "--by-function":
        for function, n in by_function.most_common(int(args[2])):
            print(f"{n:12} {function}")


if __name__ == "__main__":
    main()
