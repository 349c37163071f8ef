from speechperf.cli import main

raise SystemExit(main())
