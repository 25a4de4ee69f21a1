"""partita.reports: what a person would rather look at than read, from the simulator's numbers.

`partita report KIND` pages (one module per report: scaling, timeline, memory, validation, run,
compare), assembled by `html.py` into a self-contained HTML page with Markdown, PNG and CSV files
beside it; `regression.py` is `partita check`'s baseline. Imports point one way: planner <-
simulator <- reports.
"""
