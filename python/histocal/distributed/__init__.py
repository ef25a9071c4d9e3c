"""Calibration sharded across machines with Ray (the optional extra ``ray``), merged
exactly: the result is the state of one run over all the shards (see ``calibrate_distributed``).
Ray is imported only when a calibration starts."""

from .driver import calibrate_distributed
from .shards import ShardError

__all__ = ["ShardError", "calibrate_distributed"]
