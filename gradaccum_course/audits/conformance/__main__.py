"""``python -m gradaccum_course.audits.conformance``: the table (``make conformance``)."""

import sys

from .table import main

sys.exit(main())
