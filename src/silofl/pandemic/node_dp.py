"""Moved to `silofl.privacy.node_level`: the node-level unit is a privacy unit of the core
trainer, not of the pandemic domain. This name is the same module (old imports, pickled
references and monkeypatches keep working)."""

import sys

from silofl.privacy import node_level as _node_level

sys.modules[__name__] = _node_level
