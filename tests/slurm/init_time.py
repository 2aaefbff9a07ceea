"""How long hvd.init() takes under srun: every task notes when its script
started (before any import), when its imports were done and when hvd.init()
returned, and rank 0 prints, in ms, from the last task's start to the last
hvd.init() to return, and from the last task's imports to the same."""
import time

started = time.time()
import torch  # noqa: E402

import hvd.torch as hvd  # noqa: E402

imported = time.time()
hvd.init()
initialized = time.time()
t = hvd.allgather(torch.tensor([[started, imported, initialized]], dtype=torch.float64))
if hvd.rank() == 0:
    last = t.max(dim=0).values.tolist()
    print('init_time_ms start %.0f imported %.0f' % ((last[2] - last[0]) * 1e3,
                                                       (last[2] - last[1]) * 1e3), flush=True)
