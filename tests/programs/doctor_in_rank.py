"""A rank that runs `affrun doctor --json` on itself and stores the finding ids (DeepSpeed's launcher is its parent)."""

import json
import shutil
import subprocess

from probe_record import record

out = subprocess.run([shutil.which("affrun") or "affrun", "doctor", "--json"], capture_output=True, text=True,
                     timeout=120)
record("doctor", findings=[f["id"] for f in json.loads(out.stdout)["findings"]],
       messages=[f["message"] for f in json.loads(out.stdout)["findings"]])
