from trajforge.cli import main

raise SystemExit(main())
