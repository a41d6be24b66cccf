"""HRM figures (matplotlib, headless): each kind has a pure data function and a drawing
function that returns a :class:`matplotlib.figure.Figure`.

- ``roofline.py``: :func:`roofline_data` / :func:`plot_roofline` — the HRM plot of one operator (Fig. 4/5);
- ``policy_map.py``: :func:`plot_policy_map` — best policy over link bandwidth × CPU scaling (Fig. 10), data
  from :func:`solver.sweep.policy_map`;
- ``cpu_memory.py``: :func:`plot_cpu_memory` — throughput vs CPU memory per schedule (Fig. 1), data from
  :func:`solver.sweep.cpu_memory_sweep`;
- ``compare.py``: :func:`compare_table` / :func:`plot_compare` — every engine at its best policy, throughput
  and per-token latency (``hrm-search --compare --plot``);
- ``timeline.py``: :func:`plot_timeline` — Gantt chart of decode layers from :func:`hrm.pipelines.decode_timeline`
  and, optionally, a runtime trace.

``_common.py``: :func:`save_png` writes a figure atomically; :func:`new_figure` makes one without
pyplot.
"""

from ._common import new_figure, save_png
from .compare import compare_table, plot_compare
from .cpu_memory import plot_cpu_memory
from .policy_map import plot_policy_map
from .roofline import RooflineData, plot_roofline, roofline_data
from .timeline import plot_timeline, trace_boxes

__all__ = ["RooflineData", "compare_table", "plot_compare", "plot_cpu_memory", "plot_policy_map", "plot_roofline", "plot_timeline",
           "new_figure", "roofline_data", "save_png", "trace_boxes"]
