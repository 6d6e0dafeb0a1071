"""Put checkpoint weights into a compiled MindSpore network with no avoidable copy.

On CPU, ``Parameter.asnumpy()`` is a view of the parameter's live memory, the
memory the compiled graph reads (tests/unit/pipeline/test_hot_swap.py proves it bit for bit
against ``load_param_into_net``, across swaps A, B, A). So evald reads each
checkpoint file straight into those views: one read, no Tensor built, no
second copy. Where that does not hold (a device other than CPU, a parameter
whose view is not its own contiguous memory, or a checkpoint dtype that must
be converted) the weights go in with ``Parameter.set_data`` instead. Which dtypes
convert is evald.pipeline.swap.dtypes' one rule (float to float, signed integer to
signed integer, every value kept; nothing else).

Names are the network's relative names, from ``network.parameters_and_names()``,
which are the names the trainer hook writes; a prefix common to every name on one
side (a wrapper Cell in the model factory adds ``net.``) is fitted by evald.pipeline.swap.name_fit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from evald.contracts import layout
from evald.contracts.manifest import numpy_dtype_of
from evald.files.errors import CheckpointError, CheckpointFileBad
from evald.pipeline.swap import dtypes, name_fit

log = logging.getLogger("evald.pipeline.swap.hot_swap")


class NetworkMismatch(CheckpointError, ValueError):
    """The checkpoint's parameters do not fit the network (names, shapes, or dtypes of another kind): the
    checkpoint's failure, recorded with this reason whichever loader found it."""


class NetworkWeights:
    """The weights of one network: what they are, where they live, how to replace them.

    ``specs``: ``{name: (shape, numpy dtype)}``. ``in_place``: whether host
    views of live parameter memory may be written (None: decide from the
    device; False forces the ``set_data`` path). ``valid`` turns False when a
    load fails part way (the network then holds a mix and must not be
    evaluated) and True again after the next complete load.
    """

    def __init__(self, network: Any, *, in_place: bool | None = None) -> None:
        import mindspore as ms

        self._ms = ms
        self.network = network
        self._params = dict(network.parameters_and_names())
        self.specs = {name: (tuple(int(d) for d in p.shape), _numpy_dtype(p)) for name, p in self._params.items()}
        if in_place is None:
            in_place = ms.get_context("device_target") == "CPU"
        self.in_place = bool(in_place)
        self.valid = True

    def destinations(self) -> dict[str, np.ndarray] | None:
        """Writable host views of the live memory of every parameter that has one; None off CPU.

        Fetched afresh on each call: ``set_data`` gives a parameter new memory.
        """
        if not self.in_place:
            return None
        views = {}
        for name, param in self._params.items():
            view = _live_view(param, self.specs[name])
            if view is not None:
                views[name] = view
        return views

    def assign(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Put ``arrays`` (by network name) into the network, converting dtypes where needed.

        An array that already is a parameter's live view (read in place) costs
        nothing; one of the parameter's shape and dtype is copied into its live
        memory; anything else goes through ``Parameter.set_data``, which may keep
        a reference to the array: do not modify it afterwards.
        """
        self.check_fit({n: (tuple(a.shape), a.dtype) for n, a in arrays.items()}, complete=False)
        converted = {n: (a.dtype, self.specs[n][1]) for n, a in arrays.items()
                     if self.specs[n][1] is not None and a.dtype != self.specs[n][1]}
        problems = [p for n in converted if (p := dtypes.value_problem(n, arrays[n], self.specs[n][1]))]
        if problems:
            raise CheckpointFileBad(f"the checkpoint's values do not fit the network's dtypes: {'; '.join(problems[:8])}"
                                    f"{' …' if len(problems) > 8 else ''} ({len(problems)}); save it in the "
                                    f"network's dtypes or build the network in the checkpoint's")
        if converted:
            log.info("%s (evald.pipeline.swap.dtypes)", dtypes.describe(dtypes.conversions(converted)))
        views = self.destinations() or {}
        for name, array in arrays.items():
            view = views.get(name)
            if view is not None and view.dtype == array.dtype:
                if not np.shares_memory(view, array):
                    np.copyto(view, array)
                continue
            param = self._params[name]
            param.set_data(self._ms.Tensor(np.asarray(array, order="C"), dtype=param.dtype))  # 0-d stays 0-d

    def load(self, step_dir: Path, manifest: layout.Manifest, *, strict: bool = True,
             threads: int | None = None) -> dict[str, str]:
        """Swap in a committed evald-layout checkpoint; ``{name: "in place" | "set_data"}``.

        Checks the fit from the manifest before reading a byte (NetworkMismatch,
        network untouched); reads every file once, verifying it, straight into
        the live memory where it can (LayoutError if a file is bad: then
        ``valid`` is False until a later load succeeds).
        """
        specs = {p.name: (p.shape, np.dtype(p.dtype)) for p in manifest.params}
        to_net = name_fit.to_network_names(specs, self.specs)  # checkpoint name -> network name
        self.check_fit({to_net[n]: s for n, s in specs.items()}, complete=True, strict=strict)
        views = self.destinations() or {}
        wanted = {n: views[to_net[n]] for n in specs if to_net[n] in views and specs[n][1] == views[to_net[n]].dtype}
        self.valid = False
        arrays = layout.read_checkpoint(step_dir, manifest, into=wanted, threads=threads)
        rest = {to_net[n]: a for n, a in arrays.items() if n not in wanted and to_net[n] in self._params}
        self.assign(rest)
        self.valid = True
        return {to_net[n]: ("in place" if n in wanted else "set_data") for n in arrays if to_net[n] in self._params}

    def check_fit(self, specs: Mapping[str, tuple], *, complete: bool, strict: bool = True) -> None:
        """NetworkMismatch naming every missing, unexpected or mis-shaped parameter, and every one whose
        dtype is of another kind than the network's (evald.pipeline.swap.dtypes)."""
        missing = sorted(set(self.specs) - set(specs)) if complete else []
        unexpected = sorted(set(specs) - set(self.specs)) if strict or not complete else []
        shapes = [f"{n}: checkpoint {tuple(s[0])} vs network {self.specs[n][0]}"
                  for n, s in specs.items() if n in self.specs and tuple(s[0]) != self.specs[n][0]]
        problems = [f"{what} {_few(names)}" for what, names in
                    (("missing parameters", missing), ("unexpected parameters", unexpected),
                     ("shape mismatch", shapes)) if names]
        hint = f" ({name_fit.explain(specs, self.specs)})" if problems else ""
        kinds = dtypes.refusal({n: (s[1], self.specs[n][1]) for n, s in specs.items() if n in self.specs})
        if kinds:
            problems.append(kinds)
        if problems:
            raise NetworkMismatch("checkpoint does not fit the evaluation network: " + "; ".join(problems) + hint)


def _numpy_dtype(param) -> np.dtype | None:
    return numpy_dtype_of(param.dtype)  # None e.g. for bfloat16 when numpy has no such dtype


def _live_view(param, spec: tuple) -> np.ndarray | None:
    """``param.asnumpy()`` if it is provably the parameter's own memory, else None."""
    shape, dtype = spec
    try:
        view = param.asnumpy()
        pointer = param.data_ptr()
    except Exception:  # no host view for this parameter (device memory, exotic dtype): use set_data
        return None
    if not (isinstance(view, np.ndarray) and view.size and view.shape == shape and view.dtype == dtype
            and not view.flags.owndata and view.flags.writeable and view.flags.c_contiguous
            and view.ctypes.data == pointer):
        return None
    return view


def _few(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{', …' if len(names) > limit else ''}] ({len(names)})"
