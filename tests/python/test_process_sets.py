"""hvd.torch's process sets: collectives within a set (broadcast roots are
global ranks), barriers on a set, adding, removing and re-adding sets with
their ids reused, the errors (a set that exists already, the global set,
an operation on a set this rank is not in, a root outside the set) and
hvd.init(process_sets=...) after a shutdown.

Every test removes the sets it added, so that each starts with the global
set alone.
"""

import pytest
import torch

import hvd.torch as hvd
from hvd import _core
from exact import reduced, rows, same, share, values

needs_two = pytest.mark.skipif(hvd.size() < 2, reason='two sets need two ranks')


def _even_odd(size):
    return list(range(0, size, 2)), list(range(1, size, 2))


def _ids_everywhere(ps, size):
    """The set's id as every rank has it."""
    return hvd.allgather(torch.tensor([ps.process_set_id]), name='ids.%s' % ps.ranks).tolist()


@needs_two
def test_collectives_on_even_and_odd_sets(rank, size):
    even_ranks, odd_ranks = _even_odd(size)
    even = hvd.add_process_set(even_ranks)
    odd = hvd.add_process_set(hvd.ProcessSet(odd_ranks))
    ids = [_ids_everywhere(even, size), _ids_everywhere(odd, size)]
    mine = even if rank % 2 == 0 else odd
    members = mine.ranks
    me = members.index(rank)
    n = len(members)

    inputs = {r: values((17, 3), torch.int32, r) for r in members}
    summed = hvd.allreduce(inputs[rank], op=hvd.Sum, process_set=mine)
    grouped = hvd.grouped_allreduce([inputs[rank], inputs[rank].double()], op=hvd.Max,
                                    process_set=mine)
    gathered = hvd.allgather(rows(rank + 1, (2,), torch.float32, rank), process_set=mine)
    root = members[-1]  # a global rank
    broadcast = hvd.broadcast(inputs[rank], root, process_set=mine)
    inplace = inputs[rank].clone()
    hvd.broadcast_(inplace, root, name='in_set', process_set=mine)
    sent = torch.cat([rows(1, (3,), torch.int64, 10 * rank + p) for p in range(n)])
    exchanged, received = hvd.alltoall(sent, [1] * n, process_set=mine)
    scattered = hvd.reducescatter(inputs[rank], op=hvd.Sum, process_set=mine)
    hvd.barrier(process_set=mine)
    removed = [hvd.remove_process_set(even), hvd.remove_process_set(odd)]

    assert ids[0] == [ids[0][0]] * size and ids[1] == [ids[1][0]] * size
    assert ids[0][0] not in (0, ids[1][0])
    assert same(summed, reduced([inputs[r] for r in members], hvd.Sum))
    assert same(grouped[0], reduced([inputs[r] for r in members], hvd.Max))
    assert same(grouped[1], grouped[0].double())
    assert same(gathered, torch.cat([rows(r + 1, (2,), torch.float32, r) for r in members]))
    assert same(broadcast, inputs[root])
    assert same(inplace, inputs[root])
    assert same(exchanged, torch.cat([rows(1, (3,), torch.int64, 10 * r + me) for r in members]))
    assert received.tolist() == [1] * n
    first, count = share(17, me, n)
    assert same(scattered, reduced([inputs[r] for r in members], hvd.Sum)[first:first + count])
    assert removed == [True, True]
    assert even.process_set_id is None and odd.process_set_id is None


@needs_two
def test_set_queries(rank, size):
    even_ranks, odd_ranks = _even_odd(size)
    even = hvd.add_process_set(even_ranks)
    odd = hvd.add_process_set(odd_ranks)
    queries = [(s.size(), s.rank(), s.included()) for s in (even, odd)]
    hvd.remove_process_set(even)
    hvd.remove_process_set(odd)
    in_even = rank % 2 == 0
    assert queries[0] == (len(even_ranks), even_ranks.index(rank) if in_even else -1, in_even)
    assert queries[1] == (len(odd_ranks), -1 if in_even else odd_ranks.index(rank), not in_even)
    assert (even.size(), even.rank(), even.included()) == (None, None, None)
    assert hvd.global_process_set.ranks == list(range(size))
    assert (hvd.global_process_set.size(), hvd.global_process_set.rank()) == (size, rank)


OUTSIDE = {
    'allreduce': lambda ps: hvd.allreduce(torch.ones(3), process_set=ps),
    'allreduce_async_': lambda ps: hvd.allreduce_async_(torch.ones(3), process_set=ps),
    'grouped_allreduce': lambda ps: hvd.grouped_allreduce([torch.ones(3)], process_set=ps),
    'allgather': lambda ps: hvd.allgather(torch.ones(3), process_set=ps),
    'broadcast': lambda ps: hvd.broadcast(torch.ones(3), ps.ranks[0], process_set=ps),
    'alltoall': lambda ps: hvd.alltoall(torch.ones(len(ps.ranks)), process_set=ps),
    'reducescatter': lambda ps: hvd.reducescatter(torch.ones(4), process_set=ps),
    'barrier': lambda ps: hvd.barrier(process_set=ps),
}


@needs_two
def test_operations_on_a_set_this_rank_is_not_in(rank, size):
    even_ranks, odd_ranks = _even_odd(size)
    even = hvd.add_process_set(even_ranks)
    odd = hvd.add_process_set(odd_ranks)
    mine, other = (even, odd) if rank % 2 == 0 else (odd, even)
    refused = {}
    for kind, call in OUTSIDE.items():
        try:
            call(other)
            refused[kind] = None
        except ValueError as e:
            refused[kind] = e
    # A root that is a rank of the job but not of the set.
    with pytest.raises(ValueError):
        hvd.broadcast(torch.ones(3), other.ranks[0], process_set=mine)
    with pytest.raises(ValueError):
        hvd.broadcast_async_(torch.ones(3), size, process_set=mine)
    hvd.remove_process_set(even)
    hvd.remove_process_set(odd)
    assert [k for k, e in refused.items() if e is None] == []


@needs_two
def test_add_remove_readd_and_duplicates(rank, size):
    # horovod's test_horovod_add_get_remove_process_set, for hvd.torch.
    ids_before = _core.process_set_ids()
    set1 = hvd.add_process_set([0])
    set2 = hvd.add_process_set(range(1, size))
    set2_id = set2.process_set_id
    ids = _core.process_set_ids()
    ids1_everywhere = _ids_everywhere(set1, size)
    old_id = set1.process_set_id
    removed = hvd.remove_process_set(set1)
    invalidated = set1.process_set_id is None
    hvd.add_process_set(set1)  # the same object again
    readded_id = set1.process_set_id
    hvd.remove_process_set(set1)
    if size > 2:
        set3 = hvd.add_process_set([0, size - 1])
        set3_id = set3.process_set_id
    else:
        with pytest.raises(ValueError):  # the global set's ranks
            hvd.add_process_set([0, size - 1])
        set3 = None
    with pytest.raises(ValueError):  # set2's ranks, in another order
        hvd.add_process_set(range(size - 1, 0, -1))
    with pytest.raises(ValueError):  # the global set's ranks
        hvd.add_process_set(range(size))
    with pytest.raises(ValueError):  # an object registered already
        hvd.add_process_set(set2)
    ids_after_errors = _core.process_set_ids()
    removed_later = [hvd.remove_process_set(ps) for ps in (set2, set3) if ps is not None]
    global_removed = hvd.remove_process_set(hvd.global_process_set)
    unregistered_removed = hvd.remove_process_set(hvd.ProcessSet([0]))

    assert ids_before == [0]
    assert ids == sorted([0, old_id, set2_id])
    assert ids1_everywhere == [old_id] * size
    assert removed and invalidated
    assert readded_id == old_id, 'the lowest free id is taken again'
    if set3 is not None:
        assert set3_id == old_id, 'the lowest free id is taken again'
    assert ids_after_errors == sorted([0, set2_id] + ([old_id] if set3 is not None else [])), \
        'a refused set changed the registered ones'
    assert removed_later == [True] * len(removed_later)
    assert _core.process_set_ids() == [0]
    assert global_removed is False
    assert unregistered_removed is False


def test_process_set_str_reads_like_horovods(rank, size):
    texts = ['ProcessSet(process_set_id=0, ranks=%s, mpi_comm=None)' % list(range(size))]
    actual = [str(hvd.global_process_set)]
    if size > 1:
        ps = hvd.add_process_set([0])
        texts.append('ProcessSet(process_set_id=%d, ranks=[0], mpi_comm=None)'
                     % ps.process_set_id)
        actual.append(str(ps))
        hvd.remove_process_set(ps)
    assert actual == texts


@needs_two
def test_init_with_process_sets_after_shutdown(rank, size):
    earlier = hvd.add_process_set([0])  # registered before the shutdown
    hvd.shutdown()
    down = (hvd.is_initialized(), earlier.process_set_id)
    first, rest = hvd.ProcessSet([0]), hvd.ProcessSet(range(1, size))
    hvd.init(process_sets=[first, rest])
    ids = (first.process_set_id, rest.process_set_id)
    mine = first if rank == 0 else rest
    inputs = {r: values((5,), torch.float32, r) for r in mine.ranks}
    summed = hvd.allreduce(inputs[rank], op=hvd.Sum, process_set=mine)
    hvd.remove_process_set(first)
    hvd.remove_process_set(rest)
    # The object registered before the shutdown can be registered again.
    hvd.shutdown()
    hvd.init(process_sets=[earlier])
    again = earlier.process_set_id
    hvd.remove_process_set(earlier)
    hvd.init(process_sets='dynamic')  # initialized already: a no-op

    assert down == (False, None)
    assert ids[0] is not None and ids[1] is not None and ids[0] != ids[1]
    assert same(summed, reduced(list(inputs.values()), hvd.Sum))
    assert again is not None and again != 0
    assert _core.process_set_ids() == [0]
