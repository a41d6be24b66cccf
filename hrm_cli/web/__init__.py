"""``hrm serve``: the web planner, a thin layer over the CLI's own functions.

- :mod:`hrm_cli.web.inputs` — the request fields (named as the CLI's flags), checked and
  parsed by the CLI's parser;
- :mod:`hrm_cli.web.work` — what a worker process runs for one request (the CLI's
  ``run_search`` / ``run_estimate`` / ``hrm_cli.fit.run_fit``, :func:`solver.analyses.compare_engines`,
  the page's view and figures);
- :mod:`hrm_cli.web.app` — the FastAPI app: routes, body limits, the process pool, time bounds;
- :mod:`hrm_cli.web.page` — the Jinja2 pages: the planner (``/``) and ``hrm fit`` (``/fit``);
  ``templates/`` and ``static/`` (a JavaScript file per page over ``requests.js``, which keeps
  only the latest request's answer; one stylesheet: no CDN, it works offline).

FastAPI, uvicorn, Jinja2 and python-multipart come with the ``web`` extra
(``pip install 'hrm-moe[web]'``); nothing else imports this package.
"""

#: seconds one request may take before it is answered 504 (our choice: the slowest shipped
#: search, klotski on a large model, returns within its 10 s branch-and-bound limit)
DEFAULT_TIMEOUT_S = 60.0
#: worker processes (searches at once); the rest wait in the pool's queue
DEFAULT_WORKERS = 2
