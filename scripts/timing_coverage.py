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

from ckptbench.measure.stopping import CUDA_CHECK_EVERY, StopRule
from ckptbench.store.coverage import markdown, sequential_markdown, sequential_table, table

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "timing.md")
BEGIN, END = "<!-- coverage table: scripts/timing_coverage.py -->", "<!-- end of coverage table -->"
RULE_BEGIN, RULE_END = "<!-- stopping-rule table: scripts/timing_coverage.py -->", "<!-- end of stopping-rule table -->"
# the rules of the suites the docs name: suites/cpu.toml (3 steps at least, +-2 %, 30 at most) and the
# defaults on CUDA (read every 4 steps), and a looser +-5 %
RULES = {"CPU, ±2 %, 3-30 steps": StopRule(3, 0.02, 30, 1e9, 1),
         "CPU, ±5 %, 3-30 steps": StopRule(3, 0.05, 30, 1e9, 1),
         "CUDA, ±2 %, 3-50 steps, every 4": StopRule(3, 0.02, 50, 1e9, CUDA_CHECK_EVERY)}


def replace_between(doc: str, begin: str, end: str, text: str) -> str:
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{text}\n{end}{tail}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2,000 and 500 draws instead of 20,000 and 4,000")
    p.add_argument("--write", action="store_true", help="replace the table in docs/timing.md")
    args = p.parse_args()
    reps, boot = (2000, 500) if args.quick else (20000, 4000)
    text = markdown(table(sizes=(3, 4, 5, 6, 10, 20), reps=reps, bootstrap_reps=boot), reps, boot)
    seq_reps = 500 if args.quick else 4000
    rules = sequential_markdown(sequential_table(RULES, seq_reps), seq_reps)
    print(text + "\n\n" + rules)
    if args.write:
        with open(DOC, encoding="utf-8") as fh:
            doc = fh.read()
        doc = replace_between(doc, BEGIN, END, text)
        doc = replace_between(doc, RULE_BEGIN, RULE_END, rules)
        with open(DOC, "w", encoding="utf-8") as fh:
            fh.write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
