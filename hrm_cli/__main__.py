"""``python -m hrm_cli`` = ``hrm``."""

from hrm_cli import main

raise SystemExit(main())
