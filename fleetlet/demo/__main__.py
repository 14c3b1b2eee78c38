"""``python -m fleetlet.demo pin [--check]``: :func:`fleetlet.demo.examples.main`."""

from fleetlet.demo.examples import main

raise SystemExit(main())
