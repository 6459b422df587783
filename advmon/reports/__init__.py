"""Recorded runs, read and shown: ``advmon report`` and ``advmon compare``.

* :mod:`advmon.reports.terminal`: a terminal summary of a run's records;
* :mod:`advmon.reports.html_page`: one self-contained HTML page (or one PNG) about a run;
* :mod:`advmon.reports.compare`: whether two runs of one recipe diverge, where, and in which statistic first;
* :mod:`advmon.reports.plots`: the Matplotlib figures both draw.

They read runs through :mod:`advmon.runs` and judge them with the catalog (:mod:`advmon.rules`); they never
import torch or the monitor.
"""
