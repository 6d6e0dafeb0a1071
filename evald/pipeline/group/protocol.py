"""An eval group's traffic: rank 0 gives commands, every rank answers, partial results are summed.

One msrun group evaluates each checkpoint on several devices (docs/eval-group.md). Rank 0
owns the ledger, the sockets and the decisions; the other ranks only do what rank 0 says.
Everything travels through MindSpore's AllReduce SUM on float32, the one reduction every
backend has (on CPU, MAX and float64 are refused), and always with exactly one non-zero
contributor per value:

* a command is rank 0's bytes, zeros elsewhere: the SUM is a broadcast;
* an answer is each rank's own rows of full-size arrays, zeros elsewhere, plus a status slot.

``x + 0 + ... + 0`` is exact, and every value travels as 16-bit limbs (each exact in float32),
so rank 0 receives, bit for bit, the per-sample arrays that one device would have computed.

A collective that waits too long fails (on CPU after ``MS_CPU_COMM_OP_TIMEOUT``, 30 s by
default), so rank 0 sends a NOOP command every ``HEARTBEAT_S`` while it has nothing to do.

The collective itself is MindSpore's and unauthenticated: whoever joins msrun's group in a rank's
place adds to every SUM, and could change the commands (a BUILD names factories every rank imports)
and the numbers (docs/security.md, "The eval group's channel"). So with the group's ``key`` (a secret
the launcher gives every rank: evald.daemon.eval_group) every command carries an HMAC-SHA256 tag over
its sequence number, op and payload, checked by every rank, and every rank's status slot in an answer
carries a tag over the sequence number, its rank, code and text, checked by every rank: a process
without the key cannot give a command or answer for a rank, so a stranger in the group ends it with
``GroupError`` before anything it touched is used.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any, Callable, Mapping

import numpy as np

log = logging.getLogger("evald.group")

NOOP, BUILD, EVALUATE, EXIT = 1, 2, 3, 4
SWAP, SCORE, GENERATE = 5, 6, 7   # benchmark suites: load a step's weights; score or generate a share of requests
WARM = 8                          # a suite's scorer: compile its graphs on the ranks that take part, say the vocabulary
OP_NAMES = {NOOP: "noop", BUILD: "build", EVALUATE: "evaluate", EXIT: "exit", SWAP: "swap", SCORE: "score",
            GENERATE: "generate", WARM: "warm"}
ANSWERED = (BUILD, EVALUATE, SWAP, SCORE, GENERATE, WARM)   # commands every rank answers
OK, FAILED, DELETED, ERROR = 0, 1, 2, 3   # a rank's answer: evaluated, bad checkpoint, gone, unexpected
BAD_FILE = 4   # a file of the checkpoint is bad (digest, size, not a regular file): failed whichever rank found it
HEARTBEAT_S = 5.0
STATUS_BYTES = 2048                       # room for one rank's error text in an answer
TAG_BYTES = 32                            # HMAC-SHA256

Layout = Mapping[str, tuple[tuple[int, ...], Any]]   # name -> (full shape, dtype)
ReduceSum = Callable[[np.ndarray], np.ndarray]       # float32 vector -> its sum over the ranks


class GroupError(RuntimeError):
    """The group's collective traffic broke (a rank died or the ranks fell out of step)."""


class GroupForged(GroupError):
    """A command or answer failed its authentication: a process without the group's key took part."""


def _tag(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts``, each length-prefixed (no two different lists of parts share a message)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.digest()


_FORGED = ("a process without the eval group's key took part in msrun's group (another process joined it in a "
           "rank's place?); the group is ended. Keep msrun's ports reachable only by the group's hosts "
           "(docs/security.md, \"The eval group's channel\")")


def to_limbs(array: np.ndarray) -> np.ndarray:
    """Any array's bytes as 16-bit limbs in float32 (each limb exact)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if raw.size % 2:
        raw = np.concatenate([raw, np.zeros(1, np.uint8)])
    return raw.view(np.uint16).astype(np.float32)


def from_limbs(limbs: np.ndarray, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of ``to_limbs``: the array of ``dtype`` and ``shape`` the limbs carry."""
    if not np.all((limbs >= 0) & (limbs <= 0xFFFF) & (limbs == np.rint(limbs))):
        raise GroupError("an answer holds a value that is not a 16-bit limb: two ranks wrote the same "
                         "element, or the ranks fell out of step")
    raw = limbs.astype(np.uint16).view(np.uint8)
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return raw[:size].copy().view(dtype).reshape(shape)


def limb_count(shape: tuple[int, ...], dtype: Any) -> int:
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return (size + 1) // 2


def mindspore_sum() -> ReduceSum:
    """AllReduce SUM over the world group in a Graph-mode cell; lengths are padded to powers of two
    so a handful of shapes compile once each."""
    import mindspore as ms
    from mindspore import nn, ops

    class _Sum(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM)

        def construct(self, x):
            return self.all_reduce(x)

    cell = _Sum()

    def reduce_sum(vector: np.ndarray) -> np.ndarray:
        length = max(16, 1 << (int(vector.size) - 1).bit_length())
        padded = np.zeros(length, np.float32)
        padded[:vector.size] = vector
        return cell(ms.Tensor(padded)).asnumpy()[:vector.size]

    return reduce_sum


class Group:
    """One rank's side of the group's traffic. Every rank must make the same calls in the same order:
    rank 0 ``command``s, the others ``receive``, then all ``answer`` (the ANSWERED commands)."""

    def __init__(self, rank: int, size: int, reduce_sum: ReduceSum | None = None, key: bytes | None = None) -> None:
        """``key``: the group's secret (every rank the same); None only in process, where no stranger can join."""
        self.rank, self.size = rank, size
        self._sum = reduce_sum or mindspore_sum()
        self._key = key
        self._sequence = 0             # exchanges so far: the same on every rank, so a tag cannot be replayed
        self._last = time.monotonic()
        self.awaiting_answer = False   # a BUILD or EVALUATE was sent and not yet answered
        self.closed = False

    # --- rank 0 ---------------------------------------------------------------------------

    def command(self, op: int, payload: Mapping[str, Any] | None = None) -> None:
        assert self.rank == 0 and not self.closed and not self.awaiting_answer
        data = json.dumps(payload).encode() if payload is not None else b""
        self._exchange_command(op, data)
        self.awaiting_answer = op in ANSWERED

    def heartbeat(self) -> None:
        """Keep idle ranks' wait for a command shorter than the collective timeout."""
        if not self.closed and not self.awaiting_answer and time.monotonic() - self._last >= HEARTBEAT_S:
            self.command(NOOP)

    def close(self) -> None:
        """Rank 0: tell the other ranks to exit, unless an answer is owed (then msrun ends them)."""
        if self.rank == 0 and not self.closed:
            if self.awaiting_answer:
                log.warning("leaving the eval group in the middle of a command; msrun ends the other ranks")
            else:
                self.command(EXIT)
            self.closed = True

    # --- the other ranks --------------------------------------------------------------------

    def receive(self) -> tuple[int, dict | None]:
        """Wait for rank 0's next command."""
        op, data = self._exchange_command(0, b"")
        self.awaiting_answer = op in ANSWERED
        return op, (json.loads(data) if data else None)

    # --- every rank -------------------------------------------------------------------------

    def answer(self, code: int, text: str = "", arrays: Mapping[str, np.ndarray] | None = None,
               layout: Layout | None = None) -> tuple[list[tuple[int, str]], dict[str, np.ndarray]]:
        """Every rank's (code, text), and the sum of every rank's full-size arrays of ``layout``."""
        layout = layout or {}
        tag_bytes = TAG_BYTES if self._key is not None else 0
        slot = 1 + (tag_bytes + STATUS_BYTES + 1) // 2
        sequence = self._next()
        vector = [np.zeros(self.size * slot, np.float32)]
        own = vector[0][self.rank * slot:(self.rank + 1) * slot]
        encoded = text.encode("utf-8", "replace")[:STATUS_BYTES].rstrip(b"\0")
        own[0] = code + 1  # 0 would look like a rank that said nothing
        tag = self._status_tag(sequence, self.rank, code, encoded)
        limbs = to_limbs(np.frombuffer(tag + encoded, np.uint8))
        own[1:1 + limbs.size] = limbs
        for name, (shape, dtype) in layout.items():
            if arrays is None or code != OK:
                vector.append(np.zeros(limb_count(shape, dtype), np.float32))
            else:
                vector.append(to_limbs(np.asarray(arrays[name], dtype=dtype).reshape(shape)))
        total = self._sum(np.concatenate(vector))
        self.awaiting_answer = False
        statuses = []
        for rank in range(self.size):
            block = total[rank * slot:(rank + 1) * slot]
            raw = from_limbs(block[1:], np.uint8, (2 * (slot - 1),)).tobytes()
            code_of, tag_of, said = int(block[0]) - 1, raw[:tag_bytes], raw[tag_bytes:].rstrip(b"\0")
            if not -1 <= code_of <= 255:
                raise GroupError(f"rank {rank}'s answer holds status {code_of}, which is none: the ranks fell out "
                                 f"of step, or something else added to the group's collective")
            if code_of >= 0 and not hmac.compare_digest(tag_of, self._status_tag(sequence, rank, code_of, said)):
                raise GroupForged(f"rank {rank}'s answer to exchange {sequence} failed its authentication: {_FORGED}")
            statuses.append((code_of, said.decode("utf-8", "replace")))
        if any(code < 0 for code, _ in statuses):
            raise GroupError(f"ranks {[r for r, (c, _) in enumerate(statuses) if c < 0]} gave no answer: the "
                             f"ranks fell out of step")
        offset, combined = self.size * slot, {}
        for name, (shape, dtype) in layout.items():
            count = limb_count(shape, dtype)
            combined[name] = from_limbs(total[offset:offset + count], dtype, shape)
            offset += count
        return statuses, combined

    def _exchange_command(self, op: int, data: bytes) -> tuple[int, bytes]:
        sequence = self._next()
        if self.rank == 0 and self._key is not None:
            data = data + self._command_tag(sequence, op, data)
        header = np.array([op, len(data)], np.float32) if self.rank == 0 else np.zeros(2, np.float32)
        got = self._sum(header)
        op, length = int(got[0]), int(got[1])
        if op not in OP_NAMES or length < 0:
            raise GroupError(f"received a command header {got.tolist()} that is not one: the ranks fell out of step")
        payload = b""
        if length:
            mine = np.frombuffer(data, np.uint8) if self.rank == 0 else np.zeros(length, np.uint8)
            payload = from_limbs(self._sum(to_limbs(mine)), np.uint8, (length,)).tobytes()
        if self._key is not None:
            payload, tag = payload[:-TAG_BYTES], payload[-TAG_BYTES:]
            if length < TAG_BYTES or not hmac.compare_digest(tag, self._command_tag(sequence, op, payload)):
                raise GroupForged(f"command {OP_NAMES[op]} (exchange {sequence}) failed its authentication: "
                                  f"{_FORGED}")
        self._last = time.monotonic()
        return op, payload

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence

    def _command_tag(self, sequence: int, op: int, data: bytes) -> bytes:
        assert self._key is not None
        return _tag(self._key, b"command", sequence.to_bytes(8, "little"), op.to_bytes(2, "little"), data)

    def _status_tag(self, sequence: int, rank: int, code: int, text: bytes) -> bytes:
        if self._key is None:
            return b""
        return _tag(self._key, b"answer", sequence.to_bytes(8, "little"), rank.to_bytes(4, "little"),
                    code.to_bytes(2, "little", signed=True), text)
