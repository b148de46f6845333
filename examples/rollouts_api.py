"""A trainer's loop on trajforge's Python API: groups of rollouts of `check` rows, each group as
soon as it is scored, with the policy version changed between groups (the README's "Rollout
service for RL trainers").

    python examples/rollouts_api.py --base_url URL --model NAME [--output_dir DIR]

Without --base_url it runs the bundled local model (`make demo`'s).
"""

from __future__ import annotations

import argparse
import asyncio

import trajforge

ROWS = [{"prompt": "Print the word ready with a shell command, then answer ready.", "check": "true"},
        {"prompt": "What is 2 + 2? Answer with the number only.", "expected": "4"}]


async def main(settings: dict[str, object], n: int) -> None:
    async with trajforge.Rollouts(settings, retry_masked=1) as rollouts:
        version = 0
        rollouts.set_policy(version)
        async for group in rollouts.generate(ROWS, n=n):
            # a trainer takes the scored rollouts and leaves the masked ones out of its loss and baseline
            scored = [r for r in group["rollouts"] if r["status"] == "scored"]
            rewards = [r["reward"] for r in scored]
            print(f"group {group['id'][:8]}: {group['usable']}/{group['n']} usable, rewards {rewards}, "
                  f"versions {sorted({v for r in scored for v in r['policy_versions'] or []})}")
            version += 1
            rollouts.set_policy(version)  # the trainer stepped: calls from now on carry the new version


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--base_url")
    parser.add_argument("--model", default="local")
    parser.add_argument("--output_dir", default="data")
    parser.add_argument("--n", type=int, default=4)
    args = parser.parse_args()
    settings: dict[str, object] = {"run_name": "rollouts_api", "output_dir": args.output_dir, "model": args.model,
                                   "sandbox": "local", "distribution": "terminal_only", "overwrite": True}
    if args.base_url:
        settings.update(base_url=args.base_url, api_key="sk-example")
    asyncio.run(main(settings, args.n))
