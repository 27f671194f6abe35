"""Does ``codebase_search`` find the files a task changes, from the task's own request, and how
many turns sooner does an explorer reach its first edit with it?

The oracle's own scripts never search: ``oracle_script`` edits in its first turn from the gold
patch, and ``explore_script`` greps for ``def NAME`` of the functions the patch changes, names it
knows from the patch, so its first edit is the third turn whatever tools are enabled. What the
search tools change is what a policy that knows only the request must do to find the code. So the
measure here is a **prompt-only explorer**: it knows the request, and recognises a file to change
when it reads one (the oracle's knowledge, used only to stop). Turn 1 it searches; then it reads
the files in the order its search gave, one a turn; the turn after it reads a gold-changed file it
edits. Its turns to the first edit are 2 + the rank of the first gold file in that order, the
order completed by the remaining files in path order (what a listing would give). Two searches:

- with ``codebase_search``: the tool's ranking (below);
- without it, ``grep-words``: what grep alone gives, ``grep -ril WORD`` for each distinct word of
  the request (3+ characters, identifier-like, common English words left out), files ranked by
  how many of the words they contain, ties in path order.

What is meaningful without a model is the retrieval the tool does for a model that asks it: for
each task with a gold patch, ``codebase_search``'s ranking (``agent.search.CodeIndex``, exactly
the tool's, at its result cap of 50 chunks) for the task's instruction as the query (cut to the
tool's 2,000 characters), over the task's starting repository. Its chunks are read in rank order
as a list of files (each file at its first chunk), and the gold-changed files that exist at the
start (a file the change creates cannot be found) are looked for in it:

- ``MRR``: mean over tasks of 1 / the rank of the first gold file (0 when none is in the list);
- ``recall@k``: mean share of a task's gold files among its first k files;
- ``symbol@10``: share of tasks where one of the first 10 chunks overlaps a line the gold patch
  changes (the chunk to read first is the one to edit);
- ``ms/query``: wall time of one search with the index built (the first search of an episode also
  builds the index: ``ms/index``).

Beside it, three references over the same files: ``bm25-files``, whole files ranked by BM25 over
plain lower-cased words (``\\w+``: no chunks, no identifier splitting, no definition words), what a
generic search would do; ``bm25-files-tw``, the same with test files' scores weighted by the tool's
``TEST_WEIGHT`` (so the difference to the tool is its chunks and code words alone); and ``random``, the expectation of a random order of the files (exact:
the first of g gold files among n is at rank r with probability C(n-r, g-1) / C(n, g)).

The ``turns`` column is the explorer's mean turns to the first edit with each ranking (the random
order's exact expectation). It is a bound for a model, which may stop reading earlier or later;
SFT-trained SmolLM2 with the search tools in its demonstrations is not measured here.

    .venv/bin/python benchmarks/search_tools.py [--suite src/opencomposer/suites/cursorbench]   # results/search_tools-SUITE.json
    .venv/bin/python benchmarks/search_tools.py --quick     # three tasks
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import time
from pathlib import Path

import numpy as np
from _quick import parse_args

from opencomposer.agent.search import (
    INDEX_MAX_FILE_BYTES,
    TEST_WEIGHT,
    CodeIndex,
    is_test_path,
    read_text_file,
    walk_files,
)
from opencomposer.agent.tools import SEARCH_MAX_QUERY_CHARS, SEARCH_MAX_RESULTS
from opencomposer.sandbox.patch import parse_patch
from opencomposer.tasks.format import load_suite
from opencomposer.types import Task

DEFAULT_SUITE = Path(__file__).resolve().parents[1] / "src" / "opencomposer" / "suites" / "cursorbench"
KS = (1, 3, 5, 10)
QUICK = {"limit_tasks": 3}


def gold_targets(task: Task) -> tuple[list[str], dict[str, set[int]]]:
    """The gold-changed files present at the start, and per file the old lines the patch changes
    (for a hunk that only adds, the line it adds after)."""
    files, lines = [], {}
    for fp in parse_patch(task.gold_patch):
        if fp.old_path is None or not (task.repo / fp.old_path).is_file():
            continue
        files.append(fp.old_path)
        changed: set[int] = set()
        for hunk in fp.hunks:
            number = hunk.old_start
            old, new = hunk.old_lines, hunk.new_lines
            kept = [line for line in old if line in new]
            removed = [i for i, line in enumerate(old) if line not in kept]
            changed.update(number + i for i in removed)
            if not removed:  # a pure addition: the context line around it
                changed.add(number + len(old) // 2)
        lines[fp.old_path] = changed
    return files, lines


def first_files(paths: list[str]) -> list[str]:
    """Paths in order of first appearance."""
    return list(dict.fromkeys(paths))


def scores_for(ranked: list[str], gold: list[str]) -> dict[str, float]:
    rank = next((i + 1 for i, path in enumerate(ranked) if path in gold), None)
    out = {"mrr": 1.0 / rank if rank else 0.0, "first_rank": rank or 0}
    for k in KS:
        out[f"recall@{k}"] = len(set(ranked[:k]) & set(gold)) / len(gold)
    return out


def random_scores(n: int, g: int) -> dict[str, float]:
    """The expectation of ``scores_for`` over a uniformly random order of n files, g of them gold."""
    total = math.comb(n, g)
    mrr = sum(math.comb(n - r, g - 1) / total / r for r in range(1, n - g + 2))
    out = {"mrr": mrr, "first_rank": 0}
    for k in KS:
        out[f"recall@{k}"] = min(k, n) / n
    return out


STOP_WORDS = frozenset("""the and for with that this from into when are not but its can will should would
have has was were been use used using add adds added allow allows new make makes also than then them they
their there these those which what where who how all any each other more most some such only own same
too very just now out over under about after before again further once here why both few nor off per via
""".split())


def prompt_words(instruction: str) -> list[str]:
    """The request's distinct identifier-like words of 3+ characters, lower-cased, in order,
    common English words left out: what an explorer would grep for."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_-]{2,}", instruction)
    return list(dict.fromkeys(w.lower().strip("-") for w in words if w.lower() not in STOP_WORDS))


def grep_words(repo: Path, instruction: str) -> list[str]:
    """Every file, ranked by how many of ``prompt_words`` it contains (``grep -ril WORD`` each:
    case-insensitive substrings), ties and files with none in path order."""
    files, _ = walk_files(repo, repo)
    words = prompt_words(instruction)
    counts = {}
    for f in files:
        text = read_text_file(f.host, INDEX_MAX_FILE_BYTES)
        lowered = "" if text is None else text.lower()
        counts[f.rel] = sum(word in lowered for word in words)
    return sorted(counts, key=lambda rel: (-counts[rel], rel))


def completed(ranked: list[str], repo: Path) -> list[str]:
    """``ranked`` followed by the repository's other files in path order."""
    files, _ = walk_files(repo, repo)
    return first_files([*ranked, *sorted(f.rel for f in files)])


def turns_to_first_edit(ranked: list[str], gold: list[str]) -> int:
    """The prompt-only explorer's turn of its first edit (module doc): search, one read a turn in
    ``ranked``'s order until a gold file, then the edit."""
    return 2 + next(i + 1 for i, path in enumerate(ranked) if path in gold)


def random_turns(n: int, g: int) -> float:
    """The expectation of ``turns_to_first_edit`` over a uniformly random order of n files, g gold."""
    total = math.comb(n, g)
    return 2 + sum(r * math.comb(n - r, g - 1) / total for r in range(1, n - g + 2))


def plain_bm25(repo: Path, query: str, test_weight: float = 1.0) -> list[str]:
    """Whole files ranked by BM25 over lower-cased ``\\w+`` words (the reference), test files'
    scores multiplied by ``test_weight``."""
    import bm25s

    files, _ = walk_files(repo, repo)
    texts = {f.rel: read_text_file(f.host, INDEX_MAX_FILE_BYTES) for f in files}
    paths = [rel for rel, text in texts.items() if text is not None]
    words = [re.findall(r"\w+", f"{rel}\n{texts[rel]}".lower()) or ["\0"] for rel in paths]
    retriever = bm25s.BM25()
    retriever.index(words, show_progress=False)
    weights = np.array([test_weight if is_test_path(rel) else 1.0 for rel in paths])
    scores = np.asarray(retriever.get_scores(re.findall(r"\w+", query.lower()))) * weights
    return [paths[i] for i in np.argsort(-scores, kind="stable") if scores[i] > 0]


def measure(task: Task) -> dict[str, object] | None:
    gold, changed = gold_targets(task)
    if not gold:
        return None
    query = task.instruction[:SEARCH_MAX_QUERY_CHARS]
    started = time.perf_counter()
    index = CodeIndex(task.repo)
    index.refresh()
    index_ms = (time.perf_counter() - started) * 1e3
    started = time.perf_counter()
    hits = index.search(query, SEARCH_MAX_RESULTS)
    query_ms = (time.perf_counter() - started) * 1e3
    n_files = len({c.path for c in index.chunks})
    tool = scores_for(first_files([h.chunk.path for h in hits]), gold)
    tool["symbol@10"] = float(any(h.chunk.path in changed and changed[h.chunk.path] & set(range(h.chunk.start,
                                  h.chunk.end + 1)) for h in hits[:10]))
    tool["turns"] = turns_to_first_edit(completed(first_files([h.chunk.path for h in hits]), task.repo), gold)
    plain = scores_for(plain_bm25(task.repo, query), gold)
    plain_weighted = scores_for(plain_bm25(task.repo, query, TEST_WEIGHT), gold)
    grep_ranked = grep_words(task.repo, task.instruction)
    grep = {**scores_for(grep_ranked, gold), "turns": turns_to_first_edit(grep_ranked, gold)}
    walked = len(walk_files(task.repo, task.repo)[0])
    return {"task": task.id, "files": n_files, "gold": gold, "query_chars": len(query),
            "index_ms": index_ms, "query_ms": query_ms,
            "codebase_search": tool, "grep-words": grep, "bm25-files": plain, "bm25-files-tw": plain_weighted,
            "random": {**random_scores(n_files, len(gold)), "turns": random_turns(walked, len(gold))},
            "top_files": first_files([h.chunk.path for h in hits])[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE, help="a folder of task folders")
    parser.add_argument("--limit-tasks", type=int, default=0, help="only the first N tasks (0: all)")
    args = parse_args(parser, QUICK)
    tasks = [t for t in load_suite(args.suite) if t.gold_patch]
    if args.limit_tasks:
        tasks = tasks[:args.limit_tasks]
    rows = [row for row in map(measure, tasks) if row is not None]
    print(f"{len(rows)} tasks with a findable gold file (of {len(tasks)} with a gold patch) in {args.suite}; "
          f"files per repository: median {statistics.median(r['files'] for r in rows):g}; "
          f"gold files per task: median {statistics.median(len(r['gold']) for r in rows):g}")
    header = ["ranker", "MRR", *(f"recall@{k}" for k in KS), "symbol@10", "turns", "ms/index", "ms/query"]
    print("  ".join(f"{h:>15}" for h in header))
    summary = {}
    for ranker in ("codebase_search", "grep-words", "bm25-files", "bm25-files-tw", "random"):
        mean = {key: statistics.fmean(r[ranker][key] for r in rows) for key in ["mrr", *(f"recall@{k}" for k in KS)]}
        if "turns" in rows[0][ranker]:
            mean["turns"] = statistics.fmean(r[ranker]["turns"] for r in rows)
            mean["turns_median"] = statistics.median(r[ranker]["turns"] for r in rows)
        if ranker == "codebase_search":
            mean["symbol@10"] = statistics.fmean(r[ranker]["symbol@10"] for r in rows)
            mean["index_ms"] = statistics.median(r["index_ms"] for r in rows)
            mean["query_ms"] = statistics.median(r["query_ms"] for r in rows)
        summary[ranker] = mean
        cells = [ranker, *(f"{mean[key]:.3f}" for key in ["mrr", *(f"recall@{k}" for k in KS)])]
        cells += [f"{mean[key]:.3f}" if key in mean else "-" for key in ("symbol@10",)]
        cells += [f"{mean['turns']:.2f}" if "turns" in mean else "-"]
        cells += [f"{mean[key]:.1f}" if key in mean else "-" for key in ("index_ms", "query_ms")]
        print("  ".join(f"{c:>15}" for c in cells))
    paired = [r["grep-words"]["turns"] - r["codebase_search"]["turns"] for r in rows]
    half = 1.96 * statistics.stdev(paired) / math.sqrt(len(paired)) if len(paired) > 1 else float("nan")
    summary["turns_saved"] = {"mean": statistics.fmean(paired), "ci95": half, "faster": sum(d > 0 for d in paired),
                              "slower": sum(d < 0 for d in paired), "equal": sum(d == 0 for d in paired)}
    print(f"turns to the first edit saved by codebase_search against grep-words: {statistics.fmean(paired):+.2f} "
          f"(95% interval ±{half:.2f}); sooner on {summary['turns_saved']['faster']} tasks, later on "
          f"{summary['turns_saved']['slower']}, the same on {summary['turns_saved']['equal']}")
    misses = [r["task"] for r in rows if not r["codebase_search"]["first_rank"]]
    print(f"tasks whose gold files are not among codebase_search's {SEARCH_MAX_RESULTS} chunks: "
          f"{', '.join(misses) or 'none'}")
    out = args.results_dir / f"search_tools-{args.suite.resolve().name}.json"
    out.write_text(json.dumps({"suite": str(args.suite), "summary": summary, "tasks": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
