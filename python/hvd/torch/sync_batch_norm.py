"""SyncBatchNorm: batch normalization whose training statistics are those of
the whole batch, every rank's share of it, instead of this rank's alone.

DESIGN. Forward, in training: each rank reduces its batch to per-channel
(count, mean, sum of squared deviations from that mean), which torch's
var_mean computes stably, and one allgather gives every rank everybody's.
They are combined in float64 with the pairwise-update formula for
variances, so the global mean and variance are exact to float tolerance
even where a plain sum of squares would cancel, and ranks may hold batches
of any size (one, even none) as long as the whole batch has two or more
values per channel. The running statistics take the global mean and the
unbiased global variance, as torch's BatchNorm does over its one batch.

Backward: the input's gradient depends on the whole batch through the mean
and variance, so each rank sums grad_output and grad_output * x_hat per
channel and one allreduce adds those sums up. The weight and bias
gradients stay this rank's share (the sums over its own batch), like every
other parameter's: DistributedOptimizer averages them over the ranks.

Everything is plain torch operations, so it runs on CPU tensors (and on
GPU ones: the few per-channel numbers travel through host memory). In eval
mode, and in a process set of one rank, the module is torch's BatchNorm.
"""

import numbers

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from hvd.torch.mpi_ops import (ProcessSet, Sum, allgather_async, allreduce_async,
                               global_process_set, synchronize)

__all__ = ['SyncBatchNorm']

_MIN_DIMS, _MAX_DIMS = 2, 5


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of every rank in process_set.

    num_features: C, the channels of inputs shaped (N, C), (N, C, L),
    (N, C, H, W) or (N, C, D, H, W). eps, momentum, affine and
    track_running_stats mean what they mean for torch.nn.BatchNorm2d
    (momentum None: the running statistics are a cumulative average).

    In training every rank of the process set must call forward (and
    backward) the same number of times in the same order, as with any
    collective; batch sizes may differ between ranks. In eval mode no rank
    talks to another."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        _check_arguments(num_features, eps, momentum, process_set)
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if not isinstance(input, torch.Tensor):
            raise ValueError('SyncBatchNorm takes a torch.Tensor, not %s' % type(input).__name__)
        if not _MIN_DIMS <= input.dim() <= _MAX_DIMS:
            raise ValueError('expected 2D to 5D input (got %dD input)' % input.dim())
        if input.size(1) != self.num_features:
            raise ValueError('SyncBatchNorm(%d) got an input with %d channels (dimension 1 of '
                             'shape %s)' % (self.num_features, input.size(1), tuple(input.shape)))

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or self._set_size() == 1:
            return super().forward(input)  # nothing to share: torch's BatchNorm, exactly
        factor = self._average_factor()
        keep_running = self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if keep_running else None,
            self.running_var if keep_running else None, self.eps, factor, self.process_set)

    def _set_size(self):
        size = self.process_set.size()
        if size is None:
            raise ValueError('SyncBatchNorm: %s is not registered (add_process_set)'
                             % self.process_set)
        if not self.process_set.included():
            raise ValueError('SyncBatchNorm: this rank is not in %s, so it cannot share its '
                             'batch statistics' % self.process_set)
        return size

    def _average_factor(self):
        """The weight of this batch in the running statistics, counting the
        batch as torch's BatchNorm does."""
        if not self.track_running_stats:
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum


def _check_arguments(num_features, eps, momentum, process_set):
    if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
        raise ValueError('SyncBatchNorm: num_features must be a positive int, not %r'
                         % (num_features,))
    if not _is_number(eps) or eps < 0:
        raise ValueError('SyncBatchNorm: eps must be a non-negative number, not %r' % (eps,))
    if momentum is not None and not _is_number(momentum):
        raise ValueError('SyncBatchNorm: momentum must be a number or None, not %r'
                         % (momentum,))
    if not isinstance(process_set, ProcessSet):
        raise ValueError('SyncBatchNorm: process_set must be a ProcessSet, not %r'
                         % (process_set,))


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _channel_dims(input):
    """Every dimension but the channels'."""
    return [0] + list(range(2, input.dim()))


def _per_channel(values, input):
    """values (C,) shaped to broadcast against input (N, C, ...)."""
    return values.view([1, -1] + [1] * (input.dim() - 2))


def _local_moments(input):
    """This rank's (count, mean, sum of squared deviations) per channel, one
    float64 row [count, mean..., m2...] ready for the allgather."""
    channels = input.size(1)
    count = input.numel() // channels
    if count == 0:
        mean = torch.zeros(channels, dtype=torch.float64)
        m2 = torch.zeros(channels, dtype=torch.float64)
    else:
        var, mean = torch.var_mean(input.detach(), dim=_channel_dims(input), unbiased=False)
        mean = mean.to('cpu', torch.float64)
        m2 = var.to('cpu', torch.float64) * count
    return torch.cat([torch.tensor([float(count)], dtype=torch.float64), mean, m2]).view(1, -1)


def _combine_moments(rows, channels):
    """The global count, mean and biased variance from every rank's row."""
    counts = rows[:, 0:1]
    means = rows[:, 1:1 + channels]
    m2s = rows[:, 1 + channels:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean) ** 2).sum(0)
    return int(total.item()), mean, m2 / total


def _update_running(running_mean, running_var, mean, var, count, factor):
    unbiased = var * (count / (count - 1))
    running_mean.mul_(1 - factor).add_(mean.to(running_mean), alpha=factor)
    running_var.mul_(1 - factor).add_(unbiased.to(running_var), alpha=factor)


def _global_statistics(input, process_set):
    """(count, mean, biased variance) over every rank's batch, float64 on
    the CPU; ValueError on every rank when the whole batch is too small."""
    rows = synchronize(allgather_async(_local_moments(input), name='sync_batch_norm.moments',
                                       process_set=process_set))
    count, mean, var = _combine_moments(rows, input.size(1))
    if count <= 1:
        raise ValueError('Expected more than 1 value per channel when training, got input size '
                         '%s here and %d value(s) per channel over all ranks'
                         % (tuple(input.shape), count))
    return count, mean, var


class _SyncBatchNormFunction(torch.autograd.Function):
    """Normalization with the whole batch's statistics, and its gradient."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor, process_set):
        count, mean, var = _global_statistics(input, process_set)
        if running_mean is not None:
            _update_running(running_mean, running_var, mean, var, count, factor)
        invstd = torch.rsqrt(var + eps).to(input.device, input.dtype)
        x_hat = (input - _per_channel(mean.to(input.device, input.dtype), input)) * \
            _per_channel(invstd, input)
        output = x_hat
        if weight is not None:
            output = output * _per_channel(weight, input) + _per_channel(bias, input)
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.count = count
        ctx.process_set = process_set
        return output

    @staticmethod
    def backward(ctx, grad_output):
        x_hat, invstd, weight = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        dims = _channel_dims(grad_output)
        sum_dy = grad_output.sum(dims)
        sum_dy_xhat = (grad_output * x_hat).sum(dims)
        grad_input = None
        if need_input:
            grad_input = _input_grad(ctx, grad_output, x_hat, invstd, weight, sum_dy, sum_dy_xhat)
        return (grad_input, sum_dy_xhat if need_weight else None, sum_dy if need_bias else None,
                None, None, None, None, None)


def _input_grad(ctx, grad_output, x_hat, invstd, weight, sum_dy, sum_dy_xhat):
    """dL/dx with L the sum of every rank's loss: this rank's grad_output
    minus its projection on the whole batch's mean and x_hat directions."""
    channels = x_hat.size(1)
    local = torch.cat([sum_dy, sum_dy_xhat]).to('cpu', torch.float64)
    totals = synchronize(allreduce_async(local, name='sync_batch_norm.grad_sums', op=Sum,
                                         process_set=ctx.process_set))
    totals = (totals / ctx.count).to(grad_output.device, grad_output.dtype)
    mean_dy, mean_dy_xhat = totals[:channels], totals[channels:]
    scale = invstd if weight is None else invstd * weight
    return (grad_output - _per_channel(mean_dy, x_hat) -
            x_hat * _per_channel(mean_dy_xhat, x_hat)) * _per_channel(scale, x_hat)
