"""The searches: the best policy of an engine's space, exactly (docs/model.md §5).

- :mod:`solver.search`: the search API and the pipelines' searches (``SEARCHES``);
- :mod:`solver.request`: a checked search request, its result and plan building;
- ``lanes/``: the lanes pipeline's exact search, terms, MILP and verifier;
- :mod:`solver.expert_level`: the expert-level (Klotski) pipeline's branch and bound;
- :mod:`solver.retarget`: a plan re-planned inside another engine's space;
- :mod:`solver.grid`, :mod:`solver.sweep`: sweep grids, their cells and backends (pool, Ray).
"""
