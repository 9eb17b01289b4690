"""The parts of the GPU benchmark, ``experiments/gpu_bench.py`` (its one command line and driver):

* :mod:`gpu.host`       -- ``system``, ``gpu_start``, ``pin_probe``: the machine, a process's GPU start, the pin stall;
* :mod:`gpu.rates`      -- ``bandwidth``, ``kernels``, ``layers``: the rates the floors divide by, one layer vs PyG;
* :mod:`gpu.training`   -- ``first_iteration``, ``train``, ``macrobatch``: training on one device against its floors;
* :mod:`gpu.full_graph` -- ``full_graph``, ``shares``: full-graph training vs PyG, the split plans' shares;
* :mod:`gpu.table`      -- the table printed at the end.

Nothing here imports torch at import time of the package itself (the modules do): the rows and sizes below are
what the driver and the parts share.
"""

ROWS = ((1024, (15, 10, 5)), (4096, (15, 10, 5)), (1024, (30, 30, 30)))
"""(targets, fanouts) of the benchmark's training rows."""
QUICK_ROWS = ((16, (15, 10, 5)), (64, (15, 10, 5)), (16, (30, 30, 30)))
SYSTEMS = (("split", "split", False), ("split_uva", "split", True), ("dp", "dp", False))
"""(row name, TrainConfig.system, uva)."""
HIDDEN = 256
PROBE_KINDS = ("anonymous", "private-file", "shared-file-read-only", "dev-shm")
VMSTAT_KEYS = ("nr_foll_pin_acquired", "nr_foll_pin_released", "pgmigrate_success", "pgmigrate_fail", "pgfault",
               "pgmajfault", "thp_fault_alloc", "thp_split_page", "compact_stall", "nr_dirty", "nr_writeback")
