from sandbox_standin.server import main

raise SystemExit(main())
