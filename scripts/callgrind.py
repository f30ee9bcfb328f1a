"""Reading a callgrind profile made with `valgrind --tool=callgrind --dump-instr=yes`: the
self cost of every instruction address, for scripts/atomics.py and scripts/footprint.py.

Only the first event of each cost line is read (Ir, the instructions executed, when the profile
has no other events first). The cost callgrind writes on a call's line is the call's inclusive
cost, not the call instruction's own, and is skipped.
"""

import re

NAMED = re.compile(r"^c?(ob|fn)=\((\d+)\)(?: (.*))?$")


def instruction_costs(profile):
    """Yields (object, function, address, cost) for every self-cost line of `profile`: the
    object file (path) and function the instruction belongs to, its address in the object, and
    how many times it ran. An address can be yielded more than once (sum the costs)."""
    names = {"ob": {}, "fn": {}}
    obj, function, addr, after_call = None, None, 0, False
    positions = 2  # "instr line", callgrind's default with --dump-instr=yes
    with open(profile) as f:
        for line in f:
            first = line[:1]
            if line.startswith("calls="):
                # The next cost line is the call's inclusive cost.
                after_call = True
            elif line.startswith("positions:"):
                positions = len(line.split()) - 1
                if line.split()[1] != "instr":
                    raise SystemExit(f"{profile}: no instruction addresses (run callgrind with --dump-instr=yes)")
            elif first in "0123456789+-*":
                fields = line.split()
                pos = fields[0]
                if pos[0] in "+-":
                    addr += int(pos, 0)
                elif pos != "*":
                    addr = int(pos, 0)
                if after_call:
                    after_call = False
                    continue
                # The position columns (instr, then line) come before the costs.
                if len(fields) > positions:
                    yield obj, function, addr, int(fields[positions])
            elif first in "cfo":
                m = NAMED.match(line.strip())
                if not m:
                    continue
                kind, ident, name = m.groups()
                if name:
                    names[kind][ident] = name
                if line.startswith("ob="):
                    obj = names["ob"].get(ident)
                elif line.startswith("fn="):
                    function = names["fn"].get(ident)
