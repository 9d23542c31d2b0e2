#!/usr/bin/env python3
"""Checks the SVG `tidectl timeline` drew of test_timeline.sh's job, element by element:
usage: timeline_check.py FILE.svg [FILE.json] (the same job's Chrome trace, which must
hold the same segments and marks). The job ran generation 1 as (dp 2, tp 2, pp 2) on 8
GPUs, was resized to generation 2 (dp 1, tp 2, pp 2), then offline commands eval-1..4 ran
on the 4 GPUs it left idle and the plugin job fill-1 in the members' pipeline bubbles."""
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
errors = []


def check(cond, what):
    if not cond:
        errors.append(what)


def classes(el):
    return el.get("class", "").split()


root = ET.parse(sys.argv[1]).getroot()
check(root.tag == NS + "svg", "the document is not an SVG: " + root.tag)
check(root.get("data-job") == "tl", "data-job is %r" % root.get("data-job"))
span = int(root.get("data-end-ms")) - int(root.get("data-start-ms"))
rows = [g for g in root.iter(NS + "g") if "row" in classes(g)]
workers = [int(g.get("data-worker")) for g in rows]
check(len(rows) == 8 and len(set(workers)) == 8, "rows: %s" % workers)
hosts = {g.get("data-host") for g in rows}
check(len(hosts) == 1 and "" not in hosts, "hosts of the rows: %s" % hosts)


def segs(kind):
    out = []
    for g in rows:
        for r in g.iter(NS + "rect"):
            if "seg" in classes(r) and kind in classes(r):
                check(r.get("data-worker") == g.get("data-worker"), "a segment in another row")
                t0, t1 = int(r.get("data-t0")), int(r.get("data-t1"))
                check(0 <= t0 <= t1 <= span, "segment times %d..%d outside 0..%d" % (t0, t1, span))
                check(float(r.get("width")) > 0, "a segment without width")
                out.append((int(r.get("data-worker")), t0, t1, r))
    return out


marks = [g for g in root.iter(NS + "g") if "mark" in classes(g)]
resizes = [m for m in marks if "resize" in classes(m)]
check(len(resizes) == 1 and resizes[0].get("data-gen") == "2", "resize marks: %d" % len(resizes))
r_t0, r_t1 = (int(resizes[0].get("data-t0")), int(resizes[0].get("data-t1"))) if resizes else (0, 0)
check(0 < r_t0 <= r_t1, "the resize mark spans %d..%d" % (r_t0, r_t1))
check(float(resizes[0].get("data-ms", "0")) > 0 if resizes else False, "no downtime on the mark")
label = " ".join(t.text or "" for m in resizes for t in m.iter(NS + "text"))
check("generation 2" in label and "dp 1 tp 2 pp 2" in label and " ms" in label,
      "the resize's label: %r" % label)

online = segs("online")
g1 = [s for s in online if s[3].get("data-gen") == "1"]
g2 = [s for s in online if s[3].get("data-gen") == "2"]
check(sorted(s[0] for s in g1) == sorted(workers), "generation 1 rows: %s" % [s[0] for s in g1])
check(all(s[2] == r_t1 for s in g1), "generation 1 does not end at the resize")
check(len(g2) == 4 and all(s[1] == r_t1 for s in g2), "generation 2: %s" % [s[:3] for s in g2])
roles = sorted(s[3].get("data-role") for s in g2)
check(roles == ["p0 d0 t0", "p0 d0 t1", "p1 d0 t0", "p1 d0 t1"], "generation 2 roles: %s" % roles)
roles1 = {s[3].get("data-role") for s in g1}
check(len(roles1) == 8, "generation 1 roles: %s" % sorted(roles1))

members = {s[0] for s in g2}
idle = set(workers) - members
offline = segs("offline")
check({s[0] for s in offline} == idle, "backfill rows %s, idle GPUs %s" %
      (sorted({s[0] for s in offline}), sorted(idle)))
check(all(s[1] >= r_t1 and s[2] > s[1] for s in offline), "backfill before the resize")
check(sorted(s[3].get("data-job") for s in offline) == ["eval-1", "eval-2", "eval-3", "eval-4"],
      "backfill jobs: %s" % sorted(s[3].get("data-job") for s in offline))
bubble = segs("bubble")
check(bubble and all(s[0] in members and s[3].get("data-job") == "fill-1" for s in bubble),
      "bubble work: %s (members %s)" % ([s[:3] for s in bubble], sorted(members)))
check(not segs("failed") and not [m for m in marks if "failure" in classes(m)],
      "a failure drawn where none happened")

if len(sys.argv) > 2:
    import json
    with open(sys.argv[2]) as f:
        tr = json.load(f)
    evs = tr["traceEvents"]
    threads = {e["tid"] for e in evs if e.get("ph") == "M" and e["name"] == "thread_name"}
    check(threads == set(workers), "trace threads %s, rows %s" % (sorted(threads), workers))
    for kind, drawn in (("online", online), ("offline", offline), ("bubble", bubble)):
        n = sum(1 for e in evs if e.get("ph") == "X" and e.get("cat") == kind)
        check(n == len(drawn), "trace: %d %s events, the picture %d" % (n, kind, len(drawn)))
    rz = [e for e in evs if e.get("cat") == "resize"]
    check(len(rz) == 1 and rz[0]["dur"] == (r_t1 - r_t0) * 1000 and rz[0]["args"]["gen"] == 2,
          "trace resize: %s" % rz)

if errors:
    print("timeline_check: %s:\n  %s" % (sys.argv[1], "\n  ".join(errors)))
    sys.exit(1)
print("timeline_check: %d rows, %d online, %d backfill and %d bubble segments, %d marks: ok" %
      (len(rows), len(online), len(offline), len(bubble), len(marks)))
