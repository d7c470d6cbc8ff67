"""``python -m datavine.apps.scaletest``: the scale test on its own (see :mod:`.cli`)."""

from datavine.apps.scaletest.cli import main

raise SystemExit(main())
