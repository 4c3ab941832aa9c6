"""`python -m harness.report`: see harness/report/command.py."""

import sys

from harness.report.command import main

sys.exit(main())
