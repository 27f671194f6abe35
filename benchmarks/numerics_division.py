"""How often approximate division flips quantised codes: NVFP4 per tensor vs per token, and MXFP8.

The Composer 2 report (section 6.1) says NVFP4 quantisation needs IEEE-exact division and that a
fast approximate division diverged after ~100 RL steps. This script measures the mechanism: on
heavy-tailed activations (Student-t with 3 degrees of freedom times log-normal channel scales, the
outlier-channel shape of transformer activations), it quantises with ``division="exact"`` and with
``"approx"`` (the reciprocal rounded, then nudged by -1, 0 or +1 ulp) and counts the codes that
differ, how much the dequantised values move, and whether they move one way (``magnitude bias``:
mean of ``|approx| - |exact|`` over mean ``|x|``). Inputs are taken in bfloat16 (what a training
step hands the quantiser) and in float32.

    .venv/bin/python benchmarks/numerics_division.py [--tensors 32 --rows 256 --cols 2048 --threads 1]
    .venv/bin/python benchmarks/numerics_division.py --quick
"""

from __future__ import annotations

import argparse
import json

import torch
from _quick import parse_args

from opencomposer.numerics import dequantize_nvfp4, quantize_mx, quantize_nvfp4
from opencomposer.numerics.formats import unpack_fp4

QUICK = {"tensors": 2, "rows": 32, "cols": 256}


def activations(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    chi = (torch.randn(rows, cols, 3, generator=g) ** 2).mean(-1).sqrt()
    t3 = torch.randn(rows, cols, generator=g) / chi
    channel_scale = torch.exp(torch.randn(1, cols, generator=g))
    return t3 * channel_scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tensors", type=int, default=32, help="independent tensors (each its own per-tensor scale)"
    )
    parser.add_argument("--rows", type=int, default=256, help="rows (tokens) per tensor")
    parser.add_argument("--cols", type=int, default=2048, help="columns (channels) per tensor")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps the default")
    args = parse_args(parser, QUICK)
    if args.threads:
        torch.set_num_threads(args.threads)
    tensors = [activations(args.rows, args.cols, seed) for seed in range(args.tensors)]
    records = []
    print(f"{args.tensors} tensors of {args.rows}x{args.cols}; rates are fractions of all codes")
    header = f"{'format':7s} {'scale':7s} {'input':9s} {'division':12s} {'element flips':>13s} {'block-scale flips':>17s} {'global changed':>14s} {'mean |dq diff|/mean|x|':>23s} {'magnitude bias':>14s}"
    print(header)
    print("-" * len(header))
    for dtype in (torch.bfloat16, torch.float32):
        inputs = [t.to(dtype) for t in tensors]
        for granularity in ("tensor", "token"):
            exact = [quantize_nvfp4(x, granularity) for x in inputs]
            for ulp in (0, 1, -1):
                element = block = glob = 0
                diff = shrink = magnitude = 0.0
                for x, reference in zip(inputs, exact):
                    approx = quantize_nvfp4(x, granularity, "approx", ulp)
                    element += (unpack_fp4(approx.data) != unpack_fp4(reference.data)).sum().item()
                    block += (approx.block_scale != reference.block_scale).sum().item()
                    glob += (approx.global_scale != reference.global_scale).sum().item()
                    approx_values, exact_values = dequantize_nvfp4(approx), dequantize_nvfp4(reference)
                    diff += (approx_values - exact_values).abs().sum().item()
                    shrink += (approx_values.abs() - exact_values.abs()).sum().item()
                    magnitude += x.float().abs().sum().item()
                n = sum(x.numel() for x in inputs)
                n_global = sum(r.global_scale.numel() for r in exact)
                row = {
                    "format": "nvfp4",
                    "scale": granularity,
                    "input": str(dtype).removeprefix("torch."),
                    "division": f"approx{ulp:+d}ulp",
                    "element_flip_rate": element / n,
                    "block_scale_flip_rate": block / (n // 16),
                    "global_scale_change_rate": glob / n_global,
                    "relative_dequant_change": diff / magnitude,
                    "relative_magnitude_bias": shrink / magnitude,
                }
                records.append(row)
                print(
                    f"{'nvfp4':7s} {granularity:7s} {row['input']:9s} {row['division']:12s} {row['element_flip_rate']:13.2e} "
                    f"{row['block_scale_flip_rate']:17.2e} {row['global_scale_change_rate']:14.2e} {row['relative_dequant_change']:23.2e} {row['relative_magnitude_bias']:+14.2e}"
                )
        mx_exact = [quantize_mx(x) for x in inputs]
        for ulp in (0, 1, -1):
            flips = sum(
                (quantize_mx(x, division="approx", reciprocal_ulp=ulp).data != reference.data).sum().item()
                for x, reference in zip(inputs, mx_exact)
            )
            n = sum(x.numel() for x in inputs)
            row = {
                "format": "mxfp8",
                "scale": "block",
                "input": str(dtype).removeprefix("torch."),
                "division": f"approx{ulp:+d}ulp",
                "element_flip_rate": flips / n,
            }
            records.append(row)
            print(
                f"{'mxfp8':7s} {'block':7s} {row['input']:9s} {row['division']:12s} {row['element_flip_rate']:13.2e}"
            )
    out = args.results_dir / "numerics_division.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"tensors": args.tensors, "rows": args.rows, "cols": args.cols, "results": records}, indent=2
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
