"""The trainer ↔ evald contract, and nothing else: the only code trainer_hooks shares with evald.

- the checkpoint layout (docs/checkpoint-layout.md): ``layout.py`` with ``manifest.py``,
  ``manifest_fields.py``, ``partition.py``, ``safetensors_io.py``, ``parallel_io.py``,
  ``small_files.py``
- the wire protocol (docs/wire-protocol.md): ``wire.py`` with ``wire_fields.py`` (bounded
  fields, also used by the manifest) and ``retention.py`` (leases)
- the channel's authentication (docs/authentication.md): ``auth.py``

May import: nothing of evald (stdlib, numpy, pyzmq, safetensors only), so that a trainer can
import it without mindspore or the evaluator.
"""
