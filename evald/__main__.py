import sys

from evald.cli.main import main

sys.exit(main())
