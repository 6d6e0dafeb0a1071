"""One rule for a checkpoint tensor whose dtype is not its network parameter's, for every loader.

Every way weights reach the network (an evald snapshot or its parts, a foreign ``.ckpt``/``.safetensors``,
MindFormers' Checkpoint 2.0, a tensor-parallel rank's slices) checks the dtypes here, from the manifest,
metadata or header before a byte is read where it can, and ``NetworkWeights.assign`` checks again before
it converts anything (evald.pipeline.swap.hot_swap):

* **the same kind converts**: a float into a float (bfloat16, float16, float32, float64: a bf16/fp16
  checkpoint into an fp32 evaluation network is common LLM practice), a signed integer into a signed
  integer. This is MindSpore's own rule (``load_param_into_net``, ``_type_convert``: floats among floats,
  integers among integers, with a warning). evald converts with ``Parameter.set_data`` and says so: in its
  log and in the provenance's swap check (``conversions``). A narrowing conversion must keep every value:
  an integer outside the network's range, or a finite float that would overflow the network's (an fp32
  value above 65504 into fp16), is refused, naming the parameter;
* **another kind is refused** (an integer into a float, a float into an integer, bool, unsigned into
  signed...): the values would be reinterpreted, not the weights the trainer had; a quantized checkpoint
  needs its own dequantization, which evald does not guess. The reason names the parameters and both dtypes.

Dtypes are compared by numpy's name (MindSpore registers ``bfloat16`` with numpy). A network parameter
whose dtype numpy cannot name (None in ``NetworkWeights.specs``: complex) is not checked here.
Imports only numpy.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

import numpy as np

FLOATS = ("float16", "bfloat16", "float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
              "float64": float("inf")}


def name_of(dtype: Any) -> str | None:
    """numpy's name of ``dtype`` (a numpy dtype, a type, a name, or MindSpore's dtype or its name:
    ``Float32``, ``BFloat16``, ``Bool``), or None when it is none of those."""
    if dtype is None:
        return None
    if not isinstance(dtype, str):
        try:
            return np.dtype(dtype).name
        except TypeError:
            dtype = str(dtype)  # a MindSpore dtype: its name
    lowered = dtype.lower()
    return _MINDSPORE_NAMES.get(lowered, lowered if lowered in _NUMPY_NAMES else dtype)


_NUMPY_NAMES = frozenset((*FLOATS, *SIGNED, "uint8", "uint16", "uint32", "uint64", "bool", "complex64",
                          "complex128"))
_MINDSPORE_NAMES = {"bool_": "bool"}   # the rest are numpy's names capitalised (Float32, UInt8, Complex64)


def kind(name: str) -> str:
    """``float``, ``signed integer``, or the dtype's own name (unsigned integers and bool convert to nothing)."""
    return "float" if name in FLOATS else "signed integer" if name in SIGNED else name


def problem(stored: Any, network: Any) -> str | None:
    """Why a tensor of dtype ``stored`` may not go into a parameter of dtype ``network``, or None."""
    a, b = name_of(stored), name_of(network)
    if a is None or b is None or a == b or kind(a) == kind(b) and kind(a) in ("float", "signed integer"):
        return None
    return f"{a} in the checkpoint, {b} in the network"


def refusal(pairs: Mapping[str, tuple[Any, Any]]) -> str | None:
    """The reason to refuse ``{parameter: (checkpoint dtype, network dtype)}``, naming every parameter
    whose dtypes are of different kinds (the first eight), or None when each converts."""
    bad = [(name, text) for name, (stored, network) in pairs.items() if (text := problem(stored, network))]
    if not bad:
        return None
    shown = "; ".join(f"{name}: {text}" for name, text in bad[:8])
    return (f"dtype of another kind [{shown}{'; …' if len(bad) > 8 else ''}] ({len(bad)}): an integer, bool or "
            f"unsigned tensor is not converted into a parameter of another kind (nor a float into one), since "
            f"its values would not be the trained weights; only float to float and signed integer to signed "
            f"integer convert (save the checkpoint in the network's dtypes, or build the network in the "
            f"checkpoint's)")


def conversions(pairs: Mapping[str, tuple[Any, Any]]) -> dict[str, int]:
    """``{"bfloat16→float32": count}`` of the parameters converted into the network's dtype."""
    found = Counter(f"{a}→{b}" for stored, network in pairs.values()
                    if (a := name_of(stored)) and (b := name_of(network)) and a != b)
    return dict(sorted(found.items()))


def describe(found: Mapping[str, int]) -> str:
    """``3 parameters converted (bfloat16→float32 ×3)`` or ``""``."""
    if not found:
        return ""
    total = sum(found.values())
    return (f"{total} parameter{'s' if total > 1 else ''} converted to the network's dtype "
            f"({', '.join(f'{pair} ×{count}' for pair, count in found.items())})")


def value_problem(name: str, array: np.ndarray, network: Any) -> str | None:
    """Why converting ``array`` into ``network``'s dtype would change a value (a narrowing conversion
    out of range), or None. Only narrowing conversions cost a pass over the values."""
    a, b = name_of(array.dtype), name_of(network)
    if a is None or b is None or a == b or not array.size:
        return None
    if a in SIGNED and b in SIGNED and np.dtype(a).itemsize > np.dtype(b).itemsize:
        info = np.iinfo(np.dtype(b))
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            return f"{name}: {a} values from {low} to {high} do not fit {b}"
    if a in FLOATS and b in FLOATS and _FLOAT_MAX[b] < _FLOAT_MAX[a]:
        values = np.asarray(array, np.float64)
        finite = values[np.isfinite(values)]
        if finite.size and float(np.abs(finite).max()) > _FLOAT_MAX[b]:
            return (f"{name}: a finite {a} value of magnitude {float(np.abs(finite).max()):.4g} overflows {b} "
                    f"(largest {_FLOAT_MAX[b]:.4g})")
    return None
