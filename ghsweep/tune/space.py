"""The search space of a tuning study: the swept overrides of the command line as Optuna distributions.

`a=x,y` and `choice(x,y)` are categorical (the values kept as written, so a trial's override is
`a=y` exactly as the user typed it), `range(0,33,4)` an integer distribution with that step,
`interval(lo,hi)` a float distribution (`tag(log,interval(lo,hi))` on a log scale). Every other
override is fixed: each trial gets it as given.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)

from ghsweep.core.errors import SpaceError
from ghsweep.launch.resume import identity_overrides
from ghsweep.tracking import redact

# Overrides that configure the study itself, not the runs it launches.
TUNE_PREFIX = "tune."


def _distribution(override: Override) -> BaseDistribution:
    value = override.value()
    key = override.get_key_element()
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator())
        ints = [v for v in values if isinstance(v, int)]
        if not ints or len(ints) < len(values):
            raise SpaceError(
                f"{override.input_line}: a tuned range needs integer bounds and at least one value, "
                f"e.g. {key}=range(0,33,4); for floats use {key}=interval(lo,hi)"
            )
        # Integer values come only from an integer start and step.
        return IntDistribution(min(ints), max(ints), step=int(abs(value.step)) if len(ints) > 1 else 1)
    if isinstance(value, IntervalSweep):
        if value.start is None or value.end is None:
            raise SpaceError(f"{override.input_line}: an interval needs both bounds, e.g. {key}=interval(lo,hi)")
        return FloatDistribution(float(value.start), float(value.end), log="log" in value.tags)
    if override.is_discrete_sweep():
        return CategoricalDistribution(list(override.sweep_string_iterator()))
    raise SpaceError(
        f"{override.input_line}: not a sweep the tune sweeper can search; accepted: a=x,y, "
        "choice(x,y), range(start,stop,step), interval(lo,hi), tag(log,interval(lo,hi))"
    )


def _input_line(override: Override) -> str:
    assert override.input_line is not None, "the overrides parser keeps each override's text"
    return override.input_line


@dataclass(frozen=True)
class SearchSpace:
    distributions: dict[str, BaseDistribution]
    fixed: list[str]  # the overrides every trial gets

    @classmethod
    def parse(cls, parser: OverridesParser, overrides: list[str]) -> SearchSpace:
        """Later overrides of a key replace earlier ones (the command line beats a preset's params)."""
        by_key: dict[str, Override] = {}
        for override in parser.parse_overrides(overrides):
            by_key[override.get_key_element()] = override
        distributions = {k: _distribution(o) for k, o in by_key.items() if o.is_sweep_override()}
        secret = next((k for k in distributions if redact.is_secret_key(k)), None)
        if secret:  # a trial's values are its record (the study's storage, its reports): no secret there
            raise SpaceError(f"hydra/sweeper=tune: a secret cannot be searched; give {secret} one value")
        fixed = [
            _input_line(o)
            for k, o in by_key.items()
            if not o.is_sweep_override() and not k.lstrip("+~").startswith(TUNE_PREFIX)
        ]
        if not distributions:
            raise SpaceError(
                "hydra/sweeper=tune: nothing to search; name knobs with several values on the command "
                "line, e.g. precision=bf16,fp8 train.micro_batch_size=1,2,4"
            )
        return cls(distributions, fixed)

    def overrides(self, params: dict[str, object]) -> list[str]:
        """A trial's overrides: the fixed ones, then its value of each knob."""
        return [*self.fixed, *(f"{k}={params[k]}" for k in self.distributions)]

    def fingerprint(self) -> str:
        """Stable text of what is searched and what is fixed (where runs are recorded left out), for
        naming the study."""
        spec = {
            "fixed": sorted(identity_overrides(self.fixed)),
            "space": {k: distribution_to_json(d) for k, d in sorted(self.distributions.items())},
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
