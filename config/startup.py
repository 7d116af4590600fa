# startup.py: run in every kernel that kgate-mcp's `connect` creates, before
# any cell of the agent's (and again after `restart` of a kernel it created).
# Put it at $XDG_CONFIG_HOME/kgate/startup.py (normally ~/.config/kgate/).
#
# - It is sent to the kernel as source, so it works on a remote gateway too:
#   whatever it imports must be installed where the kernel runs.
# - It runs in the user namespace, like `%run -i`: what it imports and
#   defines is there for every later cell.
# - __file__ is this file's local path while it runs, and is removed after.
# - What it prints is returned with connect's reply: the agent reads it at
#   the moment it starts using the kernel, so keep it short and useful.
# - If it raises, the connect reply shows the error; the kernel stays up.
#
# Attaching to an existing kernel (connect with `kernel=`) runs nothing.

import os
import sys
from pathlib import Path

# Long outputs cost the agent context: keep reprs short.
try:
    import numpy as np
    np.set_printoptions(threshold=200, edgeitems=3, linewidth=100)
except ImportError:
    np = None

try:
    import pandas as pd
    pd.set_option("display.max_rows", 30)
    pd.set_option("display.max_columns", 20)
except ImportError:
    pd = None

# Figures: ipykernel draws with matplotlib's inline backend by default, so a
# plot shows up as an image (kgate-mcp returns it as an image block, scaled to
# at most 768x768 pixels).  Nothing to set up here.

print(f"python {sys.version.split()[0]} in {os.getcwd()}"
      + (f"; numpy {np.__version__}" if np else "")
      + (f"; pandas {pd.__version__}" if pd else ""))
print(f"(startup: {Path(__file__).name})")
