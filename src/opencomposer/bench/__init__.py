"""Evaluation: ``eval`` runs a policy over a suite (``opencomposer eval``), ``summary`` turns the
per-episode results into CursorBench-style statistics, ``basecheck`` holds the three base-model
selection checks (``opencomposer basecheck``: codebase NLL, state tracking, library questions), one
module each."""
