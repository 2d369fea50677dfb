#!/usr/bin/env python3
"""Per-round GPU/(a) bytes/s ratio, split by which of the two ran first in the
round (read from each gpubench text log: the order of the path lines after
"round K of N:"). Files from before gpubench recorded position_rounds.
Usage: python3 order-check.py NAME... (each NAME.txt and NAME.json, gpubench
output with gpu-driven and (a) rows)."""
import json, re, statistics, sys

groups = {'g': [], 'a': []}
for f in sys.argv[1:]:
    rounds = re.split(r'\nround \d+ of \d+:', open(f + '.txt').read())[1:]
    rows = [json.loads(l) for l in open(f + '.json')]
    g = [r for r in rows if r['path'].startswith('gpu')][0]['per_round']['bytes_per_s_rounds']
    a = [r for r in rows if r['path'].startswith('(a)')][0]['per_round']['bytes_per_s_rounds']
    for k, rd in enumerate(rounds):
        lines = [l for l in rd.split('\n') if l.startswith('  gpu-driven') or l.startswith('  (a)')]
        groups['g' if lines[0].startswith('  gpu') else 'a'].append(g[k] / a[k])
for who, name in (('g', 'GPU path ran first'), ('a', '(a) ran first')):
    xs = groups[who]
    if xs:
        print('%-20s rounds %3d  GPU/(a) median %.3f  mean %.3f  GPU ahead in %d'
              % (name, len(xs), statistics.median(xs), statistics.mean(xs), sum(x >= 1 for x in xs)))
