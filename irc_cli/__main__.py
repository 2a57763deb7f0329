import sys

from irc_cli import main

sys.exit(main())
