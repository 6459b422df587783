"""``advmon.activation``, as docs/api.md promises it: the module is :mod:`advmon.integrations.activation`.

Importing this name gives that very module (not a copy of its names), so its state and anything patched on it
are the same whichever name a caller used.
"""

import sys

from advmon.integrations import activation as _activation

sys.modules[__name__] = _activation
