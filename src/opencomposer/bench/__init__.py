"""Evaluation: ``eval`` runs a policy over a suite (``opencomposer eval``), ``summary`` turns the
per-episode results into CursorBench-style statistics."""
