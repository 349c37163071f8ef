from speechperf.parallel.worker import main

raise SystemExit(main())
