"""`--format tokens`: one row per training segment, for RL and SFT trainers that take token ids.

A trajectory recorded with its calls' token ids (`tokens` in the record: agent.segments) gives
one row per segment: `input_ids`, `loss_mask` (1 exactly on the tokens the model generated),
`logprobs` aligned with them (null where the mask is 0 or the server sent none), with the
sample's identity (sample id, row id, rollout, prompt index), its reward and verdict, the policy
version of each call the segment holds and the model. Parquet (one file, or one per split) by
default, JSONL with `--jsonl`: both load in `datasets` and pyarrow as they are. Trajectories
without ids (`tokens: null`) are left out and counted by reason. The fixed schema is ROW.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from trajforge.agent.segments import POLICY_VERSIONS, TOKENS, TOKENS_MISSING
from trajforge.dataset import split_rollout
from trajforge.export.convert import ConversionError
from trajforge.export.exporter import Exporter, Item, SplitFiles, Summary, file_names
from trajforge.export.filters import passed, verification_of
from trajforge.jsonio import dumps

# Column -> meaning (docs/training.md lists the same).
DOC = {
    "sample_id, row_id, rollout, prompt_index": "the sample, its dataset row (shared by the row's rollouts), which "
                                                "rollout it is, and the row's index",
    "segment, turns": "the segment's place in its sample, and which of the sample's model calls it holds (0-based)",
    "input_ids": "the token ids: the segment's last prompt as the server reported it, then that call's completion",
    "loss_mask": "1 on the tokens the model generated, 0 on everything else",
    "logprobs": "each generated token's logprob as the server reported it; null where loss_mask is 0",
    "policy_versions": "the policy version of each call in `turns` (null when the run stamped none)",
    "reward, passed": "the verification's score and verdict (null when the sample was not verified)",
    "model, completed, end_reason, prefix_breaks, split": "as in the record; prefix_breaks counts the sample's "
                                                          "segments after its first",
}


def schema() -> Any:
    import pyarrow as pa

    i64 = pa.int64()
    return pa.schema([
        ("sample_id", pa.string()), ("row_id", pa.string()), ("rollout", i64), ("prompt_index", i64),
        ("segment", i64), ("turns", pa.list_(i64)), ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())), ("logprobs", pa.list_(pa.float64())),
        ("policy_versions", pa.list_(i64)), ("reward", pa.float64()), ("passed", pa.bool_()),
        ("model", pa.string()), ("completed", pa.bool_()), ("end_reason", pa.string()),
        ("prefix_breaks", i64), ("split", pa.string()),
    ])


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def segment_rows(record: dict[str, Any], split: str | None) -> list[dict[str, Any]]:
    """The rows of one record with token ids (none without). Raises ConversionError for a
    `tokens` field that is not what a run writes."""
    tokens = record.get(TOKENS)
    if tokens is None:
        return []
    segments = tokens.get("segments") if isinstance(tokens, dict) else None
    if not isinstance(segments, list):
        raise ConversionError(f"{TOKENS}: not an object with a list of segments")
    sid = str(record.get("sample_id", ""))
    versions = record.get(POLICY_VERSIONS)
    verification = verification_of(record) or {}
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    head = {"sample_id": sid, "row_id": split_rollout(sid)[0], "rollout": record.get("rollout"),
            "prompt_index": record.get("prompt_index")}
    tail = {"reward": _number(verification.get("score")), "passed": passed(record), "model": meta.get("model"),
            "completed": record.get("completed"), "end_reason": record.get("end_reason"),
            "prefix_breaks": tokens.get("prefix_breaks"), "split": split}
    rows = []
    for n, seg in enumerate(segments):
        ids, mask, logprobs, turns = (seg.get(k) if isinstance(seg, dict) else None
                                      for k in ("input_ids", "loss_mask", "logprobs", "turns"))
        if not (isinstance(ids, list) and isinstance(mask, list) and isinstance(logprobs, list)
                and isinstance(turns, list) and len(ids) == len(mask) == len(logprobs)):
            raise ConversionError(f"{TOKENS}.segments[{n}]: input_ids, loss_mask and logprobs must be lists of one "
                                  "length, with the list of its turns")
        turn_versions = [versions[t] if isinstance(versions, list) and isinstance(t, int) and 0 <= t < len(versions)
                         else None for t in turns]
        rows.append({**head, "segment": n, "turns": turns, "input_ids": ids, "loss_mask": mask,
                     "logprobs": logprobs, "policy_versions": turn_versions, **tail})  # the schema's order
    return rows


class TokensExporter(Exporter):
    """Parquet, or JSONL with --jsonl: `suffix` follows the option."""

    suffix = ".parquet"

    def open(self, output: Path) -> None:
        self.root = output
        self.suffix = ".jsonl" if self.options.jsonl else ".parquet"
        self.counts: Counter[str] = Counter()  # trajectories exported, per split
        self.rows = 0
        self.without: Counter[str] = Counter()  # trajectories left out, by why they have no ids
        if self.options.jsonl:
            self.files = SplitFiles(output, self.options.splits, self.suffix)
            self.paths = self.files.paths
            return
        from trajforge.export.parquet import parquet_writers

        self.schema = schema()
        self.out = parquet_writers(output, self.options.splits, self.schema, self._table)
        self.paths = self.out.paths

    def _table(self, rows: list[dict[str, Any]]) -> Any:
        import pyarrow as pa

        return pa.Table.from_pylist(rows, schema=self.schema)

    def write(self, item: Item) -> None:
        rows = segment_rows(item.record, item.split)
        if not rows:
            missing = item.record.get(TOKENS_MISSING)
            self.without[missing if isinstance(missing, str) else "no tokens field"] += 1
            return
        split = item.split or ""
        self.counts[split] += 1
        self.rows += len(rows)
        for row in rows:
            if self.options.jsonl:
                self.files.files[split].write(dumps(row) + b"\n")
            else:
                self.out.groups[split].add(row, item.number, 8 * len(row["input_ids"]))

    def close(self) -> Summary:
        if self.options.jsonl:
            self.files.close()
        else:
            self.out.close()
        return Summary({s: self.counts[s] for s in self.paths}, file_names(self.paths, self.root), self.drops(),
                       rows=self.rows)

    def abort(self) -> None:
        if hasattr(self, "files"):
            self.files.abort()
        if hasattr(self, "out"):
            self.out.abort()

    def drops(self) -> list[str]:
        out = ["the conversation text (the segments hold its tokens; --format openai has it)"]
        if self.without:
            reasons = ", ".join(f"{n} {why}" for why, n in self.without.most_common())
            out.append(f"{sum(self.without.values())} trajectories without token ids ({TOKENS_MISSING}: {reasons}; "
                       "runs record them with --capture_tokens against a server that returns them, or --model local)")
        return out
