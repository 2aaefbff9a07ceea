"""torchrun, for the tests: Debian's torch 1.13 under Python 3.11 needs one
fix to start at all (its Std.from_str finds no member for '0', the default
of --redirects and --tee, since 3.11's Flag iteration skips zero members).

    /usr/bin/python3 tests/python/torchrun.py --standalone --nproc_per_node 2 SCRIPT
"""
import sys

from torch.distributed.elastic.multiprocessing.api import Std
from torch.distributed.run import main

if Std.from_str('0') is None:
    def _from_str(text):
        if ':' in text:
            return {int(i): Std(int(v)) for i, v in (m.split(':') for m in text.split(','))}
        return Std(int(text))
    Std.from_str = staticmethod(_from_str)

if __name__ == '__main__':
    main(sys.argv[1:])
