"""Integrations with RL frameworks, each in its own module, imported only when used.

* :mod:`advmon.integrations.verl`: every verl advantage estimator, on every path verl calls it by.
"""
