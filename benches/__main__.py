"""The benchmarks' one command line (run from the repository root):

    python -m benches list                      # the benchmarks and the question each answers
    python -m benches NAME [NAME ...] [--quick]  # measure; records to benches/results/NAME.json
    python -m benches NAME --smoke --out DIR     # the smallest size (the test suite's smoke run)
    python -m benches report                    # BENCHMARKS.md (and the plots) from the records

``--set KEY=VALUE`` overrides one of a benchmark's settings (``python -m benches list`` shows
them per size); values are JSON (``--set samples=[8,16]``) or plain strings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from benches import BENCHES, bench_module
from benches.support import report
from benches.support.harness import RESULTS, Run


def parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help=f"list, report, or benchmarks: {', '.join(BENCHES)}")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the quick size (minutes on a 2-core machine)")
    size.add_argument("--smoke", action="store_true", help="the smallest size (seconds; records not kept)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("--out", type=Path, help="folder for the records (default benches/results)")
    parser.add_argument("--no-plots", action="store_true", help="report: leave the PNGs as they are")
    args = parser.parse_args(argv)

    if args.names == ["list"]:
        for name in BENCHES:
            module = bench_module(name)
            print(f"{name}: {module.QUESTION}")
            for size_name, settings in module.SIZES.items():
                print(f"    {size_name}: {json.dumps(settings)}")
        return 0
    if args.names == ["report"]:
        written = report.write(plots=not args.no_plots)
        print("\n".join(str(p) for p in written))
        return 0
    unknown = [n for n in args.names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHES)}")
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    overrides = dict(item.split("=", 1) for item in args.set)
    out = args.out or (None if args.smoke else RESULTS)
    # The command as recorded: what was measured (--out says only where the records went).
    options = [a for i, a in enumerate(argv) if a not in args.names and "--out" not in (a, argv[i - 1] if i else "")]
    for name in args.names:
        module = bench_module(name)
        settings = {**module.SIZES[size_name], **{k: parse_value(v) for k, v in overrides.items()}}
        command = shlex.join(["python", "-m", "benches", name, *options])
        run = Run(name, module.QUESTION, command, size_name, settings)
        print(f"{name} ({size_name}): {module.QUESTION}", file=sys.stderr)
        module.run(run, settings)
        if out is not None:
            print(f"wrote {run.write(out)}", file=sys.stderr)
        for line in module.section(run.result()):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
