"""What breaks a quantized model: its output SQNR, what leaving each quantized tensor in float
recovers, ranges decided by sentinels or outliers, and a suggested ``nodes_to_exclude``."""

from ..quantize.findings import RangeFinding, range_findings
from ..quantize.switches import name_nodes
from .diagnosis import DEFAULTS, Diagnosis, TensorImpact, diagnose

__all__ = ["DEFAULTS", "Diagnosis", "RangeFinding", "TensorImpact", "diagnose", "name_nodes", "range_findings"]
