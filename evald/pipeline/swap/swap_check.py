"""Proof of a hot swap: after the swap, the network's parameters hold exactly the checkpoint's weights.

The read already verified each file against the manifest's digest as its bytes went into the
parameters' memory (evald.pipeline.swap.hot_swap). What that cannot see is anything after or around the read:
a parameter that was not written (left from the previous checkpoint), a name mapped to the wrong
parameter, a ``set_data`` that did not take, a conversion that went wrong. So the live parameter
memory (``Parameter.asnumpy()``, fetched afresh) is compared with the checkpoint itself:

* ``sampled`` (default): in every parameter, ``WINDOWS`` windows of ``WINDOW`` contiguous
  elements (always the first and the last element, the rest at positions seeded by the step and
  the name) are compared with the same elements read back from the file (``os.pread``); a few
  kilobytes per parameter, whatever the model's size;
* ``full``: every file's digest (the manifest's check) is recomputed over its header and the live memory of its
  tensors, in file order, and compared with the manifest's digest: the network holds exactly
  the bytes the trainer committed. Costs one hash pass over the weights (bench/swap_check.py);
* ``off``.

A partitioned step (evald.files.parts) is checked part by part: each part's files against the
live memory of the regions of the parameters that part holds.

A foreign file (MindSpore's own checkpoints) has no manifest: its weights as MindSpore loaded
them are compared with the live memory (sampled: the same windows; full: every element).
A parameter converted to the network's dtype is compared after the same conversion. The checkpoint's
names are fitted to the network's as the load fitted them (evald.pipeline.swap.name_fit: a wrapper
Cell's ``net.``), and every loaded parameter must be compared (or have no host view: listed, and a
check that compared none says "not verified"); a check that cannot find one in the network is a
SwapMismatch, never "verified". The files are opened as their load opened them
(evald.contracts.safetensors_io.open_weights): a file replaced by a FIFO or a link after the load is a
CheckpointFileBad at once, never waited on. A mismatch raises SwapMismatch, which evald treats as its own unexpected error (the step is retried, never
blamed on the checkpoint) and the network is marked invalid until a later swap succeeds.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from evald.contracts import layout
from evald.contracts import safetensors_io as sio
from evald.contracts.manifest import numpy_dtype_of
from evald.files.errors import CheckpointDeleted, CheckpointFileBad
from evald.pipeline.swap import dtypes, name_fit

MODES = ("off", "sampled", "full")
WINDOWS, WINDOW = 4, 8


class SwapMismatch(RuntimeError):
    """The network does not hold the checkpoint's weights after the swap: a bug, not a bad checkpoint."""


@dataclass
class SwapCheck:
    mode: str
    parameters: int = 0          # parameters compared
    elements: int = 0            # elements compared one by one
    hashed_bytes: int = 0        # bytes of live memory re-hashed (full)
    unchecked: list[str] = field(default_factory=list)  # parameters with no host view of their memory
    seconds: float = 0.0
    conversions: dict[str, int] = field(default_factory=dict)  # {"bfloat16→float32": count} (evald.pipeline.swap.dtypes)

    def describe(self) -> str:
        converted = f"; {dtypes.describe(self.conversions)}" if self.conversions else ""
        if self.mode == "off":
            return f"not checked (--tuning verify_swap off){converted}"
        if not self.parameters:
            return (f"not verified ({self.mode}): none of the {len(self.unchecked)} parameters has a host view to "
                    f"compare, {self.seconds * 1e3:.1f} ms{converted}")
        what = (f"{self.hashed_bytes} bytes re-hashed against the manifest" if self.hashed_bytes
                else f"{self.elements} sampled elements compared with the checkpoint")
        rest = f"; {len(self.unchecked)} without a host view not checked" if self.unchecked else ""
        return (f"verified ({self.mode}): {self.parameters} parameters, {what}{rest}, {self.seconds * 1e3:.1f} ms"
                f"{converted}")


def check(params: Mapping[str, object], *, mode: str, step: int, step_dir: Path | None = None,
          manifest: layout.Manifest | None = None, loaded: Mapping[str, np.ndarray] | None = None) -> SwapCheck:
    """Compare the live memory of ``params`` (name -> mindspore Parameter) with the checkpoint:
    ``step_dir`` + ``manifest`` for the evald layout, ``loaded`` (MindSpore's load) for a foreign file.
    The checkpoint's names are fitted to the network's as the load fitted them (evald.pipeline.swap.name_fit:
    a wrapper's ``net.``); a loaded parameter the check cannot find in the network is a SwapMismatch."""
    started = time.perf_counter()
    stored = ({p.name: p.dtype for p in manifest.params} if manifest is not None
              else {n: np.asarray(a).dtype for n, a in (loaded or {}).items()})
    result = SwapCheck(mode, conversions=_conversions(params, stored))
    if mode == "off":
        return result
    names = list(stored)
    live, shown = _live(params, names, result)
    if manifest is not None and mode == "full":
        _full_against_manifest(live, shown, step_dir, manifest, result)
    elif manifest is not None:
        _sampled_against_files(live, shown, step_dir, manifest, step, result)
    else:
        _against_loaded(live, shown, loaded or {}, mode, step, result)
    _all_compared(result, len(names), step_dir.name if manifest is not None and step_dir else "the checkpoint")
    result.seconds = time.perf_counter() - started
    return result


def _live(params: Mapping[str, object], names: Sequence[str], result: SwapCheck
          ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each checkpoint name's live memory (a host view of the network parameter the load put it in), and the
    network's name for it; a name with no parameter in the network is a SwapMismatch (the load put it
    somewhere the check cannot see); one without a host view is listed in ``result.unchecked``."""
    to_net = name_fit.to_network_names(names, params)
    lost = [n for n in names if to_net[n] not in params]
    if lost:
        raise SwapMismatch(f"after the swap, the check finds no network parameter for {len(lost)} loaded "
                           f"parameter(s) ({', '.join(lost[:8])}{', …' if len(lost) > 8 else ''}): the names it "
                           f"compares are not the ones the load wrote, so it cannot prove the swap")
    live = {}
    for name in names:
        view = _host_view(params[to_net[name]])
        if view is None:
            result.unchecked.append(to_net[name])
        else:
            live[name] = view
    return live, to_net


def _conversions(params: Mapping[str, object], stored: Mapping[str, Any]) -> dict[str, int]:
    """Which checkpoint dtypes the load converted into which network dtypes, and how many parameters."""
    to_net = name_fit.to_network_names(stored, params)
    return dtypes.conversions({n: (dtype, numpy_dtype_of(getattr(params[to_net[n]], "dtype", None)))
                               for n, dtype in stored.items() if to_net[n] in params})


def _all_compared(result: SwapCheck, expected: int, where: str) -> None:
    """Every parameter loaded was compared or has no host view to compare; anything else is not a proof."""
    if result.parameters + len(result.unchecked) != expected:
        raise SwapMismatch(f"the swap check of {where} compared {result.parameters} of {expected} parameters "
                           f"({len(result.unchecked)} without a host view): the swap is not proven")


@dataclass(frozen=True)
class PartsRead:
    """The parts one partitioned step was read from: (part directory, its manifest) each."""

    members: tuple[tuple[Path, layout.Manifest], ...]


def check_parts(params: Mapping[str, object], *, mode: str, step: int, parts: PartsRead) -> SwapCheck:
    """``check`` for a partitioned step: each part against the live regions of the parameters it holds."""
    started = time.perf_counter()
    stored = {p.name: p.dtype for _, m in parts.members for p in m.params}
    result = SwapCheck(mode, conversions=_conversions(params, stored))
    if mode == "off":
        return result
    expected = 0
    for step_dir, manifest in parts.members:
        names = [p.name for p in manifest.params]
        expected += len(names)
        views, shown = _live(params, names, result)
        live = {}
        for p in manifest.params:
            if p.name in views:
                region = p.sliced.region if p.sliced is not None else ()
                live[p.name] = views[p.name][tuple(slice(a, b) for a, b in region)]
        if mode == "full":
            _full_against_manifest(live, shown, step_dir, manifest, result)
        else:
            _sampled_against_files(live, shown, step_dir, manifest, step, result)
    _all_compared(result, expected, f"the {len(parts.members)} parts")
    result.seconds = time.perf_counter() - started
    return result


def parts_digest(parts: PartsRead) -> tuple[str, str]:
    """``weights_digest`` of a partitioned step: over every part's verified file digests, in part order."""
    listing = "\n".join(f"{path.name}/{f.name} {m.hash_algorithm}:{f.digest}" for path, m in parts.members
                        for f in m.files)
    checks = "/".join(dict.fromkeys(m.hash_algorithm for _, m in parts.members))
    return hashlib.sha256(listing.encode()).hexdigest(), f"sha256 of every part's verified {checks} file digests"


def _host_view(param) -> np.ndarray | None:
    try:
        view = param.asnumpy()  # type: ignore[union-attr]
    except Exception:  # bfloat16 or device memory: no host view to compare
        return None
    return view if isinstance(view, np.ndarray) else None


def _open(step_dir: Path, spec: layout.FileSpec):
    """A weights file of the checkpoint, opened as its load opened it (no link, FIFO or device; its size)."""
    try:
        return sio.open_weights(step_dir / spec.name, spec.bytes, step_dir.parent)
    except sio.WeightsFileMissing as exc:
        raise CheckpointDeleted(f"{step_dir.name}/{spec.name}: deleted before the swap check read it") from exc
    except sio.WeightsFileError as exc:
        raise CheckpointFileBad(f"{exc} (after the swap, for its check)") from exc


def _sampled_against_files(live, shown, step_dir, manifest, step, result) -> None:
    for spec in manifest.files:
        params = [p for p in manifest.params if p.file == spec.name]
        if not any(p.name in live for p in params):
            continue
        with _open(step_dir, spec) as opened:
            offsets = {p.name: p.offset for p in params}
            if None in offsets.values():  # layout version 1: offsets from the header
                offsets = {seg.name: seg.offset for seg in _header_segments(opened)}
            for p in params:
                if p.name not in live:
                    continue
                offset, dtype = offsets[p.name], sio.numpy_dtype(p.dtype)
                flat = live[p.name].reshape(-1)
                for start in _windows(flat.size, step, p.name):
                    count = min(WINDOW, flat.size - start)
                    raw = opened.pread(count * dtype.itemsize, offset + start * dtype.itemsize)
                    expected = np.frombuffer(raw, dtype=dtype.newbyteorder("<"))
                    _compare(shown[p.name], flat[start:start + count], expected, start,
                             f"{spec.name} at byte {offset}")
                    result.elements += count
                result.parameters += 1


def _full_against_manifest(live, shown, step_dir, manifest, result) -> None:
    for spec in manifest.files:
        with _open(step_dir, spec) as opened:
            offsets = {p.name: p.offset for p in manifest.params if p.file == spec.name}
            if None in offsets.values():  # layout version 1: the header has the offsets
                offsets = {s.name: s.offset for s in _header_segments(opened)}
            params = sorted((p for p in manifest.params if p.file == spec.name), key=lambda p: offsets[p.name])
            hasher = sio.HASHES[manifest.hash_algorithm]()
            hasher.update(opened.pread(min(offsets.values(), default=spec.bytes), 0))  # length prefix + header
            for p in params:
                view, dtype = live.get(p.name), sio.numpy_dtype(p.dtype)
                if view is not None and view.dtype == dtype:
                    hasher.update(memoryview(np.ascontiguousarray(view)).cast("B"))
                    result.hashed_bytes += view.nbytes
                else:  # converted to the network's dtype, or no host view: hash the file's own bytes
                    raw = opened.pread(int(np.prod(p.shape)) * dtype.itemsize, offsets[p.name])
                    if view is not None:
                        _compare(shown[p.name], view.reshape(-1), np.frombuffer(raw, dtype.newbyteorder("<")), 0,
                                 spec.name)
                        result.elements += view.size
                    hasher.update(raw)
                result.parameters += view is not None
        if hasher.hexdigest() != spec.digest:
            raise SwapMismatch(f"after the swap, the live memory of the parameters in {step_dir.name}/{spec.name} does "
                               f"not hash to the manifest's {manifest.hash_algorithm} {spec.digest[:16]}…: the network "
                               f"does not hold the checkpoint's weights")


def _against_loaded(live, shown, loaded, mode, step, result) -> None:
    for name, view in live.items():
        source = np.asarray(loaded[name]).reshape(-1)
        flat = view.reshape(-1)
        if mode == "full":
            _compare(shown[name], flat, source, 0, "MindSpore's load of the file")
            result.elements += flat.size
        else:
            for start in _windows(flat.size, step, name):
                _compare(shown[name], flat[start:start + WINDOW], source[start:start + WINDOW], start,
                         "MindSpore's load of the file")
                result.elements += min(WINDOW, flat.size - start)
        result.parameters += 1


def _windows(size: int, step: int, name: str) -> list[int]:
    """Start positions: the first and last element's windows, the others spread by a hash of step and name."""
    if size <= WINDOWS * WINDOW:
        return list(range(0, size, WINDOW))
    seed, span = zlib.crc32(f"{step}:{name}".encode()), size - 3 * WINDOW
    middle = (WINDOW + (seed * 2654435761 * (i + 1)) % span for i in range(WINDOWS - 2))  # Knuth's multiplier
    return sorted({0, size - WINDOW, *middle})


def _compare(name: str, live: np.ndarray, expected: np.ndarray, start: int, where: str) -> None:
    """Bit for bit, after converting ``expected`` to the live dtype as the swap would have."""
    expected = expected.astype(live.dtype) if expected.dtype != live.dtype else expected
    if live.size == expected.size and live.size <= 1024 and live.tobytes() == expected.tobytes():
        return  # the usual case, a window: cheaper than anything below
    a = np.ascontiguousarray(live).view(np.uint8).reshape(live.size, -1)
    b = np.ascontiguousarray(expected).view(np.uint8).reshape(expected.size, -1)
    if a.shape == b.shape and np.array_equal(a, b):
        return
    bad = int(np.flatnonzero((a != b).any(axis=1))[0]) if a.shape == b.shape else 0
    raise SwapMismatch(f"after the swap, parameter {name!r} holds {live.reshape(-1)[bad]!r} at element {start + bad} "
                       f"where the checkpoint ({where}) has {expected.reshape(-1)[bad]!r}: the network does not hold "
                       f"the checkpoint's weights")


def _header_segments(opened) -> list[sio.Segment]:
    """Segments of a version-1 weights file, from its safetensors header (no offsets in its manifest)."""
    length = int.from_bytes(opened.pread(8, 0), "little")
    header = opened.pread(min(length, sio.MAX_HEADER_BYTES), 8)
    try:
        entries = json.loads(header)
        return [sio.Segment(n, "", (), 8 + len(header) + int(e["data_offsets"][0]))
                for n, e in entries.items() if n != "__metadata__"]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CheckpointFileBad(f"{opened.shown}: its safetensors header changed after the swap "
                                f"({type(exc).__name__})") from exc


def weights_digest(manifest: layout.Manifest | None, loaded: Mapping[str, np.ndarray] | None) -> tuple[str, str]:
    """(digest, what it is a digest of) identifying the weights that were evaluated."""
    if manifest is not None:
        listing = "\n".join(f"{f.name} {manifest.hash_algorithm}:{f.digest}" for f in manifest.files)
        return (hashlib.sha256(listing.encode()).hexdigest(),
                f"sha256 of the manifest's verified {manifest.hash_algorithm} file digests")
    hasher = hashlib.sha256()
    for name in sorted(loaded or {}):
        array = np.ascontiguousarray(loaded[name])  # type: ignore[index]
        hasher.update(f"{name} {array.dtype.str} {array.shape}\n".encode())
        hasher.update(memoryview(array).cast("B"))
    return hasher.hexdigest(), "sha256 of the parameters as MindSpore loaded them (name, dtype, shape, bytes)"
