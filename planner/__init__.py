"""partita.planner: hardware catalog, scenario documents, model costs, schedules and plans.

Nothing in this package imports torch at import time except `planner.profiler` and
`planner.models` (the torch modules), which are imported only where a command needs them.
"""
