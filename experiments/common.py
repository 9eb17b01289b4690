"""The experiments' shared module before the harness (issue 32): now only names of ``experiments/harness/``.

``bench_folder_checks.py`` still imports it (it moves onto the harness in its own commit); new scripts
import the harness itself (``from harness import report, runs, setup``, see experiments/README.md), and
``tests/test_experiments_harness.py`` fails a script that imports this module.
"""

from __future__ import annotations

from harness import LOAD_AT_START  # noqa: F401,I001 - first: it sets OpenMP's wait policy before torch loads
from harness.report import (bar_panel, figure, format_table, line_panel, machine_info,  # noqa: F401
                            output_stem, save_figure, save_json, stacked_panel)
from harness.runs import (PHASES, epoch_counters, id_bytes, iteration_times, rank_jobs, run_jobs,  # noqa: F401
                          run_repeated, shuffle_bytes_per_layer)
from harness.setup import (DATA, REPO, RESULTS, data_file, describe_dataset, each_dataset,  # noqa: F401
                           load_named, make_map, make_parser)
