"""--serve HOST:PORT and [serve]: one option, validated once; beyond loopback needs a private token file."""

from __future__ import annotations

import os

import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError
from evald.serve.token import TokenFileError, read_token


def test_serve_is_a_host_and_port_or_a_table(tmp_path):
    assert parse_config(["--serve", "127.0.0.1:8000"], {}).config.serve.listen == "127.0.0.1:8000"
    toml = tmp_path / "evald.toml"
    toml.write_text('[serve]\nlisten = "127.0.0.1:0"\nqueue_size = 3\n')
    serve = parse_config(["--config", str(toml), "--serve", '{"budget_s": 0.2}'], {}).config.serve
    assert (serve.listen, serve.queue_size, serve.budget_s) == ("127.0.0.1:0", 3, 0.2)
    assert not parse_config([], {}).config.serve.enabled


@pytest.mark.parametrize("value, says", [
    ("0.0.0.0:8000", "beyond loopback: set serve.token_file"),
    ("8000", "expected HOST:PORT"),
    ("127.0.0.1:70000", "expected HOST:PORT"),
    ("127.0.0.1:http", "expected HOST:PORT"),
    ("127.0.0.1:\uff18\uff10\uff10\uff10", "expected HOST:PORT"),   # fullwidth digits: int() reads them as 8000
    ("localhost\n:8000", "expected HOST:PORT"),                    # "$" matched before the newline
    ('{"listen": "127.0.0.1:1", "queue_size": 0}', "queue_size: must be >= 1"),
    ('{"listen": "127.0.0.1:1", "max_tokens": -1}', "max_tokens: must be >= 0"),
    ('{"listen": "127.0.0.1:1", "bogus": 1}', "unknown key"),
])
def test_a_bad_serve_setting_is_an_error_naming_it(value, says):
    with pytest.raises(ConfigError) as caught:
        parse_config(["--serve", value], {})
    assert says in str(caught.value)


def test_beyond_loopback_with_a_token_file_is_accepted():
    config = parse_config(["--serve", '{"listen": "0.0.0.0:8000", "token_file": "/t"}'], {}).config
    assert config.serve.token_file == "/t"


def test_the_token_file_must_be_private_and_hold_a_real_token(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token-of-some-length\n")
    os.chmod(path, 0o600)
    assert read_token(path) == "s3cret-token-of-some-length"
    os.chmod(path, 0o644)
    with pytest.raises(TokenFileError, match="chmod 600"):
        read_token(path)
    os.chmod(path, 0o600)
    path.write_text("short")
    with pytest.raises(TokenFileError, match="at least 16"):
        read_token(path)
    with pytest.raises(TokenFileError, match="cannot be read"):
        read_token(tmp_path / "missing")
