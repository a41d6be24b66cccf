"""The searches: the best policy of an engine's space, exactly (docs/model.md §5).

- :mod:`solver.search`: the search API and the pipelines' searches (``SEARCHES``);
- :mod:`solver.request`: a checked search request, its result and statistics, plan building;
- :mod:`solver.analyses`: analyses over searches (every engine at its best, the ideal machine
  bound, the routing effect), for the CLI and the web planner alike;
- ``lanes/``: the lanes pipeline's exact search, terms, MILP and verifier;
- :mod:`solver.expert_level`: the expert-level (Klotski) pipeline's branch and bound;
- :mod:`solver.retarget`: a plan re-planned inside another engine's space;
- :mod:`solver.grid`, :mod:`solver.sweep`: sweep grids, their cells and backends (pool, Ray).
"""
