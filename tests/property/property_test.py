"""The property test: every report's state, at many events spread over every
trace in testdata/, equals the independent event-by-event replay (replay.py).

For each trace and device it replays the events from the layout before the
first one (trace.initial_state), checks the replay reaches the dump's layout,
and at 20 or more events (the first, the last, the peaks and the moments
around them, and an even spread) compares
  segments --at N   every segment and every block (address, size, state, requested)
  summary --at N    allocated, pending frees, active, requested, reserved, cached free,
                    inactive split, segments, and the peaks up to N with their events
  peak --to N       the peak up to N, its event, and every allocation live then
and at the end `replay`'s recorded column; and `timeline` and `fragmentation` in
slices: every row's largest figures and figures at its end, rows that cover every
event once and never end between a free and its completion. It prints how many traces, events
and reports it checked.

usage: python3 property_test.py ANALYZE TESTDATA [--only SUBSTRING] [--points N]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace as tr  # noqa: E402
from replay import ALLOCATED, INACTIVE, ReplayError  # noqa: E402

# Inputs refused on purpose: testdata/hostile holds files made to be rejected.
SKIPPED_FOLDERS = {'hostile': 'hostile on purpose (test_hostile_inputs holds the analyzer refusing them)'}

# Fixtures whose stored final layout is made up rather than the end of their
# trace (the analyzer says so: "the replayed final layout differs from the stored
# one"): the replay's own check against the dump is left out for them, the
# reports are still held to the replay.
LAYOUT_NOT_FROM_TRACE = ('format_versions/v2.bin', 'format_versions/v3.bin', 'format_versions/v4.bin',
                         'format_versions/v5.bin', 'format_versions/v6.bin', 'fuzz_seeds/ours_v2.pickle',
                         'fuzz_seeds/ours_v3.pickle', 'fuzz_seeds/ours_v4.pickle', 'fuzz_seeds/ours_v5.pickle')

# Known disagreements, each naming its bug: {file: (bug, {'report field', ...})}.
# A marked figure that agrees at every event checked fails the test, so the
# mark goes once the bug is fixed.
EXPECTED_TO_FAIL = {}

# replay refuses these on purpose (its own message says why): no recorded column to hold.
REPLAY_REFUSES = 'the trace begins mid-run with expandable segments, which the replay cannot rebuild'


class Checker:
    def __init__(self):
        self.failures = []
        self.marked_seen = {}     # (name, 'report field') -> whether it disagreed somewhere
        self.reports = 0
        self.events = 0
        self.lock = threading.Lock()

    def compare(self, name, report, field, ours, theirs, where=''):
        with self.lock:
            ok = ours == theirs
            key = report + ' ' + field
            marked = EXPECTED_TO_FAIL.get(name, (None, set()))
            if key in marked[1]:
                self.marked_seen[(name, key)] = self.marked_seen.get((name, key), False) or not ok
                return True
            if not ok:
                self.failures.append('%s: %s %s%s: replay %s, analyzer %s' % (name, report, field, where, _short(ours),
                                                                              _short(theirs)))
            return ok

    def close_marks(self):
        """The marked figures of the files checked: those that agreed everywhere fail."""
        expected = {}
        for (name, key), disagreed in sorted(self.marked_seen.items()):
            if disagreed:
                expected.setdefault(name, []).append(key)
            else:
                self.failures.append('%s: %s agrees now at every event checked: remove it from EXPECTED_TO_FAIL' % (name, key))
        return expected


def _short(value):
    text = repr(value)
    return text if len(text) < 300 else text[:300] + '...'


def run_json(analyze, args):
    out = subprocess.run([analyze] + args + ['--format', 'json'], capture_output=True)
    if out.returncode != 0:
        raise RuntimeError('%s %s: exit %d: %s' % (analyze, ' '.join(args), out.returncode, out.stderr.decode().strip()))
    return json.loads(out.stdout)


def inputs(testdata):
    found, skipped = [], []
    for root, dirs, files in os.walk(testdata):
        dirs.sort()
        rel = os.path.relpath(root, testdata)
        top = rel.split(os.sep)[0]
        for f in sorted(files):
            if not (f.endswith(('.bin', '.pickle')) or '.pickle.' in f or f.endswith(('.bin.zst', '.bin.gz'))):
                continue
            path = os.path.join(root, f)
            if top in SKIPPED_FOLDERS:
                skipped.append((os.path.relpath(path, testdata), SKIPPED_FOLDERS[top]))
            else:
                found.append(path)
    return found, skipped


def choose_points(last, peaks, wanted):
    points = {0, last}
    for p in peaks:
        if p is not None:
            points.update(q for q in (p - 1, p, p + 1) if 0 <= q <= last)
    spread = max(wanted - len(points), 20)
    points.update(round(j * last / (spread - 1)) for j in range(spread))
    return sorted(points)


class Moment:
    """What the replay knows just after one event."""
    __slots__ = ('layout', 'figures', 'peaks', 'peak_live')


def replay_device(trace, device, points):
    """Replays the trace on one device; returns {event: Moment} at `points`, and the end's figures."""
    state = tr.initial_state(trace, device)
    metrics = ('allocated', 'reserved', 'active', 'requested')
    figures = state.figures()
    peaks = {m: [figures[m], 'start'] for m in metrics}
    peak_live = state.live_allocations()
    largest_at_reserved_peak = (state.reserved - state.active, state.largest_free())
    counts = {'device_allocs': 0, 'device_frees': 0, 'ooms': 0}
    wanted = set(points)
    moments = {}
    # replay reads the fragmentation at a new reserved peak once the call that reached it
    # is over: just before the second request (alloc, free_requested, oom) that follows it.
    # The state before the first event is the first peak.
    at_peak_pending, peak_call_done = True, False
    for e in trace.events:
        if e.device == device:
            if e.kind in ('alloc', 'free_requested', 'oom') and at_peak_pending:
                if peak_call_done:
                    largest_at_reserved_peak = (state.reserved - state.active, state.largest_free())
                    at_peak_pending = peak_call_done = False
                else:
                    peak_call_done = True
            tr.apply(state, e, trace.block_sizes_known)
            counts['device_allocs'] += e.kind in ('segment_alloc', 'segment_map')
            counts['device_frees'] += e.kind in ('segment_free', 'segment_unmap')
            counts['ooms'] += e.kind == 'oom'
            if e.kind in tr.STATE_CHANGES:
                figures = state.figures()
                for m in metrics:
                    if figures[m] > peaks[m][0]:
                        peaks[m] = [figures[m], e.index]
                        if m == 'allocated':
                            peak_live = state.live_allocations()
                        if m == 'reserved':
                            at_peak_pending, peak_call_done = True, False
        if e.index in wanted:
            moment = Moment()
            moment.layout = state.layout()
            moment.figures = dict(figures)
            moment.peaks = {m: tuple(v) for m, v in peaks.items()}
            moment.peak_live = sorted(peak_live)
            moments[e.index] = moment
    if at_peak_pending:
        largest_at_reserved_peak = (state.reserved - state.active, state.largest_free())
    end = dict(state.figures())
    end.update(counts)
    end['peaks'] = {m: tuple(v) for m, v in peaks.items()}
    end['cached_free_at_peak'], end['largest_free_at_peak'] = largest_at_reserved_peak
    return state, moments, end


def cli_layout(report):
    """`segments --format json` in DeviceState.layout()'s form: expandable segments as their mapped runs."""
    segments, blocks = [], []
    by_segment = {}
    for b in report['blocks']:
        by_segment.setdefault(b['segment'], []).append(b)
    for s in report['segments']:
        if s['pool'] != 'expandable':
            segments.append((int(s['address'], 16), s['size'], s['pool']))
        else:
            run = None
            for b in by_segment.get(s['address'], []):
                if b['state'] == 'unmapped':
                    run = None
                    continue
                start = int(b['address'], 16)
                if run is not None and run[0] + run[1] == start:
                    run[1] += b['size']
                else:
                    run = [start, b['size']]
                    segments.append(run)
    segments = [tuple(s) + (() if len(s) == 3 else ('expandable',)) for s in segments]
    for b in report['blocks']:
        if b['state'] != 'unmapped':
            blocks.append((int(b['address'], 16), b['size'], b['state'], b['requested']))
    return {'segments': sorted(segments), 'blocks': sorted(blocks)}


def settled_points(trace, device, points):
    """{asked: state}: a free no stream waited on is one call in PyTorch, its
    free_requested and free_completed adjacent; a state asked for between them
    is the state after both (the CLI says so in at_event)."""
    by_index = {e.index: i for i, e in enumerate(trace.events)}
    out = {}
    for p in points:
        i = by_index.get(p)
        e = trace.events[i] if i is not None else None
        nxt = trace.events[i + 1] if i is not None and i + 1 < len(trace.events) else None
        settled = (e is not None and nxt is not None and e.kind == 'free_requested' and e.device == device and
                   nxt.kind == 'free_completed' and nxt.address == e.address and nxt.device == device)
        out[p] = nxt.index if settled else p
    return out


def check_moment(check, analyze, path, name, device, asked, at, moment):
    dev = ['--device', str(device), '--analysis-threads', '1']
    where = ' at #%d' % at if asked == at else ' at #%d (asked #%d, between a free and its completion)' % (at, asked)
    segments = run_json(analyze, ['segments', path, '--at', str(asked)] + dev)
    ours = {'segments': sorted(moment.layout['segments']), 'blocks': sorted(moment.layout['blocks'])}
    theirs = cli_layout(segments)
    for key in ('segments', 'blocks'):
        if ours[key] != theirs[key]:
            a, b = set(ours[key]), set(theirs[key])
            check.compare(name, 'segments', key, sorted(a - b)[:4], sorted(b - a)[:4], where + ' (only in each)')
    summary = run_json(analyze, ['summary', path, '--at', str(asked)] + dev)
    check.compare(name, 'summary', 'at_event', at, summary.get('at_event'), where)
    gap = summary['gap']
    f = moment.figures
    theirs = {'allocated': summary['allocated_at_end'], 'reserved': summary['reserved_at_end'],
              'segments': summary['segments_at_end'], 'pending_free': gap['pending_free'],
              'active': gap['allocated'] + gap['pending_free'],
              'requested': gap['allocated'] + gap['pending_free'] - gap['rounding_waste'],
              'cached_free': gap['cached_free'], 'inactive_split': gap['inactive_split']}
    for key, value in theirs.items():
        check.compare(name, 'summary', key, f[key], value, where)
    for m in ('allocated', 'reserved', 'active', 'requested'):
        check.compare(name, 'summary', 'peak_' + m, moment.peaks[m][0], summary['peak_' + m], where)
    for m in ('allocated', 'reserved'):
        event = summary['peak_%s_event' % m]
        check.compare(name, 'summary', 'peak_%s_event' % m, moment.peaks[m][1], 'start' if event is None else event, where)
    peak = run_json(analyze, ['peak', path, '--to', str(asked), '--limit', '0'] + dev)
    check.compare(name, 'peak', 'peak_bytes', moment.peaks['allocated'][0], peak['peak_bytes'], where)
    event = peak['event']
    check.compare(name, 'peak', 'event', moment.peaks['allocated'][1], 'start' if event is None else event, where)
    live = sorted((int(a['address'], 16), a['size'], a['requested']) for a in peak['allocations'])
    check.compare(name, 'peak', 'allocations', moment.peak_live, live, where)
    with check.lock:
        check.reports += 3


ROW_FIGURES = ('allocated', 'reserved', 'active', 'requested')
END_FIGURES = ('allocated', 'reserved', 'requested', 'pending_free', 'cached_free', 'inactive_split', 'largest_free')


def replay_rows(trace, device, rows):
    """The replay's figures for rows [(first, last)] that cover the events in order:
    the largest of ROW_FIGURES after each of a row's events, and END_FIGURES after its last."""
    state = tr.initial_state(trace, device)
    out = []
    events = trace.events
    k = 0

    def current():
        f = state.figures()
        f['largest_free'] = state.largest_free()
        return f

    for first, last in rows:
        # Events before the first row (annotations before the ring's first memory event) change nothing drawn.
        while k < len(events) and events[k].index < first:
            if events[k].device == device:
                tr.apply(state, events[k], trace.block_sizes_known)
            k += 1
        # The state after the row's first event is one of its states; the state
        # before it is one only when no listed event is the first.
        figures = state.figures()
        largest = None if (k < len(events) and events[k].index == first) else {m: figures[m] for m in ROW_FIGURES}
        while k < len(events) and events[k].index <= last:
            e = events[k]
            k += 1
            if e.device == device:
                tr.apply(state, e, trace.block_sizes_known)
            figures = state.figures()
            largest = {m: max(figures[m], largest[m]) if largest else figures[m] for m in ROW_FIGURES}
        out.append((largest, current()))
    return out


def check_rows(check, analyze, path, name, device, trace, ring):
    """timeline and fragmentation in slices: the rows cover every event once from `ring`
    (the ring's first memory event of a trace begun mid-run, else 0), none ends between a
    free no stream waited on and its completion, and each row's figures are the replay's."""
    dev = ['--device', str(device), '--analysis-threads', '1']
    by_index = {e.index: i for i, e in enumerate(trace.events)}
    count = trace.events[-1].index + 1

    def plain_pair_at(index):
        i = by_index.get(index)
        if i is None or i + 1 >= len(trace.events):
            return False
        e, nxt = trace.events[i], trace.events[i + 1]
        return (e.kind == 'free_requested' and e.device == device and nxt.kind == 'free_completed' and
                nxt.address == e.address and nxt.device == device and nxt.index == e.index + 1)

    for buckets in sorted({17, max(2, (count - ring) // 2 + 1)}):
        args = ['--buckets', str(buckets)] + dev
        timeline = run_json(analyze, ['timeline', path] + args)['timeline'][1:]
        over_time = run_json(analyze, ['fragmentation', path] + args)['over_time'][1:]
        where = ' (%d slices)' % buckets
        rows = [(r['first_event'], r['event']) for r in timeline]
        starts = [ring] + [last + 1 for _, last in rows[:-1]]
        check.compare(name, 'timeline', 'row starts', starts, [first for first, _ in rows], where)
        check.compare(name, 'timeline', 'last row end', count - 1, rows[-1][1] if rows else None, where)
        ends_in_pair = [last for _, last in rows if plain_pair_at(last)]
        check.compare(name, 'timeline', 'rows ending between a free and its completion', [], ends_in_pair[:4], where)
        check.compare(name, 'fragmentation', 'row ends', [last for _, last in rows], [r['event'] for r in over_time],
                      where)
        for (first, last), (largest, end), row, frag in zip(rows, replay_rows(trace, device, rows), timeline,
                                                           over_time):
            at = where + ' row #%d..#%d' % (first, last)
            for m in ROW_FIGURES:
                check.compare(name, 'timeline', m, largest[m], row[m], at)
            for m in END_FIGURES:
                check.compare(name, 'fragmentation', m, end[m], frag[m], at)
        with check.lock:
            check.reports += 2


def check_replay_column(check, analyze, path, name, device, end):
    try:
        report = run_json(analyze, ['replay', path, '--device', str(device)])
    except RuntimeError as error:
        if REPLAY_REFUSES in str(error):
            return
        raise
    recorded = {row['figure']: row['recorded'] for row in report['memory'] + report['counts']}
    ours = {'peak_reserved': end['peaks']['reserved'][0], 'peak_allocated': end['peaks']['allocated'][0],
            'reserved_at_end': end['reserved'], 'allocated_at_end': end['allocated'],
            'segments_at_end': end['segments'], 'device_allocs': end['device_allocs'],
            'device_frees': end['device_frees'], 'ooms': end['ooms'],
            'cached_free_at_peak': end['cached_free_at_peak'], 'largest_free_at_peak': end['largest_free_at_peak']}
    for key, value in ours.items():
        if key in recorded:
            check.compare(name, 'replay', key, value, recorded[key], ' (recorded column)')
    with check.lock:
        check.reports += 1


def ring_begins(trace, device):
    """In a trace begun mid-run (segments before its first event), its first event of the
    device that is not an annotation, where it has events before that one; else None."""
    if not tr.initial_state(trace, device).segments:
        return None
    first = next((e.index for e in trace.events
                  if e.device == device and e.kind not in ('annotation_begin', 'annotation_end')), None)
    return first if first is not None and first > trace.events[0].index else None


def check_before_ring(check, analyze, path, name, device, ring):
    """No memory was recorded before the ring's first memory event: a moment there is
    refused with exit 2 and one line naming that event; the summary names it."""
    dev = ['--device', str(device)]
    for args in (['segments', path, '--at', str(ring - 1)], ['summary', path, '--to', str(ring - 1)]):
        done = subprocess.run([analyze] + args + dev, capture_output=True)
        lines = done.stderr.decode().strip().splitlines()
        check.compare(name, args[0], 'refused before the ring', (2, 1, True),
                      (done.returncode, len(lines), bool(lines) and ('#%d' % ring) in lines[0]), ' at #%d' % (ring - 1))
    summary = run_json(analyze, ['summary', path] + dev)
    check.compare(name, 'summary', 'ring_begins_at', ring, summary.get('ring_begins_at'))
    with check.lock:
        check.reports += 3


def check_trace(check, analyze, testdata, path, wanted_points):
    name = os.path.relpath(path, testdata)
    try:
        trace = tr.load(path, analyze)
    except subprocess.CalledProcessError as error:
        return 'skipped: the analyzer reads no trace from it (%s)' % error.stderr.decode().strip()
    if not trace.events:
        return 'skipped: no trace, only a layout (nothing to replay)'
    last = trace.events[-1].index
    checked = 0
    for device in trace.devices():
        # The peaks pick a few of the points: one replay to find them, one to keep the moments.
        _, _, end = replay_device(trace, device, [])
        peaks = [v[1] for v in end['peaks'].values() if v[1] != 'start']
        ring = ring_begins(trace, device)
        chosen = choose_points(last, peaks, wanted_points)
        if ring is not None:
            # Before the ring's first memory event no memory was recorded: from it on only.
            check_before_ring(check, analyze, path, name, device, ring)
            chosen = sorted({p for p in chosen if p >= ring} | {ring})
        asked = settled_points(trace, device, chosen)
        points = sorted(set(asked.values()))
        state, moments, end = replay_device(trace, device, points)
        if not any(name.endswith(n) for n in LAYOUT_NOT_FROM_TRACE):
            check.compare(name, 'replay-vs-dump', 'layout', state.layout(), tr.dump_layout(trace, device), ' at the dump')
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            list(pool.map(lambda p: check_moment(check, analyze, path, name, device, p, asked[p], moments[asked[p]]),
                          sorted(asked)))
        check_replay_column(check, analyze, path, name, device, end)
        check_rows(check, analyze, path, name, device, trace, ring or 0)
        checked += len(points)
    check.events += checked
    return '%d events on %d device(s), %d trace events' % (checked, len(trace.devices()), len(trace.events))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('analyze')
    parser.add_argument('testdata')
    parser.add_argument('--only', default='')
    parser.add_argument('--points', type=int, default=24)
    args = parser.parse_args()
    files, skipped = inputs(args.testdata)
    files = [f for f in files if args.only in f]
    check = Checker()
    traces = 0
    for path in files:
        name = os.path.relpath(path, args.testdata)
        before = len(check.failures)
        try:
            said = check_trace(check, args.analyze, args.testdata, path, args.points)
        except (ReplayError, RuntimeError) as error:
            check.failures.append('%s: %s' % (name, error))
            said = 'error'
        if not said.startswith('skipped'):
            traces += 1
        print('%s %s: %s' % ('FAIL' if len(check.failures) > before else 'ok  ', name, said), flush=True)
        for failure in check.failures[before:][:10]:
            print('  ' + failure)
    for name, why in skipped:
        print('skip %s: %s' % (name, why))
    expected = check.close_marks()
    by_bug = {}
    for name, keys in expected.items():
        for key in keys:
            bug = _REPLAY_DEVICE_ALLOCS if key == 'replay device_allocs' else EXPECTED_TO_FAIL[name][0]
            by_bug.setdefault(bug, []).append('%s (%s)' % (name, key))
    for bug, where in by_bug.items():
        print('expected failure, %d figures: %s\n  %s' % (len(where), bug, '; '.join(where)))
    for failure in check.failures[-len(check.failures):]:
        if 'EXPECTED_TO_FAIL' in failure:
            print('FAIL ' + failure)
    print('property test: %d traces, %d events checked, %d reports compared, %d files skipped, %d expected failures, '
          '%d failures' % (traces, check.events, check.reports, len(skipped), sum(map(len, expected.values())),
                           len(check.failures)))
    return 1 if check.failures or traces == 0 else 0


if __name__ == '__main__':
    sys.exit(main())
