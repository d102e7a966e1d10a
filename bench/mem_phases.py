#!/usr/bin/env python3
"""Peak device memory per phase of `latent-studio bench --sdxl` runs.

Reads the bench's output (its `[SDXL] <run> <what> at HH:MM:SS.mmm UTC` marks) and the
time-stamped nvidia-smi samples `bench/gpu_issue13.sh`'s `peak` takes
(`2026/11/27 13:00:00.123, 5303`: UTC, MiB), and prints the highest sample between each mark and
the next: the encoders and first step, the steps, the decode. Run beside the bench on the device
machine or on the files it brought back:

    python3 bench/mem_phases.py OUT/sdxl_host.txt OUT/mem-sdxl_host.txt
"""

import re
import sys

MARK = re.compile(r"^\[SDXL\] (.+?) at (\d\d):(\d\d):(\d\d)\.(\d{3}) UTC")


def seconds(h, m, s, ms):
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def marks(path):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = MARK.match(line.strip())
            if m:
                out.append((seconds(*m.groups()[1:]), m.group(1)))
    return out


def samples(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2:
                continue
            clock = parts[0].split(" ")[-1]  # HH:MM:SS.mmm
            try:
                h, m, rest = clock.split(":")
                s, ms = (rest.split(".") + ["0"])[:2]
                out.append((seconds(h, m, s, ms.ljust(3, "0")[:3]), int(parts[1])))
            except ValueError:
                continue
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    phases = marks(sys.argv[1])
    mem = samples(sys.argv[2])
    if not phases or not mem:
        sys.exit("no phase marks or no samples")
    start = mem[0][0]
    bounds = [(start, "before the first mark")] + phases + [(mem[-1][0] + 1, "end")]
    for (t0, name), (t1, _) in zip(bounds, bounds[1:]):
        inside = [mib for t, mib in mem if t0 <= t < t1]
        peak = max(inside) if inside else None
        shown = f"{peak} MiB ({peak / 1024:.2f} GiB)" if peak is not None else "no sample"
        print(f"{t0 - start:8.1f} s  from {name:<32} peak {shown}")


if __name__ == "__main__":
    main()
