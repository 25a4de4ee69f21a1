"""partita.fitting: the numbers fitted to measurements, and the files that store them.

The step-time fit of the framework numbers (`step_time`), the memory-reserve fit (`memory`), and
the writer of fitted data files with the rows, objective and command behind each value (`writer`).
Imports planner and simulator only; the rows it fits on come from `partita.validation`.
"""
