"""``python -m pcops.preprocess``: see pcops/preprocess/_command.py."""
import sys

from ._command import main

sys.exit(main())
