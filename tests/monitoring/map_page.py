#!/usr/bin/env python3
"""The coordinator's /map page in a real browser (Debian's chromium,
headless): once /map.json holds the database's shards, the page loads
without a script error, draws one block per shard of the database, names
each node in its legend, and a screenshot of it is written.
Usage: map_page.py METRICS_ADDRESS DATABASE SCREENSHOT_FILE"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks  # noqa: E402

address, database, screenshot = sys.argv[1:4]
check = Checks("map page")
base = f"http://{address}"


def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as response:
        return response.headers.get("Content-Type", ""), response.read().decode()


content_type, page = get("/map")
check(f"/map is an HTML page of its own ({content_type})",
      content_type.startswith("text/html") and "<script>" in page
      and not re.search(r"(src=|<link|@import|url\()", page))

# /map.json asks the coordinator to read the statistics (with its next
# load report, within 10 s).
shards = []
every_shard = 0
for _ in range(40):
    data = json.loads(get("/map.json")[1])
    ours = [d for d in data["databases"] if d["database"] == database]
    if ours and ours[0]["shards"]:
        shards = ours[0]["shards"]
        every_shard = sum(len(d["shards"]) for d in data["databases"])
        break
    time.sleep(1)
nodes = sorted({s["node"] for s in shards})
check(f"/map.json has the database's shards ({len(shards)} on {nodes})", len(shards) > 0 and len(nodes) >= 2)

browser = shutil.which("chromium") or shutil.which("chromium-browser")
if not browser:
    check("chromium is installed (scripts/bootstrap.sh)", False)
    sys.exit(1)
profile = tempfile.mkdtemp(prefix="pg_shard-chromium-")
flags = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--window-size=1200,700", "--virtual-time-budget=5000",
         "--enable-logging=stderr", "--v=0"]
dom = subprocess.run(flags + ["--dump-dom", base + "/map"], capture_output=True, text=True, timeout=120)
drawn = len(re.findall(r'<rect class="shard[ "]', dom.stdout))
# (every database the coordinator serves is drawn, this one's among them;
# a report may land between the page's read and ours)
after = sum(len(d["shards"]) for d in json.loads(get("/map.json")[1])["databases"])
check(f"the page draws one block per shard of every database ({drawn} of {every_shard}, then {after})",
      drawn > 0 and drawn in (every_shard, after))
check("the legend names every node", all(node in dom.stdout for node in nodes))
errors = re.search(r'<div id="errors">(.*?)</div>', dom.stdout, re.S)
console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
check(f"no script errors ({errors.group(1) if errors else 'no errors element'}; {console[:2]})",
      errors is not None and errors.group(1).strip() == "" and not console)
if os.path.exists(screenshot):
    os.remove(screenshot)
shot = subprocess.run(flags + [f"--screenshot={screenshot}", base + "/map"], capture_output=True, text=True,
                      timeout=120)
size = os.path.getsize(screenshot) if os.path.exists(screenshot) else 0
with open(screenshot, "rb") if size else open(os.devnull, "rb") as f:
    header = f.read(8)
check(f"a screenshot is written ({screenshot}, {size} bytes)", size > 5000 and header == b"\x89PNG\r\n\x1a\n")
shutil.rmtree(profile, ignore_errors=True)
sys.exit(1 if check.failures else 0)
