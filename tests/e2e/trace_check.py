#!/usr/bin/python3
"""Checks a timeline file as a trace viewer reads it (tests/e2e/timeline.sh).

    trace_check.py FILE [--closed] [--min-events N] [--expect NAME[:PH]]...
                        [--rows N]

The file is read as UTF-8 and parsed with Python's json module, strictly
(NaN and Infinity refused). A file still being written, or left by a killed
job, is closed first as chrome://tracing closes one: blanks and a trailing
comma off, "]" added when it does not end with one; --closed demands that it
parse as it is. The Trace Event Format's rules are then checked: an array of
events (or an object whose traceEvents is one), each an object with a
one-letter ph, a name (an E may omit it), an integer pid, an integer tid
(metadata about a process may omit it), a number ts unless it is metadata
(ph "M"); instant events' scope is g, p or t; every E closes the B last
begun on its (pid, tid), with no earlier ts and the same name if it has
one; metadata events are the kinds hvd writes, with their args. --rows N
asks for pid 0's threads 1..N named "rank 0".."rank N-1"; --expect for at
least one event of that name (and phase). Exit 0 with "events N" on stdout;
1 when the file is not a valid trace, 3 when it is one that lacks what was
asked for (or is not there yet), with the first fault on stderr.
"""

import argparse
import json
import sys

METADATA = {
    'process_name': ('name', str),
    'process_sort_index': ('sort_index', int),
    'thread_name': ('name', str),
    'thread_sort_index': ('sort_index', int),
    'start_time_since_epoch_in_micros': ('start_time_since_epoch_in_micros', int),
}


class Fault(Exception):
    pass


class Lacking(Exception):
    pass


def refuse_constant(name):
    raise Fault('not JSON: %s' % name)


def load(path, closed):
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        raise Lacking('no such file')
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as e:
        raise Fault('not UTF-8: %s' % e)
    if not closed:
        text = text.rstrip()
        if text.endswith(','):
            text = text[:-1]
        if not text.endswith(']'):
            text += ']'
    try:
        doc = json.loads(text, parse_constant=refuse_constant)
    except ValueError as e:
        raise Fault('not JSON (%s): ...%r' % (e, text[-120:]))
    if isinstance(doc, dict):
        doc = doc.get('traceEvents')
    if not isinstance(doc, list):
        raise Fault('neither an array of events nor an object with traceEvents')
    return doc


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_event(i, e, stacks):
    if not isinstance(e, dict):
        raise Fault('event %d is not an object: %r' % (i, e))
    ph, name = e.get('ph'), e.get('name')
    if not isinstance(ph, str) or len(ph) != 1:
        raise Fault('event %d has no one-letter ph: %r' % (i, e))
    if not isinstance(name, str) and not (ph == 'E' and name is None):
        raise Fault('event %d has no name: %r' % (i, e))
    process_wide = ph == 'M' and not str(name).startswith('thread_')
    if not is_int(e.get('pid')) or not (is_int(e.get('tid')) or process_wide):
        raise Fault('event %d lacks an integer pid or tid: %r' % (i, e))
    if 'args' in e and not isinstance(e['args'], dict):
        raise Fault('event %d: args is not an object: %r' % (i, e))
    if ph == 'M':
        if name not in METADATA:
            raise Fault('event %d: unknown metadata %r' % (i, name))
        key, kind = METADATA[name]
        value = e.get('args', {}).get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise Fault('event %d: metadata without its args.%s: %r' % (i, key, e))
        return
    ts = e.get('ts')
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise Fault('event %d has no number ts: %r' % (i, e))
    where = (e['pid'], e['tid'])
    if ph == 'B':
        stacks.setdefault(where, []).append((name, ts))
    elif ph == 'E':
        stack = stacks.get(where)
        if not stack:
            raise Fault('event %d ends nothing on pid %d tid %d: %r' % (i, e['pid'], e['tid'], e))
        begun, begun_ts = stack.pop()
        if name not in (None, begun) or ts < begun_ts:
            raise Fault('event %d ends %r begun at %s: %r' % (i, begun, begun_ts, e))
    elif ph == 'i':
        if e.get('s', 't') not in ('g', 'p', 't'):
            raise Fault('event %d: instant scope %r' % (i, e.get('s')))
    else:
        raise Fault('event %d: phase %r, which hvd does not write' % (i, ph))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('file')
    ap.add_argument('--closed', action='store_true')
    ap.add_argument('--min-events', type=int, default=1)
    ap.add_argument('--expect', action='append', default=[])
    ap.add_argument('--rows', type=int, default=0)
    args = ap.parse_args()
    try:
        events = load(args.file, args.closed)
        stacks = {}
        for i, e in enumerate(events):
            check_event(i, e, stacks)
        if len(events) < args.min_events:
            raise Lacking('%d events, fewer than %d' % (len(events), args.min_events))
        for want in args.expect:
            name, _, ph = want.partition(':')
            if not any(e.get('name') == name and (not ph or e['ph'] == ph) for e in events):
                raise Lacking('no %s event named %r' % (ph or 'any', name))
        rows = {(e['pid'], e['tid']): e['args']['name'] for e in events
                if e['ph'] == 'M' and e['name'] == 'thread_name'}
        for r in range(args.rows):
            if rows.get((0, r + 1)) != 'rank %d' % r:
                raise Lacking('pid 0 has no row "rank %d" (tid %d)' % (r, r + 1))
        if not any(e['ph'] == 'M' and e['name'] == 'process_name' and e['pid'] == 0
                   and e['args']['name'] == 'hvd ranks' for e in events):
            raise Lacking('pid 0 is not named "hvd ranks"')
    except (Fault, OSError) as e:
        print('%s: %s' % (args.file, e), file=sys.stderr)
        return 1
    except Lacking as e:
        print('%s: %s' % (args.file, e), file=sys.stderr)
        return 3
    print('events %d' % len(events))
    return 0


if __name__ == '__main__':
    sys.exit(main())
