from fleetlet.cli import main

raise SystemExit(main())
