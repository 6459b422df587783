"""What a user configures advmon with, checked in one place: sink and notifier specs, ``Monitor(...)``'s
arguments and the ``ADVMON_*`` variables.

* :mod:`advmon.config.specs`: ``jsonl:``, ``prometheus:``, ``slack:``... spec strings into sinks and notifiers;
* :mod:`advmon.config.checks`: the checks of ``Monitor(...)``'s arguments (one clear
  :class:`~advmon.errors.AdvmonConfigError`, at once);
* :mod:`advmon.config.environment`: the ``ADVMON_*`` variables a process reads (run, sinks, directory,
  instrumentation targets).

Configuration sits above the sinks and the alerts' notifiers it builds, and below the monitor that uses it;
nothing here is imported by the package's face until it is used.
"""
