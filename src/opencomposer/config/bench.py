"""``[eval]``: ``opencomposer eval``, one or several policies on a suite of tasks (``opencomposer.bench``)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from opencomposer.config.agent import POLICY_NAMES
from opencomposer.config.section import ConfigError, Section

PRICE_KEYS = ("input", "output", "cached")


@dataclass(frozen=True)
class Price:
    """What a policy's tokens cost, in dollars per million tokens. Cached prompt tokens (a
    provider's prompt cache) are billed at ``cached``, the rest of the prompt at ``input``."""

    input: float
    output: float
    cached: float

    def dollars(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0) -> float:
        cached_tokens = min(cached_tokens, prompt_tokens)
        return ((prompt_tokens - cached_tokens) * self.input + cached_tokens * self.cached
                + completion_tokens * self.output) / 1e6


def parse_price(text: str) -> Price:
    """``input=3,output=15[,cached=0.3]`` ($ per million tokens) as a ``Price``; ``cached``
    defaults to ``input`` (a provider without a prompt cache bills every prompt token alike)."""
    values: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in PRICE_KEYS or key in values:
            raise ConfigError(f"eval.prices: {text!r}: expected input=X,output=Y[,cached=Z] in $ per million tokens, "
                              f"each key once; {item.strip()!r} is not one of {', '.join(PRICE_KEYS)}=NUMBER")
        try:
            values[key] = float(value)
        except ValueError:
            raise ConfigError(f"eval.prices: {text!r}: {key}={value.strip()!r} is not a number") from None
        if not values[key] >= 0:
            raise ConfigError(f"eval.prices: {text!r}: {key} must be a number >= 0, got {value.strip()}")
    missing = [key for key in ("input", "output") if key not in values]
    if missing:
        raise ConfigError(f"eval.prices: {text!r} lacks {' and '.join(missing)}; expected input=X,output=Y[,cached=Z]")
    return Price(values["input"], values["output"], values.get("cached", values["input"]))


def policy_prices(prices: list[str], policies: int) -> list[Price | None]:
    """``eval.prices`` as one ``Price`` per policy: one per policy in order, one for all, or none
    (None: use what the policy reports)."""
    parsed = [parse_price(text) for text in prices]
    return parsed * policies if len(parsed) == 1 else parsed or [None] * policies


def parse_date(text: str, key: str) -> datetime.date:
    """An ISO date ``YYYY-MM-DD``, or a ConfigError naming ``key``."""
    try:
        if len(text) != 10:
            raise ValueError
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a date; expected YYYY-MM-DD, e.g. 2025-06-01") from None


@dataclass
class EvalConfig(Section):
    """``opencomposer eval`` (``opencomposer.bench.eval``); command-line flags override these."""

    section = "eval"

    suite: str = ""
    """Folder of task folders (docs/task-format.md)."""
    policy: str = "oracle"
    """Policy spec: ``oracle``, ``noop``, ``local`` (the recipe's model), ``local:CHECKPOINT``, or
    ``openai:MODEL`` (``agent.http`` says where). Read only when ``policies`` is empty."""
    policies: list[str] = field(default_factory=list)
    """Several policy specs (as ``policy``) run on the same tasks and seeds and compared (``--policy``
    repeated); empty runs ``policy`` alone."""
    passes: int = 1
    """Samples (episodes) per task and policy: pass@1 is their mean, best-of-K whether any resolved
    (``--samples``; ``--passes`` is the older name)."""
    prices: list[str] = field(default_factory=list)
    """Dollars per million tokens, ``input=X,output=Y[,cached=Z]``: one per policy in order, or one for
    all; empty uses what the policy reports (``agent.http.input_cost_per_mtok`` and
    ``output_cost_per_mtok``)."""
    after: str = ""
    """``YYYY-MM-DD``: only tasks whose ``metadata.date`` is on or after it (tasks without a date are
    left out too); empty keeps every task."""
    workers: int = 1
    """Episodes run in parallel, each in its own sandbox."""
    limit: int = 0
    """Run only the first N tasks (sorted by id, after ``after``); 0 runs all."""
    out_dir: str = ""
    """Where results go; empty uses ``{run.out_dir}/{run.name}/eval``. An output folder that holds a
    ``results.jsonl`` is resumed: episodes already there are not run again."""

    @property
    def policy_specs(self) -> list[str]:
        """The policies to run: ``policies``, or ``policy`` alone."""
        return list(self.policies) or [self.policy]

    def validate(self) -> None:
        for spec in self.policy_specs:
            if spec.partition(":")[0] not in POLICY_NAMES:
                raise ConfigError(f"eval.policy: {spec!r} names no policy; expected one of "
                                  f"{', '.join(POLICY_NAMES)}, optionally followed by ':ARGUMENT'")
        if len(set(self.policy_specs)) != len(self.policy_specs):
            raise ConfigError(f"eval.policies: {self.policies} names a policy twice; each is run once per task and sample")
        if self.passes < 1 or self.workers < 1:
            raise ConfigError(f"eval.passes and eval.workers must be >= 1, got {self.passes} and {self.workers}")
        if self.limit < 0:
            raise ConfigError(f"eval.limit: must be >= 0, got {self.limit}")
        if len(self.prices) not in (0, 1, len(self.policy_specs)):
            raise ConfigError(f"eval.prices: {len(self.prices)} prices for {len(self.policy_specs)} policies; give "
                              f"one per policy, in the order of --policy, or one for all")
        policy_prices(self.prices, len(self.policy_specs))
        if self.after:
            parse_date(self.after, "eval.after")
