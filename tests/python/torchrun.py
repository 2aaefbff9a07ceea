"""torchrun, for the tests and benchmarks: Debian's torch 1.13 under Python
3.11 needs one fix to start at all (its Std.from_str finds no member for
'0', the default of --redirects and --tee, since 3.11's Flag iteration
skips the zero and composite members, and the launch fails with
"'NoneType' object has no attribute 'get'").

    /usr/bin/python3 tests/python/torchrun.py --standalone --nproc_per_node 2 SCRIPT

bench/torch_compare.py calls main(argv) from here.
"""
import sys


def main(argv):
    """torchrun with argv, fixed where it needs it."""
    from torch.distributed.elastic.multiprocessing.api import Std
    from torch.distributed.run import main as torchrun_main
    if Std.from_str('0') is None:
        def from_str(text):
            if ':' in text:
                return {int(i): Std(int(v)) for i, v in (m.split(':') for m in text.split(','))}
            return Std(int(text))
        Std.from_str = staticmethod(from_str)
    torchrun_main(argv)


if __name__ == '__main__':
    main(sys.argv[1:])
