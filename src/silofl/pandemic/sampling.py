"""Moved to `silofl.training.node_sampling` (the core trainer's sampler for the node-level
unit). This name is the same module."""

import sys

from silofl.training import node_sampling as _node_sampling

sys.modules[__name__] = _node_sampling
