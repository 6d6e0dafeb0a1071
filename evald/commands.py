"""evald's subcommands besides serving a run (``evald subset``, ``evald keys``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence


def run(name: str, argv: Sequence[str]) -> int:
    return {"subset": subset, "keys": keys}[name](argv)


def keys(argv: Sequence[str]) -> int:
    """Create CURVE key pairs for evald and the trainer, one directory per host, and say where each goes."""
    from evald.contracts.key_bundles import keys_command

    p = argparse.ArgumentParser(prog="evald keys", description=keys.__doc__ + " See docs/authentication.md.")
    p.add_argument("dir", metavar="DIR", help="a new directory (created 0700); existing keys are never overwritten")
    return keys_command(p.parse_args(list(argv)).dir)


def subset(argv: Sequence[str]) -> int:
    """Print the fixed validation subset: as recorded by an evald, or as evald would choose it."""
    from evald.config import EvaldConfig, default_of
    from evald.subset import RULE, SubsetInfo, select_subset

    fields = EvaldConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog="evald subset", description=subset.__doc__ + f". The rule: {RULE}.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--logdir", help="an evald log directory: print the subset it recorded (subset.json)")
    source.add_argument("--num-samples", type=int, help="the validation set's length")
    source.add_argument("--data-factory", help="module:function of the validation set (its length is used)")
    p.add_argument("--data-kwargs", type=json.loads, default={}, help="JSON kwargs of the data factory")
    p.add_argument("--app-dir", default=None, help="directory put first on sys.path for the factory")
    p.add_argument("--subset-size", type=int, default=default_of(fields["subset_size"]))
    p.add_argument("--subset-seed", type=int, default=default_of(fields["subset_seed"]))
    p.add_argument("--json", action="store_true", help="print subset.json's JSON instead of one index per line")
    args = p.parse_args(list(argv))
    if args.logdir:
        path = Path(args.logdir) / "subset.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            print(f"evald subset: {path} does not exist: has that evald built its network yet?", file=sys.stderr)
            return 2
        info = SubsetInfo(tuple(data["indices"]), data["num_samples"], data["subset_size"], data["seed"],
                          data["sha256"])
    else:
        size = args.num_samples
        if args.data_factory:
            from evald.contracts.wire import FactorySpec
            from evald.factories import call_factory

            size = len(call_factory(FactorySpec(args.data_factory, args.data_kwargs, args.app_dir), "data"))
        if size is None or size <= 0 or args.subset_size < 1 or args.subset_seed < 0:
            print("evald subset: --num-samples and --subset-size must be >= 1, --subset-seed >= 0", file=sys.stderr)
            return 2
        info = SubsetInfo.of(select_subset(size, args.subset_size, args.subset_seed), num_samples=size,
                             requested=args.subset_size, seed=args.subset_seed)
    if args.json:
        print(info.to_json())
    else:
        print(f"# {info.describe()}; sha256 {info.sha256}", file=sys.stderr)
        print("\n".join(str(i) for i in info.indices))
    return 0
