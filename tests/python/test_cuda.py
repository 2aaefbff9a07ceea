"""hvd.torch on CUDA tensors: every collective, autograd through it, and the
DistributedOptimizer training a model on the GPU. Skipped, on every rank
alike, where torch sees no GPU or this build of hvd has no CUDA backend.

Rank r uses GPU local_rank % GPUs, so several ranks may share one GPU;
NCCL refuses that, so such a job runs with HVD_GPU_COLLECTIVES=host (the
results are the same either way). Inputs are small integers, exact in every
dtype used here, so results are compared exactly against a CPU reference.
"""

import pytest
import torch

import hvd.torch as hvd

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not hvd.cuda_built(),
    reason='needs a GPU that torch sees and a build of hvd with CUDA')


@pytest.fixture
def device():
    return torch.device('cuda', hvd.local_rank() % torch.cuda.device_count())


def rank_input(rank, shape, dtype, device):
    n = 1
    for d in shape:
        n *= d
    values = (torch.arange(n, dtype=torch.float64) % 7 + rank + 1).reshape(shape)
    return values.to(dtype).to(device)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32, torch.int64])
def test_allreduce_sum(rank, size, device, dtype):
    x = rank_input(rank, (5, 33), dtype, device)
    out = hvd.allreduce(x, op=hvd.Sum, name='cuda.sum.%s' % dtype)
    expect = sum(rank_input(r, (5, 33), torch.float64, 'cpu') for r in range(size))
    assert out.device == device and out.dtype == dtype
    assert torch.equal(out.cpu().double(), expect)


def test_allreduce_average_and_in_place(rank, size, device):
    x = rank_input(rank, (1000,), torch.float32, device)
    avg = hvd.allreduce(x, name='cuda.avg')
    hvd.allreduce_(x, op=hvd.Sum, name='cuda.inplace')
    total = sum(rank_input(r, (1000,), torch.float64, 'cpu') for r in range(size))
    assert torch.allclose(avg.cpu().double(), total / size)
    assert torch.equal(x.cpu().double(), total)


def test_grouped_and_async(rank, size, device):
    xs = [rank_input(rank, (k + 1, 3), torch.float32, device) for k in range(6)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name='cuda.grouped')
    handles = [hvd.allreduce_async(x, op=hvd.Max, name='cuda.async.%d' % k)
               for k, x in enumerate(xs)]
    maxes = [hvd.synchronize(h) for h in handles]
    for k in range(6):
        ref = [rank_input(r, (k + 1, 3), torch.float64, 'cpu') for r in range(size)]
        assert torch.equal(outs[k].cpu().double(), sum(ref))
        assert torch.equal(maxes[k].cpu().double(), ref[-1])


def test_allgather_broadcast_alltoall_reducescatter(rank, size, device):
    rows = rank + 1
    gathered = hvd.allgather(rank_input(rank, (rows, 4), torch.float32, device),
                             name='cuda.allgather')
    expect = torch.cat([rank_input(r, (r + 1, 4), torch.float64, 'cpu') for r in range(size)])
    assert gathered.device == device and torch.equal(gathered.cpu().double(), expect)

    root = size - 1
    b = hvd.broadcast(rank_input(rank, (9,), torch.float16, device), root, name='cuda.bcast')
    assert torch.equal(b.cpu().double(), rank_input(root, (9,), torch.float64, 'cpu'))

    sent = torch.full((size * 2, 3), float(rank), device=device)
    got = hvd.alltoall(sent, name='cuda.alltoall')
    assert torch.equal(got.cpu(), torch.arange(size).repeat_interleave(2).float()
                       .unsqueeze(1).expand(size * 2, 3))

    x = rank_input(rank, (size * 2, 5), torch.float32, device)
    share = hvd.reducescatter(x, op=hvd.Sum, name='cuda.reducescatter')
    total = sum(rank_input(r, (size * 2, 5), torch.float64, 'cpu') for r in range(size))
    assert torch.equal(share.cpu().double(), total[rank * 2:rank * 2 + 2])


def test_allreduce_gradient(rank, size, device):
    x = rank_input(rank, (4, 4), torch.float32, device).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, name='cuda.grad')
    y.sum().backward()
    # The gradient of a sum allreduce is the allreduced (summed) upstream gradient.
    assert x.grad.device == device
    assert torch.equal(x.grad.cpu(), torch.full((4, 4), float(size)))


def test_distributed_optimizer_trains_on_the_gpu(rank, size, device):
    torch.manual_seed(1234 + rank)  # different initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(99 + rank)
    data = torch.randn(64, 16, generator=gen).to(device)
    target = data.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name='cuda.params')
    assert all(torch.equal(every[r], every[0]) for r in range(size)), \
        'the ranks hold different parameters after training'
    assert losses[-1] < losses[0]


def test_adasum_of_cuda_tensors_matches_cpu(rank, size, device):
    # NCCL has no Adasum: GPU tensors are staged through host memory and
    # must give the CPU path's bits.
    g = torch.Generator().manual_seed(77 + rank)
    x = torch.rand(1000, generator=g) * 4 - 2
    gpu = hvd.allreduce(x.to(device), op=hvd.Adasum, name='cuda.adasum')
    cpu = hvd.allreduce(x, op=hvd.Adasum, name='cuda.adasum.cpu')
    assert gpu.device == device
    assert torch.equal(gpu.cpu(), cpu)
