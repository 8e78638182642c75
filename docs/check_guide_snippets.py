"""Checks that every ```python block of docs/oracle-guide.md is text of docs/oracle_example.py
(which CI runs), so the guide's snippets cannot drift from tested code."""
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
guide = open(os.path.join(here, "oracle-guide.md")).read()
script = open(os.path.join(here, "oracle_example.py")).read()
blocks = re.findall(r"```python\n(.*?)```", guide, re.S)
stale = [b for b in blocks if b not in script]
for b in stale:
    print("docs/oracle-guide.md: a python snippet is not in docs/oracle_example.py:\n" + b[:400],
          file=sys.stderr)
print(f"guide snippets: {len(blocks) - len(stale)} of {len(blocks)} found in the tested script")
sys.exit(1 if stale or not blocks else 0)
