"""partita.validation: the simulator against published measurements.

Published rows as scenarios (`rowmap`, `rowcells`), their metrics as seconds per step (`metrics`),
the fit / hold-out split and the per-row comparison (`runner`), and the leave-one-source-out
cross-validation of the fitted numbers (`crossval`, which refits with `partita.fitting`).
"""
