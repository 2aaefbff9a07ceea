"""A small training script written as a Horovod user writes one, run by
test_compat.py through `hvdrun --horovod-compat`: it must work unchanged on
hvd. Rank 0 prints a last line starting with "final:" and every rank exits
0 when training ran and the ranks ended with the same parameters."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod
import horovod.torch as hvd

STEPS = 5
BATCH = 8


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.fc1 = nn.Linear(10, 16)
        self.bn = hvd.SyncBatchNorm(16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.bn(self.fc1(x)))), dim=1)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def parameters_in_sync(model):
    for name, p in model.named_parameters():
        gathered = hvd.allgather(p.detach().reshape(1, -1), name='check.' + name)
        if not torch.equal(gathered, p.detach().reshape(1, -1).expand_as(gathered)):
            return False
    return True


def main():
    hvd.init()
    torch.manual_seed(42 + hvd.rank())  # different initial weights: the broadcast must fix them

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    model.train()
    for step in range(STEPS):
        data = torch.randn(BATCH, 10)
        target = (data[:, 0] > 0).long()
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()

    avg_loss = metric_average(loss.item(), 'avg_loss')
    if not parameters_in_sync(model):
        raise SystemExit('rank %d: parameters differ between ranks' % hvd.rank())
    if hvd.rank() == 0:
        print('final: horovod %s, %d ranks, %d steps, loss %.4f'
              % (horovod.__version__, hvd.size(), STEPS, avg_loss))


if __name__ == '__main__':
    main()
