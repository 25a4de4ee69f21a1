"""Unit constants: how many SI base units (bytes, FLOP/s, seconds) one file or display unit is.

Data files and reports use human units in key names (`memory_gib`, `mem_bw_GBps`, `nic_gbps`,
`latency_us`); everything inside partita is SI. Converting either way uses these names only.
"""
from __future__ import annotations

KIB = 2 ** 10           # bytes per KiB
MIB = 2 ** 20           # bytes per MiB
GIB = 2 ** 30           # bytes per GiB
GB = 1e9                # bytes per GB (decimal: GB/s in the catalog)
GBIT = 1e9 / 8          # bytes/s per Gbit/s
TFLOPS = 1e12           # FLOP/s per TFLOP/s
US = 1e-6               # seconds per microsecond
