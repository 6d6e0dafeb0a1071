import sys

from evald.cli import main

sys.exit(main())
