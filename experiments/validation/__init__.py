"""The parts of the cost model's validation, ``experiments/estimate_validation.py`` (its command line, the
calibration and the measured runs):

* :mod:`validation.logs`  -- what the measured runs' logs say: each job's later run, page faults, time by term;
* :mod:`validation.table` -- predictions against measurements: the table, its summary, the host-speed ratio.
"""
