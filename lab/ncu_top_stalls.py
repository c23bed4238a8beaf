"""The SASS instructions with the most warp-stall samples in one kernel's Nsight Compute source page.

Lab only (device lab run 25). Reads, on stdin, the CSV of
    ncu --section WarpStateStats --section SourceCounters -k regex:KERNEL -s SKIP -c 1 \\
        --import-source no --page source --print-source sass --csv PROGRAM ...
and prints the top N instructions (default 30): share of all stall samples, address, instruction, and
the stall reasons that hold at least 5% of that instruction's samples (long_sb: waiting on a global or
local load; short_sb: on shared memory; barrier: at a block barrier; ...).

    python3 lab/ncu_top_stalls.py [N] < source.csv
"""
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    rows = list(csv.reader(sys.stdin))
    header_at = next((i for i, r in enumerate(rows) if len(r) > 5 and r[0] == "Address"), None)
    if header_at is None:
        sys.exit("no source table in the input (ncu ... --page source --print-source sass --csv)")
    header = rows[header_at]
    samples, source, address = header.index(SAMPLES), header.index("Source"), header.index("Address")
    reasons = [j for j, name in enumerate(header) if name.startswith("stall_") and "Not Issued" not in name]
    table = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    total = sum(number(r[samples]) for r in table) or 1.0
    table.sort(key=lambda r: -number(r[samples]))
    for r in table[:top]:
        n = number(r[samples])
        why = " ".join(f"{header[j][6:]}={r[j]}" for j in reasons if number(r[j]) > 0.05 * n)
        print(f"{100 * n / total:5.1f}% {r[address][-4:]} {r[source].strip()[:60]:60s} {why}")


if __name__ == "__main__":
    main()
