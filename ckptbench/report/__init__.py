"""Rendering what was measured: the self-contained HTML report, comparison tables, the GPU summary."""
