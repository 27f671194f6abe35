"""Weight sync between RL steps: bytes per published version against a full snapshot, and the time
to publish and to rebuild, through ``services.weights.WeightStore``.

For each model (the tiny MoE, SmolLM2-135M) and Adam learning rate (RL rates: 1e-6, 1e-5), float32
master weights take ``--steps`` real Adam steps on a next-token loss over random tokens (the
gradient an RL step would give is as dense as this one: every parameter a batch touches). After
every step the trainer publishes its parameters twice, to two stores on local disk: in float32,
and cast to bfloat16 (what an inference fleet serves). Version 0 (the weights before training) is
the full snapshot; versions 1..steps are deltas. A live subscriber applies each delta as it lands.

Reported per delta: the fraction of elements whose bits did not change (counted here, on the
tensors, not by the store), delta bytes (data + manifest) over the raw bytes of a full snapshot,
the reduction factor (its inverse), publish seconds (copy, encode, compress, write) and the live
subscriber's apply seconds; per run, the seconds to rebuild the last version from scratch in a
fresh store (full snapshot + every delta, checksums verified), checked bit-identical with what was
published. The motivation: ~98-99% of bf16 weights are bit-identical between RL steps (Fireworks,
arXiv 2602.03839).

    .venv/bin/python benchmarks/weight_sync.py [--models tiny_moe smollm2 --lrs 1e-6 1e-5 --steps 4 --threads 0]
    .venv/bin/python benchmarks/weight_sync.py --quick   # the tiny MoE, one rate, two deltas
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _quick import parse_args

from opencomposer.config import ModelConfig
from opencomposer.model.loading import load_model
from opencomposer.services.weights import WeightStore

QUICK = {"models": ["tiny_moe"], "lrs": [1e-5], "steps": 2, "batch": 1, "tokens": 16}
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parameters(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trained tensors (tied embeddings once), as the trainer would publish them in ``dtype``."""
    return {name: p.detach().to(dtype) for name, p in model.named_parameters()}


def identical_elements(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> int:
    return sum(
        int((old[n].view(INT_VIEW[old[n].element_size()]) == new[n].view(INT_VIEW[new[n].element_size()])).sum())
        for n in new
    )


def encodings(root: Path, version: int) -> dict[str, int]:
    """How many tensors of a version each encoding carries (from its manifest)."""
    counts: dict[str, int] = {}
    for entry in json.loads((root / f"v{version:012d}.json").read_text())["tensors"]:
        counts[entry["encoding"]] = counts.get(entry["encoding"], 0) + 1
    return counts


def run(kind: str, lr: float, args: argparse.Namespace, scratch: Path) -> list[dict]:
    model, _ = load_model(ModelConfig(kind=kind), seed=0)
    model.train()
    vocab = model.config.vocab_size
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    tokens = torch.Generator().manual_seed(0)
    stores, subscribers, previous, rows = {}, {}, {}, {}
    for name, dtype in DTYPES.items():
        stores[name] = WeightStore(scratch / f"{kind}-{lr:g}-{name}", full_every=args.steps + 1)
        state = parameters(model, dtype)
        record = stores[name].publish(state, 0)
        subscribers[name] = stores[name].subscribe()
        started = time.perf_counter()
        subscribers[name].update()
        rows[name] = {
            "model": kind,
            "dtype": name,
            "lr": lr,
            "elements": record.elements,
            "full_bytes": record.full_bytes,
            "full_snapshot": {"bytes": record.bytes_written, "publish_s": record.seconds,
                              "load_s": time.perf_counter() - started},
            "steps": [],
        }
        previous[name] = {n: t.clone() for n, t in state.items()}
    for version in range(1, args.steps + 1):
        ids = torch.randint(0, vocab, (args.batch, args.tokens), generator=tokens)
        started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_s = time.perf_counter() - started
        for name, dtype in DTYPES.items():
            state = parameters(model, dtype)
            record = stores[name].publish(state, version)
            started = time.perf_counter()
            subscribers[name].update()
            apply_s = time.perf_counter() - started
            identical = identical_elements(previous[name], state)
            assert record.changed_elements == record.elements - identical, (record, identical)
            row = {
                "version": version,
                "loss": loss.item(),
                "train_s": train_s,
                "identical_fraction": identical / record.elements,
                "delta_bytes": record.bytes_written,
                "delta_over_full": record.bytes_written / record.full_bytes,
                "reduction": record.full_bytes / record.bytes_written,
                "publish_s": record.seconds,
                "apply_s": apply_s,
                "encodings": encodings(Path(stores[name].root), version),
            }
            rows[name]["steps"].append(row)
            previous[name] = {n: t.clone() for n, t in state.items()}
            print(
                f"{kind:9s} {name:9s} {lr:7.0e} {version:4d} {row['identical_fraction']:10.4%} "
                f"{record.bytes_written / 2**20:9.2f} {row['delta_over_full']:9.4f} {row['reduction']:9.1f} "
                f"{row['publish_s']:9.3f} {row['apply_s']:8.3f}",
                flush=True,
            )
    for name in DTYPES:
        reader = WeightStore(stores[name].url)  # a late joiner: nothing in memory
        started = time.perf_counter()
        rebuilt = reader.load(args.steps)
        rows[name]["rebuild_s"] = time.perf_counter() - started
        rows[name]["rebuild_versions"] = args.steps + 1
        assert all(
            torch.equal(rebuilt[n].view(INT_VIEW[t.element_size()]), t.view(INT_VIEW[t.element_size()]))
            for n, t in previous[name].items()
        ), f"{kind} {name}: the rebuilt version differs from the published one"
        steps = rows[name]["steps"]
        delta_bytes = sum(step["delta_bytes"] for step in steps)
        rows[name]["summary"] = {  # over the deltas: means, and the byte totals' ratio
            "identical_fraction": statistics.fmean(step["identical_fraction"] for step in steps),
            "delta_over_full": delta_bytes / (len(steps) * rows[name]["full_bytes"]),
            "reduction": len(steps) * rows[name]["full_bytes"] / delta_bytes,
            "publish_s": statistics.fmean(step["publish_s"] for step in steps),
            "apply_s": statistics.fmean(step["apply_s"] for step in steps),
        }
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny_moe", "smollm2"], help="model kinds")
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-6, 1e-5], help="Adam learning rates")
    parser.add_argument("--steps", type=int, default=4, help="Adam steps (deltas) per model and rate")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps the default")
    args = parse_args(parser, QUICK)
    if args.threads:
        torch.set_num_threads(args.threads)
    header = (
        f"{'model':9s} {'dtype':9s} {'lr':>7s} {'ver':>4s} {'identical':>10s} {'delta MiB':>9s} "
        f"{'delta/full':>9s} {'reduction':>9s} {'publish s':>9s} {'apply s':>8s}"
    )
    print(header)
    print("-" * len(header))
    results = []
    for kind in args.models:
        for lr in args.lrs:
            with tempfile.TemporaryDirectory(prefix="weight-sync-") as scratch:
                results += run(kind, lr, args, Path(scratch))
    print(f"\nover the {args.steps} deltas of each run; rebuild: the last version from scratch (full + {args.steps} deltas)")
    print(
        f"{'model':9s} {'dtype':9s} {'lr':>7s} {'full MiB':>9s} {'identical':>10s} {'delta/full':>10s} "
        f"{'reduction':>9s} {'publish s':>9s} {'apply s':>8s} {'rebuild s':>9s}"
    )
    for row in results:
        summary = row["summary"]
        print(
            f"{row['model']:9s} {row['dtype']:9s} {row['lr']:7.0e} {row['full_bytes'] / 2**20:9.1f} "
            f"{summary['identical_fraction']:10.4%} {summary['delta_over_full']:10.4f} {summary['reduction']:9.1f} "
            f"{summary['publish_s']:9.3f} {summary['apply_s']:8.3f} {row['rebuild_s']:9.3f}"
        )
    out = args.results_dir / "weight_sync.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "steps": args.steps, "batch": args.batch, "tokens": args.tokens, "threads": torch.get_num_threads(),
        "results": results,
    }, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
