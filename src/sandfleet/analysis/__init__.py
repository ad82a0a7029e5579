"""Trace analysis: where rollout time goes and what a hardware choice changes.

- :mod:`~sandfleet.analysis.trace`: read and validate ``trace.jsonl`` (``load_run``).
- :mod:`~sandfleet.analysis.breakdown`: per-span breakdown, A/B comparison, what-if
  inference k times faster, and the gap's definition.
- :mod:`~sandfleet.analysis.figures`: platform overhead, KV-cache idle, GRPO group wait,
  staleness.
- :mod:`~sandfleet.analysis.report`: every figure in one typed report (``build_report``;
  ``analyze`` is its JSON).
- :mod:`~sandfleet.analysis.schema`: the report's types (:class:`Report`); its renderers read
  only it: the JSON (``Report.to_json``), :mod:`~sandfleet.analysis.text` (tables) and
  :mod:`~sandfleet.analysis.html` (the HTML report; matplotlib charts, loaded only there).

Every figure is defined in ``docs/figures.md``.
- :mod:`~sandfleet.analysis.convert`: other systems' results (Harbor) into traces.
- ``sandfleet analyze`` is :mod:`sandfleet.cli.analyze`.

Library functions return data; only the CLI prints.
"""

from __future__ import annotations

from sandfleet.analysis.report import analyze, build_report
from sandfleet.analysis.schema import Report
from sandfleet.analysis.trace import Rollout, Run, Span, TraceError, load_run, write_trace

__all__ = ["Report", "Rollout", "Run", "Span", "TraceError", "analyze", "build_report", "load_run", "write_trace"]
