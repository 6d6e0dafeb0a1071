"""Fitting a checkpoint's parameter names to the evaluation network's, and saying what differs.

A checkpoint and the network built by the model factory name the same weights the same
way except, sometimes, for a prefix that a wrapper Cell puts in front of EVERY name on
one side:

* checkpoint side: ``network.model.w`` saved from a train cell, or ``adam_m.model.w``,
  the optimizer's moment of ``model.w``;
* network side: ``net.w`` when the model factory wraps the model in a Cell (the obvious
  way to return logits from a model that returns a tuple).

``fit`` tries every pair (prefix removed from checkpoint names, prefix added for the
network) where the network-side prefix is common to every network name, and keeps the
pair under which the most network parameters are found, the shortest pair on a tie.
Optimizer state always carries a prefix of its own on top of the weights', so it never
wins against them. Two different pairs that are equally good are ambiguous: nothing is
chosen and ``explain`` names them. ``explain`` says what differs when nothing fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable


@dataclass(frozen=True)
class Fit:
    mapping: dict[str, str] = field(default_factory=dict)  # checkpoint name -> network name
    strip: str = ""                 # removed from the front of checkpoint names
    add: str = ""                   # then added to give the network's names
    ambiguous: tuple[tuple[str, str], ...] = ()  # other (strip, add) pairs exactly as good


def common_prefixes(names: Iterable[str]) -> list[str]:
    """Dotted prefixes (``"a."``, ``"a.b."``) that every name starts with, shortest first."""
    names = list(names)
    if not names:
        return []
    parts = [n.split(".")[:-1] for n in names]
    shared: list[str] = []
    for column in zip(*parts):
        if any(c != column[0] for c in column):
            break
        shared.append(column[0])
    return [".".join(shared[:i]) + "." for i in range(1, len(shared) + 1)]


def fit(ckpt_names: Iterable[str], net_names: Collection[str]) -> Fit:
    """The best unambiguous (strip, add) pair and the names it maps (see the module doc)."""
    ckpt_names = list(ckpt_names)
    net = set(net_names)
    candidates: dict[tuple[str, str], dict[str, str]] = {}
    for add in ["", *common_prefixes(net)]:
        wanted = {n[len(add):]: n for n in net if n.startswith(add)}
        for name in ckpt_names:
            parts = name.split(".")
            for i in range(len(parts)):
                target = wanted.get(".".join(parts[i:]))
                if target is not None:
                    strip = ".".join(parts[:i]) + ("." if i else "")
                    candidates.setdefault((strip, add), {})[name] = target
    if not candidates:
        return Fit()

    def key(pair: tuple[str, str]) -> tuple[int, int]:
        return -len(set(candidates[pair].values())), len(pair[0]) + len(pair[1])

    best = min(candidates, key=lambda pair: (key(pair), pair))
    ties = tuple(p for p in candidates if p != best and key(p) == key(best)
                 and set(candidates[p].values()) == set(candidates[best].values()))
    if ties:
        return Fit({}, best[0], best[1], ties)
    return Fit(candidates[best], best[0], best[1])


def to_network_names(ckpt_names: Iterable[str], net_names: Collection[str]) -> dict[str, str]:
    """``{checkpoint name: network name}`` for every checkpoint name; names that do not fit stay as they are."""
    ckpt_names = list(ckpt_names)
    found = fit(ckpt_names, net_names).mapping
    return {name: found.get(name, name) for name in ckpt_names}


def explain(ckpt_names: Iterable[str], net_names: Collection[str]) -> str:
    """One sentence for the user: what differs between the two sets of names."""
    ckpt_names, net = sorted(ckpt_names), sorted(net_names)
    found = fit(ckpt_names, net)
    if found.ambiguous:
        pairs = [(found.strip, found.add), *found.ambiguous]
        shown = " and ".join(_pair(strip, add) for strip, add in pairs[:3])
        return (f"the network's names are found in the checkpoint equally well {shown}: cannot tell which "
                f"entries are the weights")
    covered = len(set(found.mapping.values()))
    if covered == len(net):
        return "every network parameter is there; the shapes differ: another model config (sizes, vocabulary)?"
    if covered:
        how = _pair(found.strip, found.add)
        missing = sorted(set(net) - set(found.mapping.values()))
        return (f"{covered} of {len(net)} network parameters are there ({how}), not e.g. {missing[0]!r}: "
                f"another model or model config (layers, heads)?")
    ckpt_common, net_common = common_prefixes(ckpt_names), common_prefixes(net)
    sides = []
    for what, common in (("checkpoint", ckpt_common), ("network", net_common)):
        if common:
            sides.append(f"every {what} name starts with {common[-1]!r}")
    example = (f"the checkpoint's names look like {ckpt_names[0]!r} and the network's like {net[0]!r}"
               if ckpt_names and net else "one side has no parameters at all")
    prefixes = f" ({'; '.join(sides)})" if sides else ""
    return (f"no name matches, even after removing a prefix common to every name on either side: "
            f"{example}{prefixes}; was it saved from another model?")


def _pair(strip: str, add: str) -> str:
    if not strip and not add:
        return "under the same names"
    parts = []
    if strip:
        parts.append(f"checkpoint prefix {strip!r} removed")
    if add:
        parts.append(f"network prefix {add!r} added")
    return "with " + " and ".join(parts)
