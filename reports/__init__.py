"""partita.reports: tables and figures from scenarios and their results (`partita report`).

Not built yet: the contract's `partita report compare|timeline|memory|validate|run` has no issue so far.
The data it will draw on is already produced: `partita simulate --json/--trace`, `partita validate
--json`, and `partita run`'s metrics.jsonl / trace.json / result.json. Imports point one way:
planner <- simulator <- reports.
"""
