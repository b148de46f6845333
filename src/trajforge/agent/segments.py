"""A sample's training segments: the token ids its model calls saw and generated, as sequences (pure).

A trainer wants each sample as few token sequences as can be exact: `input_ids`, a `loss_mask`
that is 1 on exactly the tokens the model generated (0 on system, user and tool tokens, and on
whatever the chat template added), and the generated tokens' `logprobs` aligned with them
(null where the mask is 0, and where the server sent none). A call extends the current segment
only when its prompt ids start with the segment so far (the previous call's prompt ids followed
by its completion ids); otherwise a new segment starts, and that is a prefix break: a template
that drops earlier reasoning, a local model that trimmed a long conversation, a re-serialised
tool call. The ids are the ones the server reported or the embedded model used
(model.token_capture, model.local_tokens), never text tokenized again here.

The record carries them under `tokens`: `segments` (each with the calls it holds, `turns`),
`turns` (per call: its segment, the prompt's length as the server counted it, the completion's
length; the completion is input_ids[prompt_tokens : prompt_tokens + completion_tokens] of its
segment) and `prefix_breaks`. A sample any of whose calls came without ids says `tokens: null`
and why (`tokens_missing`: not_requested, not_returned_by_server, with `tokens_missing_calls`
counting the replies that lacked them): a segment with a call missing would train on a
sequence the model never saw.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from trajforge.model.types import NOT_REQUESTED, NOT_RETURNED, Completion

# The record's fields, spelled here only.
TOKENS = "tokens"
TOKENS_MISSING = "tokens_missing"
MISSING_CALLS = "tokens_missing_calls"
POLICY_VERSIONS = "policy_versions"


@dataclass(slots=True)
class _Segment:
    ids: array
    spans: list[tuple[int, int, list[float] | None]]  # each completion: (start, length, logprobs)
    turns: list[int]

    def as_json(self) -> dict[str, Any]:
        mask: list[int] = []
        logprobs: list[float | None] = []
        at = 0
        for start, length, values in self.spans:
            mask += [0] * (start - at)
            mask += [1] * length
            logprobs += [None] * (start - at)
            logprobs += values if values is not None else [None] * length
            at = start + length
        mask += [0] * (len(self.ids) - at)
        logprobs += [None] * (len(self.ids) - at)
        return {"input_ids": self.ids.tolist(), "loss_mask": mask, "logprobs": logprobs, "turns": self.turns}


@dataclass(slots=True)
class Segments:
    """Fed each call's Completion in order as the agent loop runs (`add`); `fields()` is what the
    record says. Holds one growing array per segment, not every call's prompt."""

    segments: list[_Segment] = field(default_factory=list)
    turns: list[dict[str, int]] = field(default_factory=list)
    calls: int = 0
    missing: str | None = None
    missing_calls: int = 0  # replies that came back without the ids asked for

    def add(self, completion: Completion) -> None:
        n, self.calls = self.calls, self.calls + 1
        tokens = completion.tokens
        if tokens is None:
            reason = completion.tokens_missing or NOT_REQUESTED
            self.missing_calls += reason == NOT_RETURNED
            if self.missing is None or reason == NOT_RETURNED:
                self.missing = reason
            return
        prompt, generated = tokens.prompt_ids, tokens.completion_ids
        current = self.segments[-1] if self.segments else None
        if current is None or len(prompt) < len(current.ids) or prompt[:len(current.ids)] != current.ids:
            current = _Segment(array("i", prompt), [], [])
            self.segments.append(current)
        else:
            current.ids.extend(prompt[len(current.ids):])
        current.spans.append((len(current.ids), len(generated), tokens.logprobs))
        current.ids.extend(generated)
        current.turns.append(n)
        self.turns.append({"segment": len(self.segments) - 1, "prompt_tokens": len(prompt),
                           "completion_tokens": len(generated)})

    @property
    def prefix_breaks(self) -> int:
        return max(0, len(self.segments) - 1)

    def fields(self) -> dict[str, Any]:
        """The record's token fields."""
        if self.missing is not None or not self.segments:
            out: dict[str, Any] = {TOKENS: None, TOKENS_MISSING: self.missing or NOT_REQUESTED}
            if self.missing_calls:
                out[MISSING_CALLS] = self.missing_calls
            return out
        return {TOKENS: {"segments": [s.as_json() for s in self.segments], "turns": self.turns,
                         "prefix_breaks": self.prefix_breaks}}
