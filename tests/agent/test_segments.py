"""Training segments from the calls' token ids (agent.segments): pure logic, no event loop."""

from __future__ import annotations

from array import array

from trajforge.agent.segments import Segments
from trajforge.model.types import NOT_REQUESTED, NOT_RETURNED, Completion, TokenCapture


def call(prompt: list[int], completion: list[int], logprobs: list[float] | None = None) -> Completion:
    lp = [-0.5 - i for i in range(len(completion))] if logprobs is None else logprobs
    return Completion("", None, tokens=TokenCapture(array("i", prompt), array("i", completion), lp),
                      tokens_missing=None)


def missing(reason: str) -> Completion:
    return Completion("", None, tokens=None, tokens_missing=reason)


def test_calls_whose_prompts_extend_the_last_one_form_one_segment() -> None:
    s = Segments()
    s.add(call([1, 2, 3], [10, 11]))  # prompt 3, completion 2
    s.add(call([1, 2, 3, 10, 11, 4, 5], [12], [-0.25]))  # tool tokens 4 5, then one generated token
    fields = s.fields()
    tokens = fields["tokens"]
    assert tokens["prefix_breaks"] == 0 and "tokens_missing" not in fields
    [seg] = tokens["segments"]
    assert seg["input_ids"] == [1, 2, 3, 10, 11, 4, 5, 12]
    assert seg["loss_mask"] == [0, 0, 0, 1, 1, 0, 0, 1]
    assert seg["logprobs"] == [None, None, None, -0.5, -1.5, None, None, -0.25]
    assert seg["turns"] == [0, 1]
    assert tokens["turns"] == [{"segment": 0, "prompt_tokens": 3, "completion_tokens": 2},
                               {"segment": 0, "prompt_tokens": 7, "completion_tokens": 1}]
    for t in tokens["turns"]:  # each call's completion is where its turn says it is
        p, c = t["prompt_tokens"], t["completion_tokens"]
        assert seg["loss_mask"][p:p + c] == [1] * c


def test_a_prompt_that_does_not_start_with_the_last_prompt_and_completion_starts_a_new_segment() -> None:
    s = Segments()
    s.add(call([1, 2], [7, 8, 9]))  # the model wrote 7 8 9 (its reasoning included)
    s.add(call([1, 2, 9, 3], [20]))  # the template dropped 7 8: a break at exactly this call
    s.add(call([1, 2, 9, 3, 20, 4], [21, 22]))  # extends the new segment
    s.add(call([1, 2, 9, 3, 20], [23]))  # shorter than the segment so far: a break too
    tokens = s.fields()["tokens"]
    assert tokens["prefix_breaks"] == 2
    assert [seg["turns"] for seg in tokens["segments"]] == [[0], [1, 2], [3]]
    assert tokens["segments"][1]["input_ids"] == [1, 2, 9, 3, 20, 4, 21, 22]
    assert tokens["segments"][1]["loss_mask"] == [0, 0, 0, 0, 1, 0, 1, 1]
    assert [t["segment"] for t in tokens["turns"]] == [0, 1, 1, 2]


def test_a_reply_without_logprobs_keeps_its_ids_with_null_logprobs() -> None:
    s = Segments()
    s.add(Completion("", None, tokens=TokenCapture(array("i", [1]), array("i", [5, 6]), None), tokens_missing=None))
    [seg] = s.fields()["tokens"]["segments"]
    assert seg["loss_mask"] == [0, 1, 1] and seg["logprobs"] == [None, None, None]


def test_a_sample_missing_any_call_s_ids_has_no_segments_and_says_why() -> None:
    s = Segments()
    s.add(call([1], [2]))
    s.add(missing(NOT_RETURNED))
    s.add(call([1, 2, 3], [4]))
    s.add(missing(NOT_RETURNED))
    assert s.fields() == {"tokens": None, "tokens_missing": NOT_RETURNED, "tokens_missing_calls": 2}

    plain = Segments()
    plain.add(missing(NOT_REQUESTED))
    assert plain.fields() == {"tokens": None, "tokens_missing": NOT_REQUESTED}
    assert Segments().fields() == {"tokens": None, "tokens_missing": NOT_REQUESTED}  # no call at all (the oracle)


def test_the_segment_holds_its_own_copy_of_the_ids() -> None:
    prompt = array("i", [1, 2])
    s = Segments()
    s.add(Completion("", None, tokens=TokenCapture(prompt, array("i", [3]), [-1.0]), tokens_missing=None))
    prompt[0] = 99  # the caller's array is not the segment's
    assert s.fields()["tokens"]["segments"][0]["input_ids"] == [1, 2, 3]
