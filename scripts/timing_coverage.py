"""Print the coverage table of docs/timing.md: how often the median's interval holds the true median.

    python scripts/timing_coverage.py            # the table as docs/timing.md has it (about a minute)
    python scripts/timing_coverage.py --quick    # fewer draws

The simulation is ckptbench.store.coverage (seeded: the same table every run); paste its output between
the markers of docs/timing.md, or pass --write to replace it there.
"""

from __future__ import annotations

import argparse
import os
import sys

from ckptbench.store.coverage import markdown, table

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "timing.md")
BEGIN, END = "<!-- coverage table: scripts/timing_coverage.py -->", "<!-- end of coverage table -->"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2,000 and 500 draws instead of 20,000 and 4,000")
    p.add_argument("--write", action="store_true", help="replace the table in docs/timing.md")
    args = p.parse_args()
    reps, boot = (2000, 500) if args.quick else (20000, 4000)
    text = markdown(table(sizes=(3, 4, 5, 6, 10, 20), reps=reps, bootstrap_reps=boot), reps, boot)
    print(text)
    if args.write:
        with open(DOC, encoding="utf-8") as fh:
            doc = fh.read()
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(DOC, "w", encoding="utf-8") as fh:
            fh.write(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
