"""counters.json: written when a count changes, read back whole, absent or torn reads as None."""

from __future__ import annotations

import os

from evald.sinks.counters import COUNTERS_FILE, CountersFile, MessageCounts, read_counts


def test_counts_are_written_when_they_change_and_read_back(tmp_path):
    sink = CountersFile(tmp_path)
    assert read_counts(tmp_path) is None
    sink.update(MessageCounts(handled=2, ignored=1, bad_frames=0))
    assert read_counts(tmp_path) == MessageCounts(handled=2, ignored=1, bad_frames=0)
    written = os.stat(tmp_path / COUNTERS_FILE).st_mtime_ns
    (tmp_path / COUNTERS_FILE).write_text('{"handled": 99, "ignored": 0, "bad_frames": 0}')
    sink.update(MessageCounts(handled=2, ignored=1, bad_frames=0))  # unchanged: not written again
    assert read_counts(tmp_path).handled == 99 and written
    sink.update(MessageCounts(handled=3, ignored=1, bad_frames=4))
    assert read_counts(tmp_path) == MessageCounts(handled=3, ignored=1, bad_frames=4)


def test_a_torn_or_foreign_file_reads_as_nothing(tmp_path):
    for text in ('{"handled": 1', '[]', '{"handled": "x", "ignored": 0, "bad_frames": 0}', '{"handled": 1}'):
        (tmp_path / COUNTERS_FILE).write_text(text)
        assert read_counts(tmp_path) is None, text


def test_a_failed_write_is_tried_again_at_the_next_change(tmp_path):
    sink = CountersFile(tmp_path / "missing")  # its directory does not exist: the write fails, quietly
    sink.update(MessageCounts(handled=1))
    (tmp_path / "missing").mkdir()
    sink.update(MessageCounts(handled=1))  # the same counts: written now, since the last write failed
    assert read_counts(tmp_path / "missing") == MessageCounts(handled=1)
