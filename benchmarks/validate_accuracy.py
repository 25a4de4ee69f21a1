"""Accuracy of the simulator against published measurements, and how long validating takes.

    .venv/bin/python benchmarks/validate_accuracy.py [partita validate options, e.g. --verbose]

Prints the `partita validate` report (one line per row, the fit and hold-out summaries apart) and
the wall time of the whole run. The numbers reported on the issue come from this command.
"""
from __future__ import annotations

import sys
import time

from partita.cli import main

if __name__ == "__main__":
    start = time.perf_counter()
    code = main(["validate", *sys.argv[1:]])
    print(f"\nvalidated in {time.perf_counter() - start:.2f} s (wall)")
    sys.exit(code)
