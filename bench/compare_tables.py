"""Prints the tables of bench/before_after.sh side by side: for every row of every table that
both runs wrote, each timed cell's median before and after, and their ratio after / before.

    .venv/bin/python bench/compare_tables.py OUT_DIR

A timed cell is "min / median / max"; a row is matched by its cells before the first timed one
(the op, the transition, the ranks). python_bench.py's per-op section is compared by its
"shardtensor over µs" column, each run of it a column.
"""
import glob
import os
import re
import statistics
import sys

TIMED = re.compile(r"^\s*[\d.]+ / ([\d.]+) / [\d.]+\s*$")


def tables(path):
    """The markdown tables of `path`: lists of rows, the header first."""
    out, current = [], None
    for line in open(path):
        line = line.strip()
        if line.startswith("[rank 0] |"):
            line = line[len("[rank 0] "):]
        if not line.startswith("|"):
            current = None
            continue
        if line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if current is None:
            current = []
            out.append(current)
        current.append(cells)
    return out


def compare_tables(before_path, after_path):
    for before, after in zip(tables(before_path), tables(after_path)):
        header = before[0]
        timed = [i for i, c in enumerate(before[1]) if TIMED.match(c)] if len(before) > 1 else []
        if not timed:
            continue
        labels = list(range(timed[0]))  # what a row is: the cells before its first timed one
        print("| " + " | ".join([header[i] for i in labels] + [f"{header[i]}: before → after (ratio)" for i in timed]) + " |")
        print("|" + "---|" * (len(labels) + len(timed)))
        after_rows = {tuple(r[i] for i in labels): r for r in after[1:] if len(r) == len(header)}
        for row in before[1:]:
            match = after_rows.get(tuple(row[i] for i in labels))
            if len(row) != len(header) or match is None:
                continue
            def median(cell):
                m = TIMED.match(cell)
                return float(m.group(1)) if m else None
            medians = [(median(row[i]), median(match[i])) for i in timed]
            pairs = [f"{a:g} → {b:g} ({b / a:.2f})" if a and b is not None else "" for a, b in medians]
            print("| " + " | ".join([row[i] for i in labels] + pairs) + " |")
        print()


def compare_perop(out):
    def overheads(path):
        rows = {}
        for table in tables(path):
            header = table[0]
            if "shardtensor over µs" not in header:
                continue
            col = header.index("shardtensor over µs")
            for r in table[1:]:
                rows[tuple(r[:3])] = float(r[col])
        return rows
    before = [overheads(p) for p in sorted(glob.glob(os.path.join(out, "before_perop_*.log")))]
    after = [overheads(p) for p in sorted(glob.glob(os.path.join(out, "after_perop_*.log")))]
    if not before or not after:
        return
    print("| op | layout | n | shardtensor overhead µs before (each run) | after (each run) | after / before (means) |")
    print("|---|---|---|---|---|---|")
    for key in before[0]:
        a, b = [r[key] for r in before if key in r], [r[key] for r in after if key in r]
        print(f"| {' | '.join(key)} | {', '.join(f'{x:.2f}' for x in a)} | {', '.join(f'{x:.2f}' for x in b)} | "
              f"{statistics.mean(b) / statistics.mean(a):.2f} |")
    print()


def main():
    out = sys.argv[1]
    for before in sorted(glob.glob(os.path.join(out, "before_*.md"))):
        after = before.replace("before_", "after_")
        if os.path.exists(after):
            print(f"## {os.path.basename(before)[len('before_'):-3]}\n")
            compare_tables(before, after)
    compare_perop(out)


if __name__ == "__main__":
    main()
