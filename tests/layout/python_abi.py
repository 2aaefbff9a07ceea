#!/usr/bin/python3
"""What python/hvd/_abi.py declares of hvd.h, checked by the C compiler
against include/hvd/hvd.h itself (ctest layout.python_abi):

  python_abi.py CC SOURCE_ROOT

Every declaration becomes a static assertion in a C file that includes
hvd.h: each upper-case integer NAME equals HVD_NAME; each structure's
size, and each field's offset, size and type, are the ones ctypes computes
from the declaration; each function has the declared prototype; and each
C type the declarations use has the size (and, for integers, the
signedness) of the ctypes type that stands for it. The compiler is the
parser, so the header may take any form C allows. A mismatch fails with
the compiler's message, which names the item; a name hvd.h lacks fails
as undeclared.

Then it checks itself: each kind of mismatch, made on purpose in a copy
of the declarations, must be reported, naming the item.
"""

import ctypes
import importlib.util
import os
import subprocess
import sys


def load_abi(root):
    """python/hvd/_abi.py as a module of its own (the hvd package would load
    the library)."""
    path = os.path.join(root, 'python', 'hvd', '_abi.py')
    spec = importlib.util.spec_from_file_location('hvd_abi_declarations', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declarations(abi):
    """The declarations as plain data, which the self-test alters."""
    structs = []
    for cls in abi.STRUCTURES:
        fields = [(name, c, getattr(cls, name).offset, getattr(cls, name).size)
                  for name, c in cls.c_fields]
        structs.append((cls.c_name, fields, ctypes.sizeof(cls)))
    return {
        'constants': abi.constants(),
        'structs': structs,
        'functions': [abi.parse_prototype(p) for p in abi.PROTOTYPES],
        'ctype': abi.ctype,
        'names': [('DTYPE_NAMES', abi.DTYPE_NAMES), ('OP_NAMES', abi.OP_NAMES)],
    }


def c_string(text):
    return '"%s"' % text.replace('\\', '\\\\').replace('"', '\\"')


def assertion(cond, message):
    return '_Static_assert(%s, %s);' % (cond, c_string(message))


def python_errors(decl):
    """What no compiler sees: a value's name in DTYPE_NAMES/OP_NAMES is the
    lower-case name of the constant with that value."""
    errors = []
    for what, names in decl['names']:
        for value, name in enumerate(names):
            if decl['constants'].get(name.upper()) != value:
                errors.append('_abi.py: %s[%d] is %r, but %s is %r'
                              % (what, value, name, name.upper(),
                                 decl['constants'].get(name.upper())))
    return errors


def type_checks(decl):
    """Each C type used stands for a ctypes type of its size (and sign)."""
    used = set()
    for _, fields, _ in decl['structs']:
        used.update(c for _, c, _, _ in fields)
    for _, ret, params in decl['functions']:
        used.update([ret] + params)
    lines = []
    for c in sorted(used):
        t = decl['ctype'](c)
        if t is None:
            continue
        what = 'C type %s as ctypes %s' % (c, t.__name__)
        lines.append(assertion('sizeof(%s) == %d' % (c, ctypes.sizeof(t)),
                               '%s: the C type is not %d bytes' % (what, ctypes.sizeof(t))))
        if t in (ctypes.c_double, ctypes.c_float):
            lines.append(assertion('_Generic((%s)0, float: 1, double: 1, default: 0)' % c,
                                   '%s: not floating in C' % what))
        elif c.startswith('hvd_') and t is ctypes.c_int:
            pass  # an enum: its sign is the compiler's choice, its values small
        elif '*' not in c and '(' not in c and t is not ctypes.c_void_p:
            signed = t(-1).value < 0
            lines.append(assertion('((%s)-1 < (%s)0) == %d' % (c, c, signed),
                                   '%s: %ssigned in C' % (what, 'un' if signed else '')))
    return lines


def c_source(decl):
    lines = ['#include <stddef.h>', '#include <stdint.h>', '#include "hvd/hvd.h"', '']
    for name, value in sorted(decl['constants'].items()):
        lines.append(assertion('HVD_%s == %d' % (name, value),
                               'HVD_%s: _abi.py says %s = %d' % (name, name, value)))
    for c_name, fields, size in decl['structs']:
        for name, c, offset, fsize in fields:
            member = '((%s *)0)->%s' % (c_name, name)
            item = '%s.%s' % (c_name, name)
            lines.append(assertion('offsetof(%s, %s) == %d' % (c_name, name, offset),
                                   '%s: _abi.py has it at offset %d' % (item, offset)))
            lines.append(assertion('sizeof(%s) == %d' % (member, fsize),
                                   '%s: _abi.py has it %d bytes long' % (item, fsize)))
            lines.append(assertion('__builtin_types_compatible_p(__typeof__(%s), %s)'
                                   % (member, c), '%s: _abi.py says its type is %s' % (item, c)))
        lines.append(assertion('sizeof(%s) == %d' % (c_name, size),
                               '%s: _abi.py declares %d bytes (a field missing or added?)'
                               % (c_name, size)))
    for name, ret, params in decl['functions']:
        signature = '%s (%s)' % (ret, ', '.join(params) or 'void')
        lines.append(assertion('__builtin_types_compatible_p(__typeof__(%s), %s)'
                               % (name, signature),
                               '%s: _abi.py declares it %s' % (name, signature)))
    return '\n'.join(lines + type_checks(decl)) + '\n'


def check(cc, root, decl):
    """The errors: _abi.py's own, then the compiler's, one per line."""
    errors = python_errors(decl)
    result = subprocess.run([cc, '-std=c11', '-fsyntax-only', '-I', os.path.join(root, 'include'),
                             '-x', 'c', '-'], input=c_source(decl), capture_output=True,
                            text=True, check=False, env=dict(os.environ, LC_ALL='C'))
    errors += [line for line in result.stderr.splitlines() if 'error' in line]
    if result.returncode != 0 and len(errors) == len(python_errors(decl)):
        errors.append(result.stderr.strip() or '%s failed (status %d)' % (cc, result.returncode))
    return errors


def self_test(cc, root, abi):
    """Each kind of mismatch made on purpose must be reported, naming the item."""
    def altered(change):
        decl = declarations(abi)
        change(decl)
        return decl

    def enum_value(decl):
        decl['constants']['ERR_EXISTS'] = 19

    def field_renamed(decl):
        name, fields, size = decl['structs'][0]
        fields[2] = ('rank',) + fields[2][1:]

    def field_type(decl):
        name, fields, size = decl['structs'][1]
        fields[3] = (fields[3][0], 'int64_t') + fields[3][2:]

    def field_offset(decl):
        name, fields, size = decl['structs'][1]
        fields[4] = fields[4][:2] + (fields[4][2] + 4, fields[4][3])

    def struct_size(decl):
        name, fields, size = decl['structs'][2]
        decl['structs'][2] = (name, fields, size + 8)

    def prototype(decl):
        decl['functions'] = [(n, r, ['size_t'] if n == 'hvd_barrier' else p)
                             for n, r, p in decl['functions']]

    def missing(decl):
        decl['functions'].append(('hvd_no_such_function', 'int', []))

    def ctype_size(decl):
        real = decl['ctype']
        decl['ctype'] = lambda c: ctypes.c_int32 if c == 'int64_t' else real(c)

    def names(decl):
        decl['names'] = [('DTYPE_NAMES', abi.DTYPE_NAMES[:-1] + ('boolean',))]

    cases = [(enum_value, 'HVD_ERR_EXISTS'), (field_renamed, "no member named 'rank'"),
             (field_type, 'hvd_options.process_set'), (field_offset, 'hvd_options.root'),
             (struct_size, 'hvd_elastic_hooks:'), (prototype, 'hvd_barrier'),
             (missing, 'hvd_no_such_function'), (ctype_size, 'C type int64_t as ctypes c_int'),
             (names, "DTYPE_NAMES[10] is 'boolean'")]
    failures = []
    for change, item in cases:
        errors = check(cc, root, altered(change))
        if not any(item in e for e in errors):
            failures.append('self-test: %s was not reported naming %s; got:\n  %s'
                            % (change.__name__, item, '\n  '.join(errors) or 'no error'))
    return failures


def main():
    if len(sys.argv) != 3:
        print('usage: python_abi.py CC SOURCE_ROOT', file=sys.stderr)
        return 2
    cc, root = sys.argv[1], sys.argv[2]
    abi = load_abi(root)
    decl = declarations(abi)
    errors = check(cc, root, decl)
    for e in errors:
        print('python_abi: %s' % e, file=sys.stderr)
    failures = self_test(cc, root, abi)
    for f in failures:
        print('python_abi: %s' % f, file=sys.stderr)
    if errors or failures:
        return 1
    print('python_abi: %d constants, %d structures and %d functions of python/hvd/_abi.py '
          'match include/hvd/hvd.h' % (len(decl['constants']), len(decl['structs']),
                                      len(decl['functions'])))
    return 0


if __name__ == '__main__':
    sys.exit(main())
