"""The embedded model's token ids: what each prompt is, what it generated, with their logprobs.

The local backend tokenizes and samples in-process, so a call's ids and logprobs are known
exactly, not reported by anyone: `generate` samples from llama.cpp token by token (the settings
`create_completion` uses) and reads each generated token's logprob from the logits that produced
it (the model's own distribution, before temperature and the grammar, as vLLM reports them).

Under --capture_tokens, prompts continue token for token where they can (`Continuations`): a
conversation's next prompt is the previous prompt's ids, the ids the model generated, then the
template's text for the turns that came after (tool results), tokenized. Re-rendering the assistant's turn as text and
tokenizing the whole prompt again would give the model other ids than it wrote (the parsed
reply is re-serialised, and a sampled sequence is often not the tokenizer's own split of its
text), so every prompt would start a new training segment. The prompt is tokenized whole when
there is no earlier call to continue, when the chat no longer starts with it (the context was
trimmed), or when the template does not render the earlier turns as a prefix of the new text.
Only under --capture_tokens: the model then sees its own earlier reasoning token for token, which
changes what a small model does (the bundled 135M one tends to repeat its call until the
tool-round limit), so a run that does not ask keeps the prompts it always had.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.model.local_format import to_chat_messages
from trajforge.model.types import ToolCall

CACHE_ENTRIES = 1024  # conversations remembered at once (an entry is its ids: ~4 bytes a token)
TOP_K, MIN_P = 40, 0.05  # llama-cpp-python's create_completion defaults, as the backend used before
DEFAULT_TOP_P = 0.95


def chat_key(chat: list[dict[str, str]]) -> bytes:
    return hashlib.blake2b(orjson.dumps(chat), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Continuation:
    ids: array  # the prompt's ids followed by the generated ids
    closed: bool  # the generated ids end with the end-of-turn token


class Continuations:
    """Recent calls by the chat they ended (their prompt's chat plus the assistant turn the agent
    will send back): shared by the backend's instances, which run in worker threads."""

    def __init__(self, size: int = CACHE_ENTRIES) -> None:
        self._entries: OrderedDict[bytes, Continuation] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def remember(self, chat: list[dict[str, str]], entry: Continuation) -> None:
        key = chat_key(chat)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    def remember_reply(self, chat: list[dict[str, str]], content: str, calls: list[ToolCall],
                       entry: Continuation) -> None:
        """Remember a call by its prompt's chat followed by its reply as the agent sends it back."""
        sent_back = {"role": "assistant", "content": content, "tool_calls": [
            {"id": c.id, "function": {"name": c.name, "arguments": c.arguments}} for c in calls]}
        self.remember(chat + to_chat_messages([sent_back], []), entry)

    def find(self, chat: list[dict[str, str]]) -> tuple[int, Continuation] | None:
        """(index of the chat's last assistant turn, the call that wrote it), when remembered."""
        last = next((i for i in range(len(chat) - 1, -1, -1) if chat[i]["role"] == "assistant"), None)
        if last is None:
            return None
        with self._lock:
            entry = self._entries.get(chat_key(chat[:last + 1]))
        return None if entry is None else (last, entry)


def prompt_ids(chat: list[dict[str, str]], render: Callable[[list[dict[str, str]], bool], str],
               tokenize: Callable[[str, bool], list[int]], eos: str, found: tuple[int, Continuation] | None) -> array:
    """The ids of the prompt for `chat`: continuing `found` (Continuations.find) when its text is a
    prefix of this one's, else the whole rendered text tokenized. `render(chat, generation_prompt)`
    is the chat template; `tokenize(text, start)` tokenizes text that starts a prompt or continues one."""
    if found is not None and eos:
        last, entry = found
        through = render(chat[:last + 1], False)  # the conversation up to the end of that assistant turn
        full = render(chat, True)
        end = through.rfind(eos)
        if end >= 0 and full.startswith(through):
            # The turn's own text is replaced by the ids the model generated; what the template
            # writes after its end-of-turn token (and that token, if the model never wrote it) follows.
            tail = (through[end + len(eos):] if entry.closed else through[end:]) + full[len(through):]
            return entry.ids + array("i", tokenize(tail, False) if tail else ())
    return array("i", tokenize(render(chat, True), True))


@dataclass(slots=True)
class Generated:
    ids: array  # every id sampled, the end-of-turn token included when the model wrote one
    logprobs: list[float]
    closed: bool  # ended on an end-of-generation token
    length: bool  # stopped at the token limit


def generate(llm: Any, prompt: array, *, max_tokens: int, temperature: float, top_p: float | None, grammar: Any,
             seed: int, stop: threading.Event, logprobs: bool = True) -> Generated:
    """Sample up to `max_tokens` ids after `prompt` (llama.cpp reuses the cached prefix of the
    previous prompt it evaluated); `stop` ends generation at the next token (a cancelled call).
    Without `logprobs`, none are computed (Generated.logprobs stays empty)."""
    import llama_cpp
    import numpy as np

    llm.set_seed(seed)
    vocab, ctx, n_vocab = llm._model.vocab, llm.ctx, llm.n_vocab()
    ids, values = array("i"), []
    closed = False
    for token in llm.generate(list(prompt), top_k=TOP_K, top_p=DEFAULT_TOP_P if top_p is None else top_p,
                              min_p=MIN_P, typical_p=1.0, temp=temperature, repeat_penalty=1.0, grammar=grammar):
        if logprobs:
            # The logits the token was sampled from: the last decoded position's, until the next decode.
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            top = float(logits.max())
            values.append(float(logits[token]) - top - float(np.log(np.exp(logits - top).sum())))
        ids.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            closed = True
            break
        if len(ids) >= max_tokens or stop.is_set():
            break
    return Generated(ids, values, closed, not closed and len(ids) >= max_tokens)
