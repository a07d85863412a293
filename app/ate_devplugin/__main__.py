from ate_devplugin.cli import main

raise SystemExit(main())
