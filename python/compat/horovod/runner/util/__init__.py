"""horovod.runner.util: the helpers of Horovod's runner that its users and
test suites import (threads.in_thread)."""
