"""`pip install .` and `pip wheel .`: hvd built with CMake and installed as
`cmake --install` lays it out, under the environment's prefix.

DESIGN. hvd's installed layout is fixed by two lookups that already exist:
hvdrun finds the Python packages from its own executable
(<prefix>/bin/hvdrun -> <prefix>/lib/hvd/python, launcher/python.c) and the
hvd package finds libhvd.so.0 three directories above itself
(python/hvd/_lib.py). The wheel carries exactly that tree as its data
(<prefix>/bin/hvdrun and hvd-rendezvous, <prefix>/lib/libhvd.so.0,
<prefix>/lib/hvd/python/{hvd,compat}), so pip puts it under the venv (or
~/.local, or /usr/local) as cmake --install would, and both lookups work
unchanged. One line in site-packages, hvd.pth, adds <prefix>/lib/hvd/python
to the environment's sys.path, so that its python imports hvd without
hvdrun. The compatibility tree's `horovod` stays one level further down,
in .../compat, which only hvdrun --horovod-compat puts on a rank's path:
plain python never imports hvd's `horovod`.

The build runs in setuptools' temporary folder (build-pip/temp.*): a
Release build without sanitizers or tests; CUDA when CMake finds it, as in
any build. HVD_CMAKE_ARGS adds CMake arguments (-DHVD_WITH_CUDA=OFF, say),
CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs (default: every CPU).
"""

import os
import re
import shlex
import shutil
import subprocess

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.command.editable_wheel import editable_wheel
from setuptools.dist import Distribution
from setuptools.errors import SetupError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1 has it from wheel
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))
# Below <prefix>: what the wheel takes from the CMake install.
PROGRAMS = ['bin/hvdrun', 'bin/hvd-rendezvous']
LIBRARY = 'lib/libhvd.so.0'
PYTHON_DIR = 'lib/hvd/python'
# hvd.pth's line, relative to the site-packages directory holding it:
# <prefix>/lib/pythonX.Y/site-packages -> <prefix>/lib/hvd/python (a venv,
# --user, /usr/local and --prefix schemes alike).
PTH_LINE = '../../hvd/python'


def version():
    """hvd's version, from include/hvd/hvd.h as CMakeLists.txt reads it."""
    with open(os.path.join(ROOT, 'include', 'hvd', 'hvd.h')) as f:
        text = f.read()
    parts = [re.search(r'#define HVD_VERSION_%s (\d+)' % part, text)
             for part in ('MAJOR', 'MINOR', 'PATCH')]
    if None in parts:
        raise SetupError('include/hvd/hvd.h defines no HVD_VERSION_MAJOR/MINOR/PATCH')
    return '.'.join(m.group(1) for m in parts)


def run(command):
    print(' '.join(shlex.quote(word) for word in command), flush=True)
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError:
        raise SetupError('%s not found: building hvd needs CMake and a C compiler '
                         '(./scripts/setup.sh installs them)' % command[0]) from None
    except subprocess.CalledProcessError as e:
        raise SetupError('%s failed with status %d (its output is above)'
                         % (' '.join(command[:2]), e.returncode)) from None


class BuildHvd(Command):
    """Configures, builds and installs hvd into a staging prefix under the
    build's temporary folder, then names the staged files as the
    distribution's data and writes hvd.pth into the build's library."""

    description = 'build libhvd, hvdrun and hvd-rendezvous with CMake'
    user_options = []

    def initialize_options(self):
        self.build_temp = None
        self.build_lib = None

    def finalize_options(self):
        self.set_undefined_options('build', ('build_temp', 'build_temp'),
                                   ('build_lib', 'build_lib'))

    def run(self):
        cmake_dir = os.path.abspath(os.path.join(self.build_temp, 'cmake'))
        stage = os.path.abspath(os.path.join(self.build_temp, 'stage'))
        configure = ['cmake', '-S', ROOT, '-B', cmake_dir, '-DCMAKE_BUILD_TYPE=Release',
                     '-DHVD_SANITIZE=', '-DHVD_FUZZ=OFF', '-DHVD_BUILD_TESTS=OFF',
                     '-DCMAKE_INSTALL_LIBDIR=lib']
        run(configure + shlex.split(os.environ.get('HVD_CMAKE_ARGS', '')))
        jobs = [] if os.environ.get('CMAKE_BUILD_PARALLEL_LEVEL') else [
            '--parallel', str(os.cpu_count() or 1)]
        run(['cmake', '--build', cmake_dir, '--target', 'hvd', 'hvdrun', 'hvd-rendezvous']
            + jobs)
        # A fresh stage: nothing left from an earlier build's tree.
        shutil.rmtree(stage, ignore_errors=True)
        run(['cmake', '--install', cmake_dir, '--prefix', stage])
        self.distribution.data_files = staged_files(stage)
        self.mkpath(self.build_lib)
        with open(os.path.join(self.build_lib, 'hvd.pth'), 'w') as f:
            f.write('# hvd: its Python package, beside libhvd.so.0 (setup.py)\n%s\n' % PTH_LINE)


def staged_files(stage):
    """data_files for the wheel: (directory below the prefix, [staged paths])."""
    groups = {}
    for name in PROGRAMS + [LIBRARY]:
        groups.setdefault(os.path.dirname(name), []).append(os.path.join(stage, name))
    python = os.path.join(stage, PYTHON_DIR)
    for dirpath, dirnames, filenames in os.walk(python):
        dirnames.sort()
        rel = os.path.relpath(dirpath, stage)
        groups[rel] = [os.path.join(dirpath, name) for name in sorted(filenames)]
    for paths in groups.values():
        for path in paths:
            if not os.path.isfile(path):
                raise SetupError('cmake --install left no %s' % path)
    return sorted(groups.items())


class Build(build):
    sub_commands = [('build_hvd', None)] + build.sub_commands


class BdistWheel(bdist_wheel):
    def get_tag(self):
        # Programs and a library for this platform, but no extension module:
        # any Python 3 takes it.
        return self.python_tag, 'none', super().get_tag()[2]


class EditableWheel(editable_wheel):
    def run(self):
        raise SetupError('hvd has no editable install: build it (./scripts/build.sh) and use '
                         'build/bin/hvdrun, which runs the sources (docs/python.md)')


class BinaryDistribution(Distribution):
    """Platform-specific: its files go to platlib, its wheel is tagged for
    this machine."""

    def has_ext_modules(self):
        return True


setup(
    version=version(),
    distclass=BinaryDistribution,
    packages=[],
    py_modules=[],
    cmdclass={'build': Build, 'build_hvd': BuildHvd, 'bdist_wheel': BdistWheel,
              'editable_wheel': EditableWheel},
    # Out of the CMake build's build/ folder (build/lib is its library's).
    options={'build': {'build_base': 'build-pip'}, 'egg_info': {'egg_base': 'build-pip'}},
)
