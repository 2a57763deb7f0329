import sys

from irc.cli import main

sys.exit(main())
