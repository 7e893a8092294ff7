import sys

from runwatch.cli import main

sys.exit(main())
