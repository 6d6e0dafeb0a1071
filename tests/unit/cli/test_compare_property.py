"""Property test (issue 27): generated per-sample files and sidecars, hostile in nesting (up to 100,000
levels), numbers (integers of hundreds of digits, ``NaN``/``Infinity`` tokens, ``1e999``), unicode and
bytes that are not UTF-8, and truncation (of a line, of the gzip stream, of a sidecar), through the one
reader (evald.ledger.samples), ``evald compare``'s in-process entry and the suite monitor's paired SE
(what the daemon calls): the reader returns or raises SampleFileError, ``compare`` exits 0 or 2 with a
message, the monitor returns a reason; never another exception, so never a traceback.

Bounded time is by construction, not measured (tests check behaviour, never time): every input is at
most a few hundred kilobytes and the reader is linear in it (the nesting is measured before parsing).
The HTTP routes' half of the property is tests/unit/serve's."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.cli.main import main
from evald.ledger.samples import SampleFileError, list_samples, read_documents, read_samples, read_sidecar
from evald.sinks.sample_files import paired_se_of_monitor
from tests.sample_outputs import IDENTITY, identity_hash, write_task_samples

PROPERTY = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DIGEST = identity_hash(IDENTITY)

NUMBER_TOKENS = [b"NaN", b"-NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400", b"2e-400", b"1" + b"0" * 400,
                 b"9" * 5000, b"-" + b"9" * 19, b"9223372036854775808", b"0.5", b"-0", b"1E+2", b"01", b"0x10", b".5",
                 b"1.", b"true", b"null"]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                      st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=16))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16)


@st.composite
def deep(draw) -> bytes:
    depth = draw(st.one_of(st.integers(1, 80), st.sampled_from([1_000, 100_000])))
    if draw(st.booleans()):
        return b"[" * depth + b"0" + b"]" * depth
    return b'{"a":' * depth + b"0" + b"}" * depth


def fragment() -> st.SearchStrategy[bytes]:
    """One JSON value's place filled with something: valid JSON, a hostile number token, deep nesting,
    unicode text, or raw bytes."""
    return st.one_of(json_value.map(lambda v: json.dumps(v).encode()),
                     st.sampled_from(NUMBER_TOKENS),
                     deep(),
                     st.text(max_size=12).map(lambda t: json.dumps(t, ensure_ascii=False).encode()),
                     st.binary(max_size=12))


@st.composite
def document_line(draw, doc_id: int) -> bytes:
    ident = draw(st.one_of(st.just(str(doc_id).encode()), fragment()))
    value = draw(st.one_of(st.sampled_from([b"0", b"1", b"0.25", b"[-1.5, 3]"]), fragment()))
    resps = draw(st.one_of(st.just(b"[[-1.0, false]]"), fragment()))
    target = draw(st.one_of(st.just(b'"a"'), fragment()))
    return b'{"doc_id": ' + ident + b', "metrics": {"acc": ' + value + b'}, "resps": ' + resps + b', "target": ' + \
        target + b"}\n"


@st.composite
def samples_file(draw) -> bytes:
    lines = [draw(st.one_of(st.just(b'{"doc_id": %d, "metrics": {"acc": 1}, "resps": [], "target": ""}\n' % i),
                            document_line(i))) for i in range(draw(st.integers(0, 5)))]
    raw = b"".join(lines)
    if raw and draw(st.booleans()):
        raw = raw[:draw(st.integers(0, len(raw)))]             # a line cut short
    packed = gzip.compress(raw, mtime=0)
    if draw(st.integers(0, 4)) == 0:
        packed = packed[:draw(st.integers(0, len(packed)))]    # the gzip stream cut short
    return packed


@st.composite
def sidecar_file(draw) -> bytes:
    head = {"suite": "fast", "task": "hellaswag", "step": 200, "identity": IDENTITY, "identity_sha256": DIGEST,
            "cell_identity": "ce" * 32, "metrics": {"acc": 0.5}, "documents": 4}
    raw = json.dumps(head).encode()
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(head) + ["identity_hash", "extra"]))
        raw = raw.replace(b'{"suite"', b'{"' + key.encode() + b'": ' + draw(fragment()) + b', "suite"', 1)
    if draw(st.booleans()):
        raw = raw.replace(b'"num_fewshot": 0', b'"num_fewshot": ' + draw(fragment()), 1)   # identity edited
    if draw(st.integers(0, 4)) == 0:
        raw = raw[:draw(st.integers(0, len(raw)))]
    return raw


def _run_with(tmp: Path, samples: bytes | None, sidecar: bytes | None) -> Path:
    run = tmp / "run"
    for step in (100, 200):
        write_task_samples(run, "fast", "hellaswag", step, IDENTITY, {"acc": [1, 0, 1, 1]})
    folder = run / "samples" / "fast" / "hellaswag"
    if samples is not None:
        (folder / f"step_200.{DIGEST[:12]}.jsonl.gz").write_bytes(samples)
    if sidecar is not None:
        (folder / f"step_200.{DIGEST[:12]}.json").write_bytes(sidecar)
    return run


def _through_everything(run: Path) -> None:
    file = next(f for f in list_samples(run) if f.step == 200)
    for read in (read_sidecar, read_samples, read_documents):
        try:
            read(file)
        except SampleFileError as exc:
            assert str(file.sidecar if read is read_sidecar else file.samples) in str(exc)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(["compare", "100", "200", "--run-dir", str(run), "--resamples", "20"])
    assert code in (0, 2), stderr.getvalue()
    assert code == 0 or stderr.getvalue().startswith("evald compare: ")
    paired = paired_se_of_monitor(run, "fast/hellaswag/acc", 200, 100)
    assert paired.value is not None or paired.reason


@PROPERTY
@given(samples=samples_file())
def test_any_samples_file_is_read_or_refused_with_the_documented_error(samples):
    with tempfile.TemporaryDirectory() as tmp:
        _through_everything(_run_with(Path(tmp), samples, None))


@PROPERTY
@given(sidecar=sidecar_file())
def test_any_sidecar_is_read_or_refused_with_the_documented_error(sidecar):
    with tempfile.TemporaryDirectory() as tmp:
        _through_everything(_run_with(Path(tmp), None, sidecar))


@PROPERTY
@given(samples=samples_file(), sidecar=sidecar_file())
def test_both_hostile_at_once(samples, sidecar):
    with tempfile.TemporaryDirectory() as tmp:
        _through_everything(_run_with(Path(tmp), samples, sidecar))
