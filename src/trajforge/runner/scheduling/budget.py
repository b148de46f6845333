"""The run's spend: what it cost so far, what it will cost, and whether a sample may start.

`--max_cost` holds over every invocation of a run: earlier invocations' spend comes from the
checkpoint, plus what runner.state.recovery found in the batch files that a killed invocation never
saved there (`recovered`). A sample may start while the spend so far plus the projected spend of
the samples in flight stays under the budget; once it does not, no sample starts again in this
invocation (those in flight finish) and the run ends with BUDGET_EXIT_CODE. An in-flight sample is
projected to cost the average finished sample, or what it has already spent if that is more; so the
overshoot is bounded by what in-flight samples spend beyond the average. Spend is counted per
model call as calls return (model.spend), failed attempts and tools' model calls included.

Pure: the engine calls `may_start`, `start`, `retry` and `end`; nothing here waits or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trajforge.model.spend import SampleSpend
from trajforge.runner.state.checkpoint_file import InvocationEntry
from trajforge.runner.reporting.figures import usd

BUDGET_EXIT_CODE = 4  # 0 ok, 1 fatal, 2 usage, 130 interrupted


@dataclass(slots=True)
class _Flight:
    identity: str
    base: float = 0.0  # USD the sample spent before its current attempt began


@dataclass
class Budget:
    limit: float | None = None
    prior: float = 0.0  # USD spent by earlier invocations of this run
    prior_samples: int = 0  # samples they ended (finished, discarded or failed)
    to_run: int = 0  # samples this invocation set out to run
    closed: float = 0.0  # USD of samples that ended in this invocation
    ended: int = 0
    started: int = 0
    reached: bool = False
    active: dict[SampleSpend, _Flight] = field(default_factory=dict)
    live: SampleSpend = field(default_factory=SampleSpend)  # every call charged in this process
    elsewhere: float = 0.0  # USD that ended samples spent in other processes (Ray actors)

    @classmethod
    def from_invocations(cls, limit: float | None, invocations: Iterable[InvocationEntry], to_run: int,
                         recovered: tuple[float, int] = (0.0, 0)) -> Budget:
        """A budget continuing the spend recorded by earlier invocations (checkpoint.json), and
        `recovered`: (USD, samples) that a killed one spent but never saved there (runner.state.recovery)."""
        prior = [(i.spent + i.recovered_spent, i.spent_samples + i.recovered_samples) for i in invocations]
        prior.append(recovered)
        return cls(limit, sum(p for p, _ in prior), sum(n for _, n in prior), to_run)

    @property
    def spent_now(self) -> float:
        """USD spent by this invocation so far, in-flight samples included."""
        return self.live.cost + self.elsewhere

    @property
    def spent(self) -> float:
        """USD spent by the whole run so far."""
        return self.prior + self.spent_now

    def average(self) -> float | None:
        """USD per ended sample over the run, or None before any ended."""
        n = self.prior_samples + self.ended
        return (self.prior + self.closed) / n if n else None

    def in_flight_projection(self) -> float:
        """What the samples in flight are expected to spend beyond what they spent already."""
        avg = self.average() or 0.0
        return sum(max(0.0, avg - s.cost) for s in self.active)

    def projected_total(self) -> float | None:
        """The run's total spend if every sample of this invocation runs at the average so far."""
        avg = self.average()
        if avg is None:
            return None
        return self.spent + self.in_flight_projection() + max(0, self.to_run - self.started) * avg

    def may_start(self) -> bool:
        """Whether a sample (or another attempt at one) may start. Once refused, always refused."""
        if self.limit is not None and not self.reached:
            self.reached = self.spent + self.in_flight_projection() >= self.limit
        return not self.reached

    def start(self, identity: str = "") -> SampleSpend:
        spend = SampleSpend(parent=self.live)
        self.active[spend] = _Flight(identity)
        self.started += 1
        return spend

    def retry(self, spend: SampleSpend) -> None:
        """Another attempt at the sample of `spend` begins: its record will hold only this one's cost."""
        flight = self.active.get(spend)
        if flight is not None:
            flight.base = spend.cost

    def in_flight(self) -> dict[str, float]:
        """USD each sample in flight spent on its current attempt so far (see `fill`)."""
        return {f.identity: round(s.cost - f.base, 8) for s, f in self.active.items() if f.identity and s.cost > f.base}

    def end(self, spend: SampleSpend, elsewhere: float = 0.0) -> float:
        """The sample of `spend` ended; `elsewhere`: USD its attempts spent in other processes.
        Returns the sample's cost."""
        self.active.pop(spend, None)
        cost = spend.cost + elsewhere
        self.elsewhere += elsewhere
        self.closed += cost
        self.ended += 1
        return cost

    def fill(self, entry: InvocationEntry) -> None:
        """Write this invocation's spend into its checkpoint entry: the next invocation's prior.
        `spent` includes what samples in flight spent so far; `in_flight` says how much of that a
        record written before the next save would hold again, so a resume after a kill does not
        count it twice (runner.state.recovery). Written only once there was something in flight."""
        entry.spent, entry.spent_samples = round(self.spent_now, 8), self.ended
        flights = self.in_flight()
        if flights or entry.in_flight:
            entry.in_flight = flights

    def stop_message(self) -> list[str]:
        """The lines printed when the budget stopped the run, ending with how to continue."""
        assert self.limit is not None
        left = max(0, self.to_run - self.started)
        lines = [(f"trajforge: budget reached: {usd(self.spent)} spent of --max_cost {usd(self.limit)} "
                  f"(all invocations of this run); {left} sample(s) not started, in-flight ones finished")]
        need = self.projected_total()
        hint = f" (about {usd(need)} for the whole run at {usd(self.average())} per sample)" if need else ""
        lines.append(f"trajforge: to continue, run the same command with --resume and a higher --max_cost{hint}")
        return lines
