"""``[ablation]``: ``opencomposer ablate``, a grid of runs of one recipe (docs/ablations.md).

A study is the recipe it varies plus this section: which recipe keys take which values
(``vary``), the seeds every grid cell runs with (``seeds``, each given to ``run.seed``), the
metrics the table and the report show, where the runs go, and how they run. The command line's
``--vary``, ``--seeds``, ``--out`` and ``--backend`` extend or replace these fields.

``vary`` is written either as a table, ``vary = {"rl.advantage.std_normalize" = [false, true]}``,
or as a list of ``"KEY=V1,V2"`` strings, the form ``--vary`` takes; the table becomes that form
when the section is made. Each value is read as ``--set KEY=VALUE`` reads it, by the type of the
field the key names (``grid_overrides``); commas inside brackets or quotes do not split values.

A study whose cells are not a product ("no KL / k1 in the reward / k3 in the loss") lists them:
``cells = [{"rl.kl.coef" = 0.0}, {"rl.kl.estimator" = "k1", "rl.kl.placement" = "reward"}]``,
or the strings ``"KEY=VALUE;KEY=VALUE"`` (the form ``--cell`` takes). Each listed cell is crossed
with ``vary``'s product when both are given.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from opencomposer.config.section import ConfigError, Section, show

DEFAULT_METRICS = ["eval/pass_at_1", "eval/mean_reward", "train/reward_mean", "train/resolved_rate"]
RESERVED = ("ablation.", "run.out_dir", "run.name", "run.seed")
MAX_CELL_NAME = 120
"""Keys a study may not vary: the grid's own section, and what the runner sets for each cell."""


@dataclass
class AblationConfig(Section):
    """The grid of ``opencomposer ablate``; ``commands.ablate`` runs it, ``bench.ablation`` reports it."""

    section = "ablation"

    vary: list[str] = field(default_factory=list)
    """The varied recipe keys, each "KEY=V1,V2,..." (or a TOML table KEY -> list of values); the
    grid is the cartesian product of their values."""
    cells: list[str] = field(default_factory=list)
    """Cells listed one by one, each "KEY=VALUE;KEY=VALUE" (or a TOML table KEY -> value): the
    grid when it is not a product; crossed with vary's product when both are given."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds every grid cell runs with (run.seed); the table's intervals are over these."""
    metrics: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    """What the table and report show, each "eval/NAME" (the held-out evaluation's metrics.jsonl
    rows) or "train/NAME" (the training steps' rows)."""
    out: str = ""
    """Folder of the study; empty: {run.out_dir}/{run.name}-ablation."""
    prefix: Literal["none", "sft", "pretrain_sft"] = "none"
    """What runs before each cell's RL: nothing (RL starts from model.path); the recipe's SFT
    stage ("sft"), whose checkpoint RL starts from; or pretraining, then SFT from its checkpoint,
    then RL (the quickstart's chain, "pretrain_sft"). Shared by the cells of one seed when every
    varied key is an rl.* key."""
    backend: Literal["local", "ray"] = "local"
    """Run the cells one after another here, or as tasks of a Ray cluster (services.ray_address;
    empty starts a local one of services.ray_num_cpus CPUs)."""
    ray_cpus_per_cell: float = 1.0
    """CPUs each cell's Ray task asks for (backend = "ray")."""

    def __post_init__(self) -> None:
        if isinstance(self.vary, dict):  # the table form, into the "KEY=V1,V2" strings of --vary
            vary = []
            for key, values in self.vary.items():
                if not isinstance(values, list) or not values:
                    raise ConfigError(f"ablation.vary.{key}: expected a list of values, got {show(values)}")
                vary.append(f"{key}=" + ",".join(_literal(value, f"ablation.vary.{key}") for value in values))
            self.vary = vary
        if isinstance(self.cells, list):  # the table form of each cell, into the "KEY=VALUE;KEY=VALUE" of --cell
            cells = []
            for i, cell in enumerate(self.cells):
                if isinstance(cell, dict):
                    if not cell:
                        raise ConfigError(f"ablation.cells[{i}]: an empty cell; give it KEY = value pairs")
                    cell = ";".join(f"{key}={_literal(value, f'ablation.cells[{i}].{key}')}" for key, value in cell.items())
                cells.append(cell)
            self.cells = cells
        super().__post_init__()

    def validate(self) -> None:
        keys = [parse_vary(item)[0] for item in self.vary]
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ConfigError(f"ablation.vary: {', '.join(repeated)} varied twice; give each key one list of values")
        listed = [parse_cell(item) for item in self.cells]
        if len({tuple(sorted(cell.items())) for cell in listed}) != len(listed):
            raise ConfigError("ablation.cells: a cell is listed twice")
        both = sorted({key for cell in listed for key in cell} & set(keys))
        if both:
            raise ConfigError(f"ablation: {', '.join(both)} both in a listed cell and varied; give each key one place")
        if not self.seeds:
            raise ConfigError("ablation.seeds: at least one seed is needed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"ablation.seeds: {self.seeds} repeats a seed")
        for metric in self.metrics:
            kind, _, name = metric.partition("/")
            if kind not in ("eval", "train") or not name:
                raise ConfigError(f"ablation.metrics: {metric!r} is not \"eval/NAME\" or \"train/NAME\"")
        if self.ray_cpus_per_cell < 0:
            raise ConfigError(f"ablation.ray_cpus_per_cell: must be >= 0, got {self.ray_cpus_per_cell}")

    def grid(self) -> list[dict[str, str]]:
        """The grid cells, each the override text of every key it sets (``{"rl.lr": "1e-4"}``):
        each listed cell (or one empty cell without ``cells``) with each combination of the varied
        values, in the order of the product (the last key varies fastest)."""
        axes = [[(key, value) for value in values] for key, values in map(parse_vary, self.vary)]
        listed = [parse_cell(item) for item in self.cells] or [{}]
        return [{**cell, **dict(combination)} for cell in listed for combination in itertools.product(*axes)]

    def keys(self) -> set[str]:
        """Every recipe key a cell of the grid sets."""
        return {key for cell in self.grid() for key in cell}


def _literal(value: Any, key: str) -> str:
    """``value`` of a parsed TOML table as the override text that reads back as it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string too
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item, key) for item in value) + "]"
    raise ConfigError(f"{key}: {show(value)} cannot be a varied value (a boolean, number, string or list)")


def _key(key: str, item: str, where: str, form: str) -> str:
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{where}: {item!r} is not {form}")
    if key.startswith(RESERVED[0]) or key in RESERVED[1:]:
        what = "the runner sets it for each cell" if key.startswith("run.") else "it is the grid itself"
        raise ConfigError(f"{where}: {key} cannot be varied ({what}); "
                          + ("seeds go in ablation.seeds" if key == "run.seed" else "vary another key"))
    return key


def parse_vary(item: str) -> tuple[str, list[str]]:
    """``"KEY=V1,V2"`` → ``("KEY", ["V1", "V2"])``; a ConfigError naming ``item`` if it is not that."""
    key, eq, text = item.partition("=")
    form = "KEY=V1,V2,... (for example rl.lr=1e-4,3e-4)"
    if not eq:
        raise ConfigError(f"ablation.vary: {item!r} is not {form}")
    key = _key(key, item, "ablation.vary", form)
    values = split_values(text)
    if not values or any(not value for value in values):
        raise ConfigError(f"ablation.vary: {item!r} has an empty value; expected KEY=V1,V2,...")
    if len(set(values)) != len(values):
        raise ConfigError(f"ablation.vary: {item!r} repeats a value")
    return key, values


def parse_cell(item: str) -> dict[str, str]:
    """``"KEY=VALUE;KEY=VALUE"`` → ``{"KEY": "VALUE", ...}``; a ConfigError naming ``item`` if it is not that."""
    form = "KEY=VALUE;KEY=VALUE (for example rl.kl.estimator=k3;rl.kl.placement=loss)"
    cell: dict[str, str] = {}
    for part in split_values(item, ";"):
        key, eq, value = part.partition("=")
        if not eq or not value.strip():
            raise ConfigError(f"ablation.cells: {item!r} is not {form}")
        key = _key(key, item, "ablation.cells", form)
        if key in cell:
            raise ConfigError(f"ablation.cells: {item!r} sets {key} twice")
        cell[key] = value.strip()
    return cell


def split_values(text: str, separator: str = ",") -> list[str]:
    """``text`` split at its commas (or ``separator``), except those inside brackets or quotes
    (``[1, 2],"a,b"``)."""
    values, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == separator and depth == 0:
            values.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    values.append("".join(current).strip())
    return values


def cell_name(cell: dict[str, str]) -> str:
    """A cell's folder name, ``rl.lr=1e-4,rl.kl.estimator=k3``; ``base`` for the cell of an empty
    grid. A quoted string value loses its quotes; characters a folder name should not hold become ``_``."""
    if not cell:
        return "base"
    unquoted = {key: value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'" else value
                for key, value in cell.items()}
    text = ",".join(f"{key}={value}" for key, value in unquoted.items())
    name = "".join(c if c.isalnum() or c in "._=,+-" else "_" for c in text)
    if len(name) > MAX_CELL_NAME:  # a folder name has at most 255 bytes: the start, and a digest of the whole
        name = name[:MAX_CELL_NAME - 9] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return name
