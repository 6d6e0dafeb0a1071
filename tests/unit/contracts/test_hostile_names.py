"""Issue 19, kind 7: every name parsed from disk or the wire is ASCII digits only and matched in full.

``\\d`` matches Arabic-Indic (and every other Unicode) digit, and ``$`` matches before a trailing
newline: ``step_<U+0660..>`` was evaluated as step 700 and ``"step_000016125\\n"`` as step 16125. No
producer writes such names, so they are not checkpoints (and not temporary directories to delete)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evald.config.options import option_fields
from evald.config.schema import ConfigError, coerce
from evald.contracts import layout, partition
from evald.files import mindformers
from evald.files.recognise import recognise, step_from_name

ARABIC_700 = "\u0660" * 6 + "\u0667\u0660\u0660"   # ٠٠٠٠٠٠٧٠٠
FULLWIDTH_7 = "\uff17"


@pytest.mark.parametrize("name", [f"step_{ARABIC_700}", "step_000016125\n", "step_000016125\r",
                                  f"step_00000001{FULLWIDTH_7}", " step_000000001", "step_000000001 "])
def test_a_step_directory_name_is_ascii_digits_in_full(name):
    assert layout.parse_step_dir_name(name) is None


@pytest.mark.parametrize("name", [f"step_{ARABIC_700}-part-00000-of-00002", "step_000000700-part-00000-of-00002\n",
                                  "step_000000700-part-0000\u0660-of-00002"])
def test_a_part_directory_name_is_ascii_digits_in_full(name):
    assert partition.parse_part_dir_name(name) is None


def test_a_group_name_is_ascii_digits_in_full():
    assert partition.parse_group_name("step_000000700-part-*-of-00002\n") is None
    assert partition.parse_group_name(f"step_{ARABIC_700}-part-*-of-00002") is None
    assert partition.parse_group_name("step_000000700-part-*-of-00002") == (700, 2)


@pytest.mark.parametrize("name", ["net-1_\u0665.ckpt", "net-\u0661_5.ckpt", "net-1_5.ckpt\n"])
def test_a_model_checkpoint_name_is_ascii_digits_in_full(name):
    assert step_from_name(name, steps_per_epoch=10) is None


def test_a_temp_directory_name_is_ascii_in_full():
    assert layout.TEMP_DIR_PATTERN.fullmatch(".step_1.tmp-ab") is not None
    for name in (".step_\u0661.tmp-ab", ".step_1.tmp-ab\n"):
        assert not layout.TEMP_DIR_PATTERN.fullmatch(name)


def test_mindformers_rank_and_weights_names_are_ascii_in_full(tmp_path):
    assert mindformers.output_dir_of(Path("/o/checkpoint_network/rank_\u0660")) == Path(
        "/o/checkpoint_network/rank_\u0660")
    assert mindformers.output_dir_of(Path("/o/checkpoint_network/rank_0")) == Path("/o")
    assert not mindformers.is_weights_only(Path("/o/checkpoint_network/rank_0/m-network-1_5.ckpt\n"))
    assert not mindformers.is_weights_only(Path("/o/checkpoint_network/rank_0/m-network-1_\u0665.ckpt"))


def test_a_directory_with_a_unicode_or_newline_step_name_is_not_recognised(tmp_path):
    from tests import faults

    good = faults.commit(tmp_path, 700)
    for name in (f"step_{ARABIC_700}", "step_000000700\n"):
        good.rename(tmp_path / name)
        assert recognise(tmp_path, name) is None, name
        (tmp_path / name).rename(good)


@pytest.mark.parametrize("option, value", [("model_factory", "os:system\n"), ("model_factory", "m\u0660:f"),
                                           ("run_name", "run\n"), ("endpoint", "tcp://h:5555\n"),
                                           ("endpoint", "tcp://h:\u0665\u0665\u0665\u0665")])
def test_names_in_options_are_ascii_in_full(option, value):
    [field] = [f for f in option_fields() if f.name == option]
    with pytest.raises(ConfigError):
        coerce(field, value, "--test")
