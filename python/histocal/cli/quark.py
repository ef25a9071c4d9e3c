"""``histocal calibrate --quark``: AMD Quark's calibrators (``histocal.quark``) on the command line."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ..methods.table import NON_OVERFLOW

logger = logging.getLogger("histocal.cli")

QUARK_METHODS = ("minmax", "entropy", "percentile", "distribution", "pow2")
QUARK_VERSIONS = ("0.13", "0.9")
_QUANT_TYPES = {"int8": "QInt8", "uint8": "QUInt8", "int16": "QInt16", "uint16": "QUInt16"}
# options Quark's calibrators do not have
_NOT_IN_QUARK = ("max_intermediate_outputs",)


def quark_calibrator(
    args: argparse.Namespace, model: Path, augmented: str, options: dict[str, Any], settings: Any
) -> Any:
    """Quark's factory for ``args.method``: ``pow2`` -> ``create_calibrator_power_of_two``
    (``--pow2-method``, default Quark's, the non-overflow one; ``--minmse-mode``; ``--symmetric``; ``--qtype``
    as the activation type; ``--num-bins``, default Quark 0.13's 2048, or 0 with ``--no-symmetric``), the others -> ``create_calibrator_float_scale`` with ``options``
    (the ``extra_options`` histocal's own calibrator would get) and the collection settings Quark's
    factory reads (``settings``: histocal's calibrator's). ``args.method`` is one of
    ``QUARK_METHODS`` (the caller checks). ``--quark-version 0.9``: Quark 0.9's factories
    (``histocal.quark.v0_9``: its per-method batch merging, the mean-squared-error search on the values, so
    ``--num-bins`` does not apply to pow2)."""
    from .. import quark as quark_013
    from ..methods.settings import PER_CHANNEL, CollectionSettings
    from ..quark import v0_9
    from ..quark.calibrators import QUARK_SETTINGS

    old = getattr(args, "quark_version", None) == "0.9"
    quark: Any = v0_9 if old else quark_013

    if args.method == "pow2":
        extra: dict[str, Any] = {}
        if args.symmetric is not None:
            extra["symmetric"] = args.symmetric
        if args.minmse_mode is not None:
            extra["minmse_mode"] = args.minmse_mode
        if old:
            if getattr(args, "num_bins", None) is not None:
                logger.warning("option --num-bins does not apply to --method pow2 of Quark 0.9; ignored")
        elif getattr(args, "num_bins", None) is not None:
            extra["num_bins"] = args.num_bins
        elif args.symmetric is False:
            # Quark 0.13's histogram mode (its default) is symmetric only: asymmetric All is
            # the search on the values, as in Quark 0.9
            extra["num_bins"] = 0
        return quark.create_calibrator_power_of_two(
            model,
            args.op_types,
            augmented,
            _QUANT_TYPES[args.qtype or "int8"],
            args.pow2_method or NON_OVERFLOW,  # Quark 0.9 names it method, 0.13 calibrate_method
            execution_providers=args.providers,
            extra_options=extra,
        )
    for key in _NOT_IN_QUARK:
        if options.pop(key, None) is not None:
            logger.warning("option --%s does not apply to --quark; ignored", key.replace("_", "-"))
    if settings.per_channel:
        logger.warning("option %s does not apply to --quark; ignored", PER_CHANNEL.flag)
    return quark.create_calibrator_float_scale(
        model,
        args.op_types,
        augmented,
        calibrate_method=args.method,
        execution_providers=args.providers,
        extra_options=options,
        settings=CollectionSettings.from_cli(args, QUARK_SETTINGS),
    )
