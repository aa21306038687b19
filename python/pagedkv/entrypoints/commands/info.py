"""``pagedkv info``: prints the version and how this copy was built."""

from __future__ import annotations

import argparse
import json

NAME = "info"
HELP = "Print the pagedkv version, build configuration and whether a CUDA GPU is usable."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print as JSON")


def run(args: argparse.Namespace) -> int:
    import pagedkv

    info = dict(pagedkv.build_info(), cuda_available=pagedkv.cuda_available())
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>15}: {v}")
    return 0
