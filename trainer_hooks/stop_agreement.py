"""Hear evald's sticky control state and make every rank stop at the same step.

A rank that stops on its own while the others wait in AllReduce hangs the
whole job, so no rank ever acts on local receipt alone:

* Only rank 0 subscribes to evald's control PUB socket (a ``poll(0)`` per
  step, a few microseconds).
* Every ``agree_every`` steps all ranks run one all-reduce SUM of a 2-vector in
  which only rank 0 puts non-zeros: ``[stop_at_step, 1]`` if it holds a stop
  decision, else ``[0, 0]``. SUM is used because CPU AllReduce refuses MAX;
  with one contributor a SUM is a broadcast, so every rank gets the same value
  at the same step, and every rank stops at ``max(stop_at_step, that step)``.
* A single process (world size 1) needs no agreement: it stops at the first
  step >= stop_at_step.

``reduce_sum`` is pluggable: MindSpore's AllReduce by default when
``mindspore.communication`` is initialised; tests pass a stand-in.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from evald.contracts.auth import SecurityConfig, SecurityError, secure_client
from evald.contracts.wire import ControlState, ProtocolError, decode, ensure_socket_dir

log = logging.getLogger("trainer_hooks.stop_agreement")

ReduceSum = Callable[[np.ndarray], np.ndarray]


class ControlSubscriber:
    """Latest ``control_state`` for one run id; other runs' messages are ignored.

    With CURVE keys (``security``) it completes a handshake only with the evald whose public
    key it holds, so a stop from any other publisher never arrives.
    """

    def __init__(self, endpoint: str, run_id: str, security: SecurityConfig | None = None) -> None:
        self.endpoint = endpoint
        self.run_id = run_id
        self.latest: ControlState | None = None
        self.ignored = 0
        self._socket = None
        self._zmq = None
        socket = None
        try:
            import zmq

            self._zmq = zmq
            socket = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.CONFLATE, 1)  # only the newest state matters
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            # Only the evald this run announced to may stop it: an ipc socket in a private directory,
            # CURVE with evald's key, or plaintext TCP only when allowed (docs/security.md).
            ensure_socket_dir(endpoint)
            secure_client(socket, endpoint, security or SecurityConfig.from_env())
            socket.connect(endpoint)
            self._socket = socket
        except (SecurityError, PermissionError, ValueError) as exc:
            log.error("evald early stop disabled: not subscribing to evald control at %s: %s", endpoint, exc)
        except Exception:
            log.exception("evald early stop disabled: cannot subscribe to evald control at %s", endpoint)
        if self._socket is None and socket is not None:
            socket.close(linger=0)

    def poll(self) -> ControlState | None:
        """Read whatever arrived (non-blocking) and return the latest state for this run."""
        if self._socket is None:
            return self.latest
        zmq = self._zmq
        try:
            while self._socket.poll(0):
                frame = self._socket.recv(zmq.NOBLOCK)
                self._accept(frame)
        except Exception:
            log.exception("error reading evald control messages; keeping the last state")
        return self.latest

    def _accept(self, frame: bytes) -> None:
        try:
            message = decode(frame)
        except ProtocolError as exc:
            log.warning("ignored a control message: %s", exc)
            self.ignored += 1
            return
        if not isinstance(message, ControlState):
            self.ignored += 1
            return
        if message.run_id != self.run_id:
            self.ignored += 1  # a stale decision for an earlier run must not stop this one
            return
        if self.latest is None or message.seq >= self.latest.seq:
            self.latest = message

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None


def mindspore_reduce_sum() -> ReduceSum | None:
    """An all-reduce SUM over all ranks with MindSpore, or None if communication is off."""
    try:
        from mindspore.communication import GlobalComm, get_group_size

        if not GlobalComm.INITED or get_group_size() <= 1:
            return None
    except Exception:
        return None
    import mindspore as ms
    from mindspore import nn, ops

    class _AllReduceSum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM)

        def construct(self, x):
            return self.all_reduce(x)

    cell = _AllReduceSum()
    # CPU AllReduce takes float32/float16 only (int32: "Select CPU operator[AllReduce] fail!
    # Unsupported data type!"). float32 holds integers exactly below 2**24, so each
    # non-negative int64 travels as four 16-bit limbs: a SUM over up to 256 ranks stays
    # exact, and the carries are resolved after the reduce.
    shifts = np.array([0, 16, 32, 48], dtype=np.int64)

    def reduce_sum(vector: np.ndarray) -> np.ndarray:
        v = np.asarray(vector, dtype=np.int64).reshape(-1)
        if (v < 0).any():
            raise ValueError("reduce_sum sums non-negative integers only")
        limbs = ((v[:, None] >> shifts) & 0xFFFF).astype(np.float32)
        summed = np.rint(cell(ms.Tensor(limbs.reshape(-1))).asnumpy()).astype(np.int64)
        return (summed.reshape(limbs.shape) << shifts).sum(axis=1)

    return reduce_sum


class StopAgreement:
    """Decides, identically on every rank, the step at which training stops."""

    def __init__(self, *, rank: int, world_size: int, agree_every: int = 1,
                 subscriber: ControlSubscriber | None = None,
                 reduce_sum: ReduceSum | None = None) -> None:
        if world_size > 1 and reduce_sum is None:
            raise ValueError(
                "world_size > 1 needs a collective to agree on the stop step; initialise "
                "mindspore.communication or pass reduce_sum"
            )
        self.rank = rank
        self.world_size = world_size
        self.agree_every = max(1, int(agree_every))
        self.subscriber = subscriber
        self.reduce_sum = reduce_sum
        self.agreed_stop_step: int | None = None
        self.reason = ""
        self.advisory_noted = False

    def local_stop_step(self) -> int | None:
        if self.subscriber is None:
            return None
        state = self.subscriber.poll()
        if state is not None and state.advisory_stop and not self.advisory_noted:
            self.advisory_noted = True  # evald's advisory mode: said once, never obeyed
            log.warning("evald advises stopping at step %s (advisory mode: training continues): %s",
                        state.advisory_stop.get("stop_at_step"), state.advisory_stop.get("reason", ""))
        if state is None or state.stop_at_step is None:
            return None
        self.reason = state.reason
        return state.stop_at_step

    def should_stop(self, step: int) -> bool:
        """Call once per step on every rank, in the same order relative to other collectives."""
        if self.world_size <= 1:
            if self.agreed_stop_step is None:
                self.agreed_stop_step = self.local_stop_step()
            return self.agreed_stop_step is not None and step >= self.agreed_stop_step
        if step % self.agree_every == 0 and self.agreed_stop_step is None:
            local = self.local_stop_step() if self.rank == 0 else None
            vote = np.array([local or 0, 1 if local is not None else 0], dtype=np.int64)
            if self.rank != 0:
                vote[:] = 0
            total = self.reduce_sum(vote)  # type: ignore[misc]
            if int(total[1]) > 0:
                self.agreed_stop_step = max(int(total[0]), step)
                if not self.reason:
                    self.reason = "stop decided by evald (reason logged on rank 0)"
        return self.agreed_stop_step is not None and step >= self.agreed_stop_step

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.close()
