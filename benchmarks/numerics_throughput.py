"""Quantise / dequantise throughput of opencomposer.numerics beside torchao, on the same tensors.

Prints, per operation: our time and torchao's (best of ``--repeats``, the two interleaved so that
a noisy neighbour hits both alike), the ratio torchao/ours (above 1: we are faster), and our
effective bandwidth (bytes read + bytes written per second) beside a plain copy of the input
tensor, which is the memory-bound limit on this machine.

MXFP8 codes are bit-identical between the two (tests/numerics/test_mx.py). torchao's NVFP4
quantiser uses a different arithmetic order (and no per-token scale), so its codes differ in the
last bits; the NVFP4 rows compare time only.

    .venv/bin/python benchmarks/numerics_throughput.py [--rows 4096 --cols 4096 --threads 1]
    .venv/bin/python benchmarks/numerics_throughput.py --quick   # without torchao installed: ours alone
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from _quick import parse_args

from opencomposer.numerics import dequantize_mx, dequantize_nvfp4, quantize_mx, quantize_nvfp4

QUICK = {"rows": 64, "cols": 256, "repeats": 1}
NAN = float("nan")


def best_times(fns: dict[str, callable], repeats: int) -> dict[str, float]:
    """Best wall time of each function, calls interleaved round-robin after one warm-up each; a
    function that is None (a peer not installed) gets NaN."""
    missing = {name: NAN for name, fn in fns.items() if fn is None}
    fns = {name: fn for name, fn in fns.items() if fn is not None}
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best | missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096, help="rows of the tensor")
    parser.add_argument("--cols", type=int, default=4096, help="columns of the tensor")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per operation (the best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps the default")
    args = parse_args(parser, QUICK)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale
        torchao = True
    except ImportError:
        if not args.quick:
            raise SystemExit("torchao is not installed: pip install -e '.[dev]'") from None
        torchao = False

    def torchao_nvfp4(x: torch.Tensor):
        """torchao's two-level NVFP4 with the per-tensor scale from the tensor's amax (timed with it)."""
        return nvfp4_quantize(x, 16, per_tensor_amax_to_scale(x.abs().amax().float()))

    def peer(fn, *arguments):
        """torchao's ``fn(*arguments)`` to time, or None without torchao."""
        return partial(fn, *arguments) if torchao else None

    g = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        x = (
            torch.randn(args.rows, args.cols, generator=g)
            * torch.exp(torch.randn(args.rows, args.cols, generator=g))
        ).to(dtype)
        n = x.numel()
        in_bytes = n * x.element_size()
        copy = best_times({"copy": x.clone}, args.repeats)["copy"]
        copy_gbs = 2 * in_bytes / copy / 1e9
        for mode in ("floor", "rceil"):
            ao_mode = (ScaleCalculationMode.FLOOR if mode == "floor" else ScaleCalculationMode.RCEIL) if torchao else None
            t = best_times(
                {
                    "ours": partial(quantize_mx, x, "e4m3", 32, mode),
                    "torchao": peer(to_mx, x, torch.float8_e4m3fn, 32, ao_mode),
                },
                args.repeats,
            )
            rows.append(("mxfp8 quantize " + mode, dtype, t, in_bytes + n + n // 32, copy_gbs))
        q = quantize_mx(x)
        ao_scale, ao_data = to_mx(x, torch.float8_e4m3fn, 32) if torchao else (None, None)
        t = best_times(
            {
                "ours": partial(dequantize_mx, q, dtype),
                "torchao": peer(to_dtype, ao_data, ao_scale, torch.float8_e4m3fn, 32, dtype),
            },
            args.repeats,
        )
        rows.append(("mxfp8 dequantize", dtype, t, n + n // 32 + in_bytes, copy_gbs))
        t = best_times(
            {"ours": partial(quantize_nvfp4, x, "tensor"), "torchao": peer(torchao_nvfp4, x)}, args.repeats
        )
        rows.append(("nvfp4 quantize tensor", dtype, t, in_bytes + n // 2 + n // 16, copy_gbs))
        t = best_times({"ours": partial(quantize_nvfp4, x, "token"), "torchao": None}, args.repeats)
        rows.append(("nvfp4 quantize token", dtype, t, in_bytes + n // 2 + n // 16, copy_gbs))
        nq = quantize_nvfp4(x, "token")
        t = best_times({"ours": partial(dequantize_nvfp4, nq, dtype), "torchao": None}, args.repeats)
        rows.append(("nvfp4 dequantize token", dtype, t, n // 2 + n // 16 + in_bytes, copy_gbs))

    print(f"tensor {args.rows}x{args.cols}, torch threads {torch.get_num_threads()}, best of {args.repeats}")
    header = f"{'operation':26s} {'input':9s} {'ours ms':>8s} {'torchao ms':>10s} {'ratio':>6s} {'ours GB/s':>9s} {'copy GB/s':>9s}"
    print(header)
    print("-" * len(header))
    records = []
    for name, dtype, t, traffic, copy_gbs in rows:
        ratio = t["torchao"] / t["ours"]
        gbs = traffic / t["ours"] / 1e9
        dtype_name = str(dtype).removeprefix("torch.")
        print(
            f"{name:26s} {dtype_name:9s} {t['ours'] * 1e3:8.1f} {t['torchao'] * 1e3:10.1f} {ratio:6.2f} {gbs:9.2f} {copy_gbs:9.2f}"
        )
        records.append(
            {
                "operation": name,
                "input_dtype": dtype_name,
                "ours_ms": t["ours"] * 1e3,
                "torchao_ms": None if t["torchao"] != t["torchao"] else t["torchao"] * 1e3,
                "ratio_torchao_over_ours": None if ratio != ratio else ratio,
                "ours_gb_per_s": gbs,
                "copy_gb_per_s": copy_gbs,
            }
        )
    out = args.results_dir / f"numerics_throughput_threads{torch.get_num_threads()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"rows": args.rows, "cols": args.cols, "threads": torch.get_num_threads(), "results": records},
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
