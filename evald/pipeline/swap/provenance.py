"""Which weights, samples and settings produced a point, and whether two points can be compared.

Every evaluation records (in the ledger's ``provenance`` table and as the TensorBoard text
``evald/provenance`` at its step):

* ``weights_sha256``: for an evald-layout checkpoint, the sha256 of the manifest's per-file
  digests, each named with its check (xxh3-128 or sha256; each verified while the file was read,
  so it costs nothing; as strong as that check: docs/security.md); for a foreign file, the
  sha256 of the parameters as MindSpore loaded them;
* ``run_id``, ``step`` and ``source`` (the file the step was read from);
* ``subset_sha256``: the fixed subset's indices (evald.pipeline.subset);
* ``config_sha256``: the sha256 of the effective evaluation config, every setting that can change
  a number: task, model and data factories with their kwargs, subset size and seed, batch size,
  generation settings, metric plug-ins and evald's version (``config`` holds them);
* ``swap_check``: how the hot swap was proven (evald.pipeline.swap.swap_check).

Two points are comparable only when their subset and config hashes agree. When either changes
between two evaluations of a run, the later one also gets the text ``evald/comparability``
saying what changed, so a chart's jump is never mistaken for the model's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping

from evald import __version__

TAG = "evald/provenance"
CHANGE_TAG = "evald/comparability"
STATE_KEY = "provenance"  # kv: the subset and config of the last evaluation


@dataclasses.dataclass(frozen=True)
class EvaluationSpec:
    """Every setting that can change a number of the default evaluation; the network is built for one.

    Two specs that compare equal give the same numbers on the same weights, so the pipeline
    rebuilds only when the spec changes, and ``identity()`` is what provenance records.
    """

    task: str
    model: Any             # evald.contracts.wire.FactorySpec
    data: Any              # evald.contracts.wire.FactorySpec
    subset_size: int
    subset_seed: int
    batch_size: int
    generation: Any        # evald.config.GenerationOptions
    metric_plugins: tuple = ()

    def identity(self) -> dict[str, Any]:
        """The spec as plain JSON (factory search paths left out: a place, not a setting)."""
        generation = self.generation
        return {"task": self.task, "model": _factory(self.model), "data": _factory(self.data),
                "subset_size": self.subset_size, "subset_seed": self.subset_seed, "batch_size": self.batch_size,
                "generation": dataclasses.asdict(generation) if dataclasses.is_dataclass(generation) else generation,
                "metric_plugins": [dict(p) for p in self.metric_plugins], "evald": __version__}


def sha256_of(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def complete(found: Mapping[str, Any], *, run_id: str | None, step: int, source: str) -> dict[str, Any]:
    """What the evaluator found (weights, subset, config, swap check) with the step's identity."""
    config = found.get("config") or {}
    return {"run_id": run_id, "step": step, "source": source, "weights_sha256": found.get("weights_sha256"),
            "weights_digest_of": found.get("weights_digest_of"), "subset_sha256": found.get("subset_sha256"),
            "config_sha256": sha256_of(config), "config": config, "swap_check": found.get("swap_check")}


def text(record: Mapping[str, Any]) -> str:
    """The TensorBoard text: one Markdown line per field, short hashes first (the ledger has them whole)."""
    rows = [("weights", f"`{record['weights_sha256']}` ({record['weights_digest_of']})"),
            ("run", record["run_id"]), ("step", f"{record['step']} ({record['source']})"),
            ("subset", f"`{record['subset_sha256']}`"), ("config", f"`{record['config_sha256']}`"),
            ("hot swap", record["swap_check"])]
    return "  \n".join(f"**{name}**: {value}" for name, value in rows)


def change(previous: Mapping[str, Any] | None, record: Mapping[str, Any]) -> str | None:
    """Why this point cannot be compared with the previous one, or None when it can."""
    if not previous:
        return None
    changed = []
    if previous.get("subset_sha256") != record["subset_sha256"]:
        changed.append(f"the subset ({str(previous.get('subset_sha256'))[:12]} -> {str(record['subset_sha256'])[:12]})")
    if previous.get("config_sha256") != record["config_sha256"]:
        old, new = previous.get("config") or {}, record["config"]
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        changed.append(f"the evaluation config ({', '.join(keys) or 'unknown'}: "
                       f"{str(previous.get('config_sha256'))[:12]} -> {record['config_sha256'][:12]})")
    if not changed:
        return None
    return (f"not comparable with step {previous.get('step')}: {' and '.join(changed)} changed between them; "
            f"points before and after measure different things")


def state(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the next evaluation compares itself with."""
    return {key: record[key] for key in ("step", "subset_sha256", "config_sha256", "config")}


def _factory(spec: Any) -> dict[str, Any] | None:
    return None if spec is None else {"target": spec.target, "kwargs": dict(spec.kwargs)}
