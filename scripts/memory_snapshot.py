#!/usr/bin/env python3
"""memory_snapshot.py - prints a --memory-snapshot file of ./train_gpt (llmc/cuda/devalloc.cuh):
the totals, the live allocations by class, and the timeline of allocated and reserved device bytes
over the run (one line per step and phase in which the allocator was used, with a bar).
Usage: scripts/memory_snapshot.py SNAPSHOT.json [--width N]"""
import json
import sys


def mib(b):
    return f"{b / 1048576:10.2f} MiB"


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 1
    width = int(argv[argv.index("--width") + 1]) if "--width" in argv else 50
    try:
        snap = json.load(open(argv[1]))
    except (OSError, ValueError) as e:
        print(f"error: {argv[1]}: not a readable memory snapshot ({e})", file=sys.stderr)
        return 1
    if snap.get("format") != "llmc-memory-snapshot":
        print(f"error: {argv[1]}: not an llmc memory snapshot (no \"format\": \"llmc-memory-snapshot\")", file=sys.stderr)
        return 1
    t = snap["totals"]
    print(f"memory snapshot at step {snap['step']} ({snap['phase']}): {t['segments']} segments")
    for k in ("reserved", "allocated", "requested", "largest_free", "peak_reserved", "peak_allocated"):
        print(f"  {k:16s} {t[k]:14d} {mib(t[k])}")
    print("live allocations by class (requested bytes, blocks):")
    by = {}
    for a in snap["allocations"]:
        n, b = by.get(a["class"], (0, 0))
        by[a["class"]] = (n + 1, b + a["size"])
    for c, (n, b) in sorted(by.items(), key=lambda x: -x[1][1]):
        print(f"  {c:20s} {b:14d} {mib(b)} in {n} block{'s' if n != 1 else ''}")
    print("timeline (allocated | reserved after each step and phase; # allocated, . reserved):")
    rows, last = [], None
    for e in snap["events"]:
        key = (e["step"], e["phase"])
        if rows and rows[-1][0] == key:
            rows[-1] = (key, e["allocated"], e["reserved"], rows[-1][3] + 1)
        else:
            rows.append((key, e["allocated"], e["reserved"], 1))
        last = e
    top = max([r[2] for r in rows] + [1])
    for (step, phase), alloc, res, n in rows:
        a, r = round(width * alloc / top), round(width * res / top)
        print(f"  step {step:5d} {phase:10s} {mib(alloc)} | {mib(res)} {'#' * a}{'.' * (r - a)}  ({n} event{'s' if n != 1 else ''})")
    if snap.get("events_dropped"):
        print(f"  ({snap['events_dropped']} later events not kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
