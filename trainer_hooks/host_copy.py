"""Copy a network's weights (not its optimizer state) to host memory.

This is the only part of taking a snapshot that blocks training. On CPU
``Parameter.asnumpy()`` is a view of live memory that the next optimizer step
overwrites, so every array is copied. ``HostBuffers`` copies into host arrays
kept from one snapshot to the next (a plain memcpy after the first snapshot,
which allocates them); ``host_copy_of_weights`` makes fresh copies.

Device path (Ascend; UNMEASURED: no accelerator on the machine this was
written on, so it has never run). MindSpore 2.10's ``Tensor.copy_(src,
non_blocking=True)`` copies device->host asynchronously into a pinned host
tensor (``Tensor.pin_memory()``). ``_enqueue_device_copies`` enqueues every
parameter's copy on the current stream, behind the step that produced the
weights and ahead of the next step that changes them, records a
``mindspore.runtime.Event`` and returns at once: the training thread is
released once the copies are enqueued, and the writer thread waits on the
event before reading the buffers. Expected cost from the figures measured on
an H200 host with torch (docs/performance.md): pinned D2H ~55 GB/s of device
copy-engine time (14 GB: ~0.25 s, overlapping the next step's compute on
the host side), versus ~1.5 GB/s (~9 s of blocked training) through pageable
memory. ``Tensor.move_to(..., blocking=False)`` was not used: it is deprecated
and PyNative-only.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

import numpy as np

from evald.contracts.manifest import numpy_dtype_of

log = logging.getLogger("trainer_hooks.host_copy")

Weights = dict[str, np.ndarray]
# A partitioned snapshot (trainer_hooks.partition_plan) copies only some weights, some only in part:
# name -> the [start, stop) rows of its first dimension, or None for all of it.
Rows = Mapping[str, "tuple[int, int] | None"]


def weight_parameters(cell, optimizer=None) -> list[tuple[str, object]]:
    """The parameters of ``cell`` that a weights-only checkpoint holds.

    ``cell`` may be a bare network or a train network that contains the
    optimizer; the optimizer's state (moments, step counters, learning rate)
    is left out, the weights it optimizes and non-trainable buffers (e.g.
    BatchNorm statistics) are kept.
    """
    # Names relative to `cell` (not Parameter.name, which wrapper cells such as a
    # loss cell rename with their own prefix), so they match the bare network evald builds.
    named = list(cell.parameters_and_names())
    if optimizer is None:
        return named
    optimized = {id(p) for p in optimizer.parameters}
    state = {id(p) for p in optimizer.get_parameters()} - optimized
    return [(name, p) for name, p in named if id(p) not in state]


def host_copy_of_weights(cell, optimizer=None, rows: Rows | None = None) -> Weights:
    """``{parameter name: independent numpy copy}`` of the weights of ``cell`` (fresh arrays)."""
    return {name: np.array(_rows(p.asnumpy(), r), copy=True) for name, p, r in _planned(cell, optimizer, rows)}


def _planned(cell, optimizer, rows: Rows | None) -> list[tuple[str, object, "tuple[int, int] | None"]]:
    pairs = weight_parameters(cell, optimizer)
    return [(n, p, None) for n, p in pairs] if rows is None else [(n, p, rows[n]) for n, p in pairs if n in rows]


def _rows(array: np.ndarray, rows: "tuple[int, int] | None") -> np.ndarray:
    return array if rows is None else array[rows[0]:rows[1]]  # a contiguous view: the rows of a C array


class HostBuffers:
    """One set of host arrays shaped like a network's weights, reused by every snapshot.

    Not thread-safe by itself: its owner (SnapshotWriter) makes sure nobody
    reads the arrays while ``copy`` fills them and nobody fills them while the
    previous snapshot is still being written.
    """

    def __init__(self) -> None:
        self._arrays: Weights = {}
        self._pinned: dict[str, object] = {}
        self._device_async_failed = False

    @property
    def arrays(self) -> Weights:
        """The buffers as they stand (for inspection: the owner decides when they may be read)."""
        return dict(self._arrays)

    def allocate(self, cell, optimizer=None, rows: Rows | None = None) -> None:
        """Allocate and touch a buffer for every weight ahead of the first ``copy`` (CPU only).

        Reads shapes and dtypes, never parameter data, so it may run beside training.
        """
        if _device_target() != "CPU":
            return
        arrays = {}
        for name, param, part in _planned(cell, optimizer, rows):
            dtype = numpy_dtype_of(param.dtype)
            if dtype is None:
                continue  # left to the first copy
            shape = tuple(param.shape) if part is None else (part[1] - part[0], *tuple(param.shape)[1:])
            arrays[name] = np.empty(shape, dtype)
            arrays[name].fill(0)  # first touch here, not on the training thread
        self._arrays = arrays

    def copy(self, cell, optimizer=None, rows: Rows | None = None) -> Callable[[], Weights]:
        """Copy the weights of ``cell`` into the buffers; return ``ready() -> weights``.

        On CPU the copy is done when this returns and ``ready`` just hands over
        the buffers. On Ascend the copy may only be enqueued: ``ready`` waits for it.
        """
        planned = _planned(cell, optimizer, rows)
        if _device_target() == "Ascend" and not self._device_async_failed:
            try:
                return _enqueue_device_copies(planned, self._pinned)
            except Exception:  # the unmeasured path failed: say so once, then block instead
                self._device_async_failed = True
                log.exception("non-blocking device->host copy failed; snapshots use blocking copies")
        arrays = {}
        for name, param, part in planned:
            source = _rows(param.asnumpy(), part)
            target = self._arrays.get(name)
            if target is None or target.shape != source.shape or target.dtype != source.dtype:
                target = np.empty(source.shape, source.dtype)  # first snapshot (or a changed network)
            np.copyto(target, source)
            arrays[name] = target
        self._arrays = arrays
        return lambda: arrays


def _device_target() -> str:
    import mindspore as ms

    return str(ms.get_context("device_target"))


def _enqueue_device_copies(pairs, pinned: dict) -> Callable[[], Weights]:
    """UNMEASURED (needs Ascend): enqueue D2H copies into reused pinned tensors, return a waiter."""
    import mindspore as ms

    for name, param, _ in pairs:  # whole parameters: a planned row range is cut on the host (unmeasured)
        host = pinned.get(name)
        if host is None or tuple(host.shape) != tuple(param.shape) or host.dtype != param.dtype:
            host = pinned[name] = ms.Tensor(np.zeros(param.shape, numpy_dtype_of(param.dtype))).pin_memory()
        host.copy_(param, non_blocking=True)
    done = ms.runtime.Event()
    done.record(ms.runtime.current_stream())
    parts = [(name, part) for name, _, part in pairs]

    def ready() -> Weights:
        done.synchronize()
        return {name: _rows(pinned[name].asnumpy(), part) for name, part in parts}
    return ready
