import sys

from ditfuse.tools.cli import main

sys.exit(main())
