"""The search of the lanes pipeline: exact over every integer micro-batch size.

- :mod:`solver.lanes.search`: the pipeline's search (:func:`~solver.lanes.search.search_lanes`);
- :mod:`solver.lanes.terms`: the per-placement affine terms every method reads;
- :mod:`solver.lanes.bounds`: the closed-form upper bounds of a mode's throughput;
- :mod:`solver.lanes.exact`: the exact branch and bound;
- :mod:`solver.lanes.milp`: the MILP (pulp, CBC or HiGHS);
- :mod:`solver.lanes.verify`: the per-step bounds, enumeration and MILP that re-prove an optimum.
"""
