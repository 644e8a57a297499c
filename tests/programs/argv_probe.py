"""Prints its arguments as hex bytes (one JSON line), so a test can compare them byte for byte."""

import json
import os
import sys

print(json.dumps({"argv_hex": [os.fsencode(a).hex() for a in sys.argv[1:]]}), flush=True)
