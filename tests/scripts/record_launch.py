"""Records how it was launched (argv, sys.path[0], cwd, __name__, __file__, an env var) as JSON.

The JSON goes to the file named by GD_TEST_RECORD, so that the script's own arguments stay untouched.
"""

import json
import os
import sys

record = {
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "name": __name__,
    "file": __file__,
    "env": os.environ.get("GD_TEST_MARKER"),
    "main_is_self": sys.modules["__main__"].__dict__ is globals(),
}
with open(os.environ["GD_TEST_RECORD"], "w") as f:
    json.dump(record, f)
print("record_launch: done")
