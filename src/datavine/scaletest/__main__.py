"""``python -m datavine.scaletest``: the scale test on its own (see :mod:`.cli`)."""

from datavine.scaletest.cli import main

raise SystemExit(main())
