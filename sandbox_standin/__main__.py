from sandbox_standin.cli import main

raise SystemExit(main())
